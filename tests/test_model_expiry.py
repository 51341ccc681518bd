"""Model-based test of expiry and deadlines: hypothesis enqueues jobs with and without
``expires``, ``deadline`` and delays, leases them, ends their runs (success, retry,
suspension at a durable wait), cancels them, loses replies and moves the clock (the
scripts' ``now`` override), and compares every job's state with a plain model after each
step.

The model's rules are DESIGN's (§6, expiry): a job must start by its start-by time (its
``expires``, or its ``deadline`` if earlier); a fetch at or past that time never leases it,
and once a fetch has run at or past it a job that has not started (ready, scheduled,
waiting for a retry, suspended) is ``expired``; a job that started in time keeps running;
past its deadline a running job is asked to cancel, and its end is recorded ``expired``
whatever its run reports; a job that waits again (a retry, a suspension) must still start
by its time. Expired is final: nothing leases or changes it afterwards.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import conveyor
from conveyor.scripts import calls
from helpers import ModuleServer
from lost_reply import LoseReplies

EXAMPLES = int(os.environ.get("CONVEYOR_MODEL_EXAMPLES", "60"))
T0 = 1_800_000_000_000.0
VT = 60_000  # leases outlive every test's clock: only the steps end runs
WAITING = ("ready", "scheduled", "retrying", "suspended")

SERVER = ModuleServer()
_server = SERVER.fixture()


@dataclass
class Job:
    state: str
    due: float  # ms: when a scheduled or retrying job may run
    start_by: float | None
    deadline: float | None
    token: str = ""
    cancel: bool = False  # a cancel (or a passed deadline) was asked while it ran


class ExpiryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.app = conveyor.Conveyor(SERVER.url, namespace=f"x{uuid.uuid4().hex[:10]}")
        self.k = self.app.keys("q")
        self.now = T0
        self.jobs: dict[str, Job] = {}
        self.serial = 0
        self.lose = False

    def teardown(self) -> None:
        self.app.redis.flushdb()
        self.app.close()

    def run(self, call: calls.ScriptCall[object]) -> object:
        if self.lose:  # DESIGN 5: a reply lost after Redis applied the call, sent again
            self.lose = False
            with LoseReplies(b"EVALSHA\r\n") as lost:
                reply = self.app.scripts.run(call)
            assert lost.lost == 1
            return reply
        return self.app.scripts.run(call)

    @rule()
    def lose_the_next_reply(self) -> None:
        self.lose = True

    @rule(expires=st.sampled_from([None, 0, 300, 1500]),
          deadline=st.sampled_from([None, None, 800, 3000]),
          delay=st.sampled_from([0, 0, 500, 2500]))
    def enqueue(self, expires: int | None, deadline: int | None, delay: int) -> None:
        self.serial += 1
        short = f"j{self.serial}"
        spec = calls.JobSpec(task="t", delay_ms=float(delay) if delay else None,
                             expires="" if expires is None else f"+{expires}",
                             deadline="" if deadline is None else f"+{deadline}",
                             visibility_ms=VT, max_attempts=100)
        self.run(calls.enqueue(self.k, spec, [(short, b"[[]]")], self.app.limits,
                               now=self.now))
        start_by = [t for t in (expires, deadline) if t is not None]
        self.jobs[short] = Job("scheduled" if delay else "ready", self.now + delay,
                               self.now + min(start_by) if start_by else None,
                               None if deadline is None else self.now + deadline)

    @rule(ms=st.sampled_from([1, 200, 700, 2000]))
    def advance_time(self, ms: int) -> None:
        self.now += ms

    def _ahead(self) -> list[float]:
        return sorted({t for j in self.jobs.values() for t in (j.start_by, j.deadline)
                       if t is not None and t > self.now})

    @precondition(lambda self: self._ahead())
    @rule(data=st.data(), past=st.sampled_from([0, 0, 1]))
    def advance_to_a_jobs_time(self, data: st.DataObject, past: int) -> None:
        """To the very ms a job must start or finish by (or one past it): the edges."""
        self.now = data.draw(st.sampled_from(self._ahead())) + past

    def _expire_waiting(self) -> None:
        """What a fetch's timer does first: every waiting job past its start-by time
        expires; a running one past its deadline is asked to cancel."""
        for job in self.jobs.values():
            if job.start_by is not None and self.now >= job.start_by and job.state in WAITING:
                job.state = "expired"
            if job.state == "active" and job.deadline is not None \
                    and self.now >= job.deadline:
                job.cancel = True
            if job.state in ("scheduled", "retrying") and self.now >= job.due:
                job.state = "ready"

    @rule(count=st.integers(1, 4))
    def fetch(self, count: int) -> None:
        self._expire_waiting()
        fetched = self.run(calls.fetch(self.k, count, self.app.limits, now=self.now))
        assert isinstance(fetched, calls.Fetched)
        ready = {s for s, j in self.jobs.items() if j.state == "ready"}
        for leased in fetched.jobs:
            job = self.jobs[leased.short_id]
            assert leased.short_id in ready, f"{leased.short_id} leased while {job.state}"
            assert job.start_by is None or self.now < job.start_by, (
                f"{leased.short_id} started at {self.now} past its start-by {job.start_by}")
            job.state, job.token = "active", leased.token
        assert len(fetched.jobs) == min(count, len(ready))

    def _active(self) -> list[str]:
        return sorted(s for s, j in self.jobs.items() if j.state == "active")

    @precondition(lambda self: self._active())
    @rule(data=st.data(), outcome=st.sampled_from(["ok", "retry", "suspend"]))
    def finish(self, data: st.DataObject, outcome: str) -> None:
        short = data.draw(st.sampled_from(self._active()))
        job = self.jobs[short]
        if outcome == "suspend":  # reached a wait for a signal that never comes
            code, _ = self.run(calls.wait(self.k, short, job.token, "signal", "never", None,
                                          now=self.now))
            if job.cancel:
                assert code == calls.WAIT_CANCELLING
                outcome = "ok"  # the run sees it must stop; what it reports is moot
            else:
                assert code == calls.WAIT_SUSPEND
        end = calls.Outcome(short, job.token, outcome, self.now / 1000, b"\x90", 1000)
        done = self.run(calls.finish(self.k, [end], self.app.limits, now=self.now))
        assert isinstance(done, calls.Finished)
        if job.deadline is not None and self.now >= job.deadline:
            job.state = "expired"  # whatever the run reports, asked to cancel yet or not
        elif job.cancel:
            job.state = "cancelled"
        elif outcome == "ok":
            job.state = "succeeded"
        elif outcome == "retry":
            job.state, job.due = "retrying", self.now + 1000
        else:
            job.state = "suspended"

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        short = data.draw(st.sampled_from(sorted(self.jobs)))
        job = self.jobs[short]
        self.run(calls.cancel(self.k, short, self.app.limits, "test", now=self.now))
        if job.state in WAITING:
            job.state = "cancelled"
        elif job.state == "active":
            job.cancel = True

    @invariant()
    def states_match(self) -> None:
        for short, job in self.jobs.items():
            got = self.app.redis.hget(self.k.job(short), "s")
            assert got is not None, short
            state = got.decode()
            if state != job.state:
                # The model expires jobs at a fetch; Redis too, so they agree after it. A
                # job past its time that no fetch met yet still waits in both.
                raise AssertionError(f"{short}: redis {state!r}, model {job.state!r}")
        counted = int(self.app.redis.hget(self.k.counts, "ready") or 0)
        assert counted == sum(j.state == "ready" for j in self.jobs.values())
        for short, job in self.jobs.items():
            on_timer = self.app.redis.zscore(self.k.expiring, short)
            if job.state in WAITING and job.start_by is not None:
                assert on_timer == job.start_by, (short, on_timer, job)


TestExpiryModel = ExpiryMachine.TestCase
TestExpiryModel.settings = settings(max_examples=EXAMPLES, stateful_step_count=30,
                                    deadline=None,
                                    suppress_health_check=[HealthCheck.too_slow])
