"""Model-based test of durable waits: hypothesis drives the wait, signal, resume, finish,
fetch and cancel scripts on a real redis-server and compares Redis with a plain Python model
after every step.

The model is written from the waits' contract (DESIGN §6 "durable waits", and §5: every
call may lose its reply and be sent again), not from the scripts:

* a run holding the lease reaches a sleep, a signal wait (with or without a timeout) or a
  child wait: an outcome recorded for that name is returned as is; a kept signal of that
  name is consumed, oldest first, and recorded; a wait keeps the end in time it got the
  first time it was reached, and once that end passed its outcome (``t``, ``x``) is
  recorded; otherwise the run is told to suspend (a stale token, or a job not active, is
  refused);
* ``finish(suspend)`` gives the attempt back and leaves the job suspended, with no lease,
  in the suspended set, and in the delayed set at its wait's end (if it has one); or ready
  at once when the outcome got recorded since the wait call;
* a fetch promotes suspended jobs whose end passed, never leases one that is suspended;
* a signal is delivered (recorded, a suspended job made ready) when the job's current wait
  is an open signal wait of that name, else kept (a job that has not ended), else refused;
* a child's end (through the hand-over outbox, or a direct ``resume``) is recorded on its
  parent when the parent's current wait is that child's and still open;
* cancelling a suspended (or ready) job ends it at once;
* counters: ``suspended``, ``suspended_timed``, ``ready``, ``running``.

The run of a task is modelled as a real one goes: it reaches recorded waits, then at most
one open wait; the first open wait it reaches after a resume is the one it was suspended
at (the task runs from the top, in the same order); a run told to suspend ends with
``finish(suspend)``.

``CONVEYOR_MODEL_EXAMPLES`` raises the number of examples (default 50, about 10 s), and
``CONVEYOR_MODEL_STEPS`` the steps of each (default 50).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import TypeVar

from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import conveyor
from conveyor.scripts import calls
from conveyor.workflow.release import drain_sync
from helpers import ModuleServer
from lost_reply import LoseReplies

EXAMPLES = int(os.environ.get("CONVEYOR_MODEL_EXAMPLES", "50"))
STEPS = int(os.environ.get("CONVEYOR_MODEL_STEPS", "50"))  # steps per example
VT = 10**9  # lease length (ms): no lease runs out within an example (time moves < 2 min)
QUEUE = "q"
SLEEPS = ("nap", "cool")
SIGNAL_WAITS = ("go", "approve")
CHILD_WAITS = ("kid", "pet")
SIGNALS = (*SIGNAL_WAITS, "stray")  # "stray": no wait of that name is ever reached
NAMES = (*SLEEPS, *SIGNAL_WAITS, *CHILD_WAITS)
KIND = {**dict.fromkeys(SLEEPS, "time"), **dict.fromkeys(SIGNAL_WAITS, "signal"),
        **dict.fromkeys(CHILD_WAITS, "child")}
ENDED = ("succeeded", "dead", "cancelled")
T = TypeVar("T")


@dataclass
class Wait:
    kind: str
    deadline: float | None  # ms: fixed the first time a run reached it
    child: str = ""  # a child wait's child job id


@dataclass
class Job:
    state: str  # ready | active | suspended | succeeded | dead | cancelled
    parent: str = ""  # a child job: its parent's job id
    attempts: int = 0
    tokens: list[str] = field(default_factory=list)  # every token handed out, last current
    waits: dict[str, Wait] = field(default_factory=dict)  # described waits, by name
    current: str | None = None  # the wait last described
    recorded: dict[str, bytes] = field(default_factory=dict)  # name -> outcome
    mailbox: dict[str, list[bytes]] = field(default_factory=dict)  # kept signals, oldest first
    told_to_suspend: bool = False  # this run got WAIT_SUSPEND: it ends with finish(suspend)
    cancelling: bool = False  # cancelled while its run went on
    result: bytes = b""  # what it ended with (ok: its result; dead: its error)
    program: list[tuple[str, float | None]] = field(default_factory=list)  # its task's waits

    def open_wait(self) -> str | None:
        """The current wait when its outcome is not recorded yet."""
        if self.current is not None and self.current not in self.recorded:
            return self.current
        return None


SERVER = ModuleServer()
_server = SERVER.fixture()


class WaitsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.app = conveyor.Conveyor(SERVER.url, namespace=f"w{uuid.uuid4().hex[:10]}")
        self.app.redis.sadd(f"{self.app.namespace}:queues", QUEUE)
        self.k = self.app.keys(QUEUE)
        self.limits = self.app.limits
        self.now = 1_800_000_000_000.0
        self.jobs: dict[str, Job] = {}
        self.serial = 0
        self.sent = 0  # signals sent: each payload is unique
        self.accepted: dict[str, set[bytes]] = {}  # short id -> payloads delivered or kept
        self.outbox: list[str] = []  # children that ended, their parents not told yet
        self.lose_next_reply = False

    def teardown(self) -> None:
        self.app.redis.flushdb()
        self.app.close()

    def run(self, call: calls.ScriptCall[T]) -> T:
        if self.lose_next_reply:
            # The reply is lost on the wire after the server ran the call; the client sends
            # it again and gets the first reply; the model is that of one application.
            self.lose_next_reply = False
            with LoseReplies(b"EVALSHA\r\n") as lost:
                reply = self.app.scripts.run(call)
            assert lost.lost == 1
            event(f"a lost reply: {call.name}")
            return reply
        return self.app.scripts.run(call)

    def _job_id(self, short_id: str) -> str:
        return f"{QUEUE}~{short_id}"

    def _in(self, *states: str) -> list[str]:
        return sorted(i for i, j in self.jobs.items() if j.state in states)

    def _running(self) -> list[str]:
        """Active jobs whose run may go on (not told to suspend)."""
        return sorted(i for i, j in self.jobs.items()
                      if j.state == "active" and not j.told_to_suspend)

    def _reachable(self, job: Job, names: tuple[str, ...]) -> list[str]:
        """The waits of ``names`` the run of ``job`` may reach next: recorded ones, and the
        open wait it was suspended at, or (none open) any it never reached."""
        open_wait = job.open_wait()
        return [n for n in names if n in job.recorded or n == open_wait
                or (open_wait is None and n not in job.waits)]

    # -- steps -----------------------------------------------------------------------------

    @rule()
    def lose_the_next_reply(self) -> None:
        self.lose_next_reply = True

    @rule(ms=st.sampled_from([10, 400, 1100, 3500]))
    def advance_time(self, ms: int) -> None:
        self.now += ms

    @rule(n=st.integers(1, 2), programs=st.lists(st.lists(st.tuples(
        st.sampled_from(NAMES), st.sampled_from([None, 0, 500, 2000])), max_size=3),
        min_size=2, max_size=2))
    def enqueue(self, n: int, programs: list[list[tuple[str, int | None]]]) -> None:
        """Jobs of a task that reaches these waits in this order (each name once; a sleep
        without a length sleeps 1000 ms, a child wait has none)."""
        batch = []
        for _ in range(n):
            self.serial += 1
            batch.append((f"j{self.serial}", b"[[],{}]"))
        spec = calls.JobSpec(task="t", visibility_ms=VT)
        stored = self.run(calls.enqueue(self.k, spec, batch, self.limits, now=self.now))
        assert stored == [(short_id, True) for short_id, _ in batch]
        for (short_id, _), steps in zip(batch, programs, strict=False):
            program: dict[str, float | None] = {}
            for name, ms in steps:
                if KIND[name] == "child":
                    ms = None
                elif KIND[name] == "time" and ms is None:
                    ms = 1000
                program.setdefault(name, ms)
            self.jobs[short_id] = Job("ready", program=list(program.items()))

    @rule(data=st.data(), count=st.integers(1, 3))
    def worker_round(self, data: st.DataObject, count: int) -> None:
        """A worker's round: a fetch, then each run it leased plays its task: it reaches the
        task's waits in order until one suspends it (the run ends with finish(suspend)) or
        all are over (the run ends ok, or dead)."""
        before = set(self._in("active"))
        self.fetch(count)
        for short_id in sorted(set(self._in("active")) - before):
            job = self.jobs[short_id]
            for name, ms in job.program:
                if name not in self._reachable(job, (name,)):
                    break  # a step out of the task's order ran before: the run stays
                self.serial += 1
                code, named = self._wait(short_id, KIND[name], name, ms,
                                         f"{QUEUE}~c{self.serial}" if KIND[name] == "child"
                                         else "")
                if code == calls.WAIT_SUSPEND:
                    if KIND[name] == "child":
                        self._store_child(short_id, named.decode())
                    if data.draw(st.sampled_from([True, True, True, False])):
                        self._finish_suspend(short_id, False)
                    break
            else:
                self._finish_run(short_id, data.draw(st.sampled_from(["ok", "ok", "dead"])))
        drain: bool = data.draw(st.booleans())
        if self.outbox and drain:
            self.hand_over()  # a worker drains the outbox after the ends it acknowledged

    @rule(count=st.integers(1, 3))
    def fetch(self, count: int) -> None:
        for job in self.jobs.values():  # due waits' jobs are promoted first
            if job.state == "suspended":
                open_wait = job.open_wait()
                assert open_wait is not None
                deadline = job.waits[open_wait].deadline
                if deadline is not None and deadline <= self.now:
                    event(f"fetch: a due {job.waits[open_wait].kind} wait made ready")
                    job.state = "ready"
        ready = set(self._in("ready"))
        fetched = self.run(calls.fetch(self.k, count, self.limits, now=self.now))
        assert isinstance(fetched, calls.Fetched)
        leased = [leased.short_id for leased in fetched.jobs]
        assert len(leased) == min(count, len(ready)), (leased, ready)
        assert set(leased) <= ready, ("leased a job that was not ready", leased, ready)
        for leased_job in fetched.jobs:
            job = self.jobs[leased_job.short_id]
            assert leased_job.token not in job.tokens, "a fencing token was handed out twice"
            job.state, job.told_to_suspend = "active", False
            job.attempts += 1
            job.tokens.append(leased_job.token)
            assert leased_job.attempts == job.attempts, (leased_job, job)

    def _wait(self, short_id: str, kind: str, name: str, ms: float | None,
              child: str = "") -> tuple[int, bytes]:
        """A run of ``short_id`` reaches wait ``name``: the reply, checked against the
        model, which it then follows."""
        job = self.jobs[short_id]
        reply = self.run(calls.wait(self.k, short_id, job.tokens[-1], kind, name, ms,
                                    child=child, now=self.now))
        expected: tuple[int, bytes]
        if job.cancelling:  # the run is to stop: nothing is recorded or described
            assert reply[0] == calls.WAIT_CANCELLING, (short_id, name, reply, job)
            event("wait: cancelling")
            return reply
        if name in job.recorded:
            expected = (calls.WAIT_RECORDED, job.recorded[name])
        elif kind == "signal" and job.mailbox.get(name):
            job.recorded[name] = b"s" + job.mailbox[name].pop(0)  # oldest first
            expected = (calls.WAIT_RECORDED, job.recorded[name])
        else:
            first = name not in job.waits
            if first:
                job.waits[name] = Wait(kind, None if ms is None else self.now + ms, child)
            job.current = name
            wait = job.waits[name]
            # A wait reached before keeps its end in time: once passed, it is over; one
            # over the moment it is first reached (a sleep of 0, a timeout of 0) is
            # recorded at once, with no suspension.
            if wait.deadline is not None and self.now >= wait.deadline:
                job.recorded[name] = b"t" if kind == "time" else b"x"
                expected = (calls.WAIT_RECORDED, job.recorded[name])
            else:
                job.told_to_suspend = True
                expected = (calls.WAIT_SUSPEND, wait.child.encode())
        assert reply == expected, (short_id, name, reply, expected, job)
        event(f"wait {kind}: " + ("recorded " + expected[1][:1].decode()
                                  if expected[0] == calls.WAIT_RECORDED else "suspend"))
        return expected

    @precondition(lambda self: any(self._reachable(self.jobs[i], SLEEPS)
                                   for i in self._running()))
    @rule(data=st.data(), ms=st.sampled_from([0, 500, 1000, 3000]))
    def reach_a_sleep(self, data: st.DataObject, ms: int) -> None:
        short_id = data.draw(st.sampled_from(
            [i for i in self._running() if self._reachable(self.jobs[i], SLEEPS)]))
        name = data.draw(st.sampled_from(self._reachable(self.jobs[short_id], SLEEPS)))
        self._wait(short_id, "time", name, ms)

    @precondition(lambda self: any(self._reachable(self.jobs[i], SIGNAL_WAITS)
                                   for i in self._running()))
    @rule(data=st.data(), timeout=st.sampled_from([None, None, 0, 500, 2000]))
    def reach_a_signal_wait(self, data: st.DataObject, timeout: int | None) -> None:
        short_id = data.draw(st.sampled_from(
            [i for i in self._running() if self._reachable(self.jobs[i], SIGNAL_WAITS)]))
        name = data.draw(st.sampled_from(self._reachable(self.jobs[short_id], SIGNAL_WAITS)))
        self._wait(short_id, "signal", name, timeout)

    @precondition(lambda self: any(self._reachable(self.jobs[i], CHILD_WAITS)
                                   for i in self._running()))
    @rule(data=st.data(), store_child=st.sampled_from([True, True, True, False]))
    def reach_a_child_wait(self, data: st.DataObject, store_child: bool) -> None:
        """The run plans a child (a fresh id each run, as ``ctx.child`` does), and when told
        to suspend stores the child job the wait names (or, the worker dying first, not)."""
        short_id = data.draw(st.sampled_from(
            [i for i in self._running() if self._reachable(self.jobs[i], CHILD_WAITS)]))
        name = data.draw(st.sampled_from(self._reachable(self.jobs[short_id], CHILD_WAITS)))
        self.serial += 1
        code, named = self._wait(short_id, "child", name, None, f"{QUEUE}~c{self.serial}")
        if code == calls.WAIT_SUSPEND and store_child:
            self._store_child(short_id, named.decode())

    def _store_child(self, parent: str, child_id: str) -> None:
        child = child_id.split("~", 1)[1]
        spec = calls.JobSpec(task="c", visibility_ms=VT, parent=self._job_id(parent))
        stored = self.run(calls.enqueue(self.k, spec, [(child, b"[[],{}]")], self.limits,
                                        now=self.now))
        if child in self.jobs:  # stored once, never over an existing record
            assert stored == [(child, False)], stored
            return
        assert stored == [(child, True)], stored
        self.jobs[child] = Job("ready", parent=self._job_id(parent))

    @precondition(lambda self: any(j.parent for j in self.jobs.values()))
    @rule(data=st.data())
    def store_a_child_again(self, data: st.DataObject) -> None:
        child = data.draw(st.sampled_from(sorted(i for i, j in self.jobs.items() if j.parent)))
        parent = self.jobs[child].parent.split("~", 1)[1]
        self._store_child(parent, self._job_id(child))

    @precondition(lambda self: any(j.tokens for j in self.jobs.values()))
    @rule(data=st.data(), kind=st.sampled_from(["time", "signal", "child"]))
    def reach_a_wait_with_a_stale_token(self, data: st.DataObject, kind: str) -> None:
        """A token not current (an earlier run's, a made-up one) or a job not active: the
        wait is refused and nothing changes."""
        short_id = data.draw(st.sampled_from(sorted(i for i, j in self.jobs.items()
                                                    if j.tokens)))
        job = self.jobs[short_id]
        if job.state == "active":
            token = data.draw(st.sampled_from([*job.tokens[:-1], job.tokens[-1] + "x"]))
        else:
            token = job.tokens[-1]
        name = {"time": SLEEPS, "signal": SIGNAL_WAITS, "child": CHILD_WAITS}[kind][0]
        code, _ = self.run(calls.wait(
            self.k, short_id, token, kind, name, None if kind == "child" else 500.0,
            child=f"{QUEUE}~stale" if kind == "child" else "", now=self.now))
        assert code == calls.WAIT_REFUSED, (short_id, job)

    @precondition(lambda self: any(j.state == "active" and j.told_to_suspend
                                   for j in self.jobs.values()))
    @rule(data=st.data(), stale=st.sampled_from([False, False, False, True]))
    def finish_suspend(self, data: st.DataObject, stale: bool) -> None:
        short_id = data.draw(st.sampled_from(sorted(
            i for i, j in self.jobs.items() if j.state == "active" and j.told_to_suspend)))
        self._finish_suspend(short_id, stale)

    def _finish_suspend(self, short_id: str, stale: bool) -> None:
        job = self.jobs[short_id]
        token = job.tokens[-1] + ("x" if stale else "")
        finished = self.run(calls.finish(self.k, [calls.Outcome(
            short_id, token, "suspend", self.now / 1000, b"", 0)], self.limits, now=self.now))
        assert isinstance(finished, calls.Finished)
        if stale:
            assert finished.codes == [calls.FINISH_REFUSED]
            return
        job.attempts -= 1
        job.told_to_suspend = False
        if job.open_wait() is None:  # recorded since the wait call: ready at once
            event("finish suspend: ready at once")
            job.state = "ready"
            assert finished.codes == [calls.FINISH_SUSPENDED[1]], (short_id, job)
        else:
            job.state = "suspended"
            assert finished.codes == [calls.FINISH_SUSPENDED[0]], (short_id, job)

    @precondition(lambda self: self._running())
    @rule(data=st.data(), outcome=st.sampled_from(["ok", "ok", "dead"]))
    def finish_the_run(self, data: st.DataObject, outcome: str) -> None:
        """A run that went past its waits (or reached none) ends: ok or dead."""
        self._finish_run(data.draw(st.sampled_from(self._running())), outcome)

    def _finish_run(self, short_id: str, outcome: str) -> None:
        job = self.jobs[short_id]
        payload = (b'"r-' if outcome == "ok" else b"Boom: ") + short_id.encode() + (
            b'"' if outcome == "ok" else b"")
        finished = self.run(calls.finish(self.k, [calls.Outcome(
            short_id, job.tokens[-1], outcome, self.now / 1000, payload, 0)], self.limits,
            now=self.now))
        assert isinstance(finished, calls.Finished)
        if job.cancelling:  # whatever a cancelled run reports, it ends cancelled
            assert finished.codes == [calls.FINISH_CANCELLED], (short_id, job)
            self._end(short_id, "cancelled", b"")
            return
        expected = calls.FINISH_SUCCEEDED if outcome == "ok" else calls.FINISH_DEAD
        assert finished.codes == [expected], (short_id, job)
        self._end(short_id, "succeeded" if outcome == "ok" else "dead", payload)

    def _end(self, short_id: str, state: str, detail: bytes) -> None:
        job = self.jobs[short_id]
        job.state, job.result = state, detail
        if job.parent:
            self.outbox.append(short_id)

    @precondition(lambda self: self._in("suspended", "ready"))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        """Cancel a suspended job (or a ready one, a child among them)."""
        short_id = data.draw(st.sampled_from(self._in("suspended", "ready")))
        job = self.jobs[short_id]
        before = self.run(calls.cancel(self.k, short_id, self.limits, "not needed",
                                       now=self.now))
        assert before == job.state, (short_id, before, job)
        self._end(short_id, "cancelled", b"not needed")

    @precondition(lambda self: any(not self.jobs[i].parent for i in self._running()))
    @rule(data=st.data())
    def cancel_a_run(self, data: st.DataObject) -> None:
        """Cancel a running job (not told to suspend, no child): its holder is asked to
        stop; a wait it reaches is refused as cancelling, and it ends cancelled."""
        short_id = data.draw(st.sampled_from(
            [i for i in self._running() if not self.jobs[i].parent]))
        before = self.run(calls.cancel(self.k, short_id, self.limits, "stop", now=self.now))
        assert before == "active", (short_id, before)
        self.jobs[short_id].cancelling = True

    def _timed_out(self) -> list[tuple[str, str]]:
        return sorted((i, n) for i, j in self.jobs.items() for n, v in j.recorded.items()
                      if v == b"x" and j.state not in ENDED)

    @precondition(lambda self: self._timed_out())
    @rule(data=st.data())
    def signal_a_wait_that_timed_out(self, data: st.DataObject) -> None:
        """The timeout was recorded first: the signal that comes late is kept, not
        consumed (a later wait of that name would take it)."""
        short_id, name = data.draw(st.sampled_from(self._timed_out()))
        self._signal(short_id, name)

    @rule(data=st.data(), name=st.sampled_from(SIGNALS), aim=st.booleans())
    def signal(self, data: st.DataObject, name: str, aim: bool) -> None:
        """A signal to any job (or one never enqueued): delivered, kept or refused; aimed,
        it names a signal wait a job reached (open, or over: timed out, or consumed)."""
        reached = sorted((i, n) for i, j in self.jobs.items() for n in j.waits
                         if KIND[n] == "signal" and j.state not in ENDED)
        if aim and reached:
            short_id, name = data.draw(st.sampled_from(reached))
        else:
            short_id = data.draw(st.sampled_from([*sorted(self.jobs), *sorted(self.jobs),
                                                  "nobody"]))
        self._signal(short_id, name)

    def _signal(self, short_id: str, name: str) -> None:
        self.sent += 1
        payload = b"P%04dQ" % self.sent
        reply = self.run(calls.signal(self.k, short_id, name, payload))
        job = self.jobs.get(short_id)
        event(f"signal to a {job.state if job else 'missing'} job")
        if job is None or job.state in ENDED:
            expected = calls.SIGNAL_REFUSED
        elif job.open_wait() == name and job.waits[name].kind == "signal":
            expected = calls.SIGNAL_DELIVERED
            deadline = job.waits[name].deadline
            if deadline is not None and deadline <= self.now:
                event("a signal beats the timeout that passed")
            job.recorded[name] = b"s" + payload
            if job.state == "suspended":
                job.state = "ready"
        else:
            expected = calls.SIGNAL_KEPT
            job.mailbox.setdefault(name, []).append(payload)
        assert reply == expected, (short_id, name, reply, expected, job)
        event(f"signal reply {reply}")
        if job is not None and name in job.recorded and job.recorded[name] == b"x":
            event("a signal after its wait timed out")
        if expected != calls.SIGNAL_REFUSED:
            self.accepted.setdefault(short_id, set()).add(payload)

    def _resume(self, parent_id: str, child_id: str, outcome: bytes) -> int:
        """The model of ``resume``: how many parents became ready (0 or 1). The parent's
        current wait must be that child's, open, and the parent must not have ended: an
        ended parent (cancelled while suspended) has nothing to learn, as an ended job
        refuses a signal."""
        parent = self.jobs.get(parent_id.split("~", 1)[1])
        if parent is None or parent.state in ("succeeded", "dead", "cancelled", "expired"):
            return 0
        open_wait = parent.open_wait()
        if open_wait is None or parent.waits[open_wait].kind != "child" or \
                parent.waits[open_wait].child != child_id:
            return 0
        parent.recorded[open_wait] = outcome
        if parent.state == "suspended":
            parent.state = "ready"
            return 1
        return 0

    def _child_outcome(self, child: str) -> bytes:
        job = self.jobs[child]
        if job.state == "succeeded":
            return b"o" + job.result
        tag = b"d" if job.state == "dead" else b"c"
        return tag + self._job_id(child).encode() + b"\n" + job.result

    @rule()
    def hand_over(self) -> None:
        """A drainer empties the outbox: each ended child's parent learns of its end."""
        drain_sync(self.app, [QUEUE])
        for child in self.outbox:
            made_ready = self._resume(self.jobs[child].parent, self._job_id(child),
                                      self._child_outcome(child))
            event(f"hand-over of a {self.jobs[child].state} child"
                  + (": parent made ready" if made_ready else ""))
        self.outbox = []

    @precondition(lambda self: any(j.waits for j in self.jobs.values()))
    @rule(data=st.data(), outcome=st.sampled_from([b'o"direct"', b"dq~x\nfailed",
                                                    b"cq~x\nstopped"]),
          right_child=st.sampled_from([True, True, False]), twice=st.booleans())
    def resume_directly(self, data: st.DataObject, outcome: bytes, right_child: bool,
                        twice: bool) -> None:
        """``resume`` called as a drainer would (also for a child the parent does not
        wait for, and sent twice): applied once, when the parent waits for that child."""
        parent = data.draw(st.sampled_from(sorted(i for i, j in self.jobs.items() if j.waits)))
        job = self.jobs[parent]
        children = [w.child for w in job.waits.values() if w.kind == "child"]
        child_id = data.draw(st.sampled_from(children)) if children and right_child \
            else f"{QUEUE}~nobody"
        for _ in range(2 if twice else 1):
            expected = self._resume(self._job_id(parent), child_id, outcome)
            reply = self.run(calls.resume(self.k, [(parent, child_id, outcome)]))
            assert reply == expected, (parent, child_id, reply, expected, job)

    # -- comparison ------------------------------------------------------------------------

    def _members(self, key: str) -> set[str]:
        """Members of the suspended set: who is in it is the contract, not its type (a
        sorted set by when each suspended, or a plain set)."""
        redis = self.app.redis
        kind = redis.type(key)
        if kind in (b"none", "none"):
            return set()
        if kind in (b"set", "set"):
            return {m.decode() for m in redis.smembers(key)}
        return {m.decode() for m in redis.zrange(key, 0, -1)}

    @invariant()
    def redis_matches_the_model(self) -> None:
        redis = self.app.redis
        with redis.pipeline(transaction=False) as pipe:
            for short_id in self.jobs:
                pipe.hgetall(self.k.job(short_id))
            records = pipe.execute()
        delivered: dict[bytes, str] = {}
        for (short_id, job), record in zip(self.jobs.items(), records, strict=True):
            assert record.get(b"s", b"").decode() == job.state, (short_id, record, job)
            assert int(record.get(b"attempts", 0)) == job.attempts, (short_id, record, job)
            # Recorded outcomes: exactly the model's (so never changed once recorded).
            recorded = {n: record[b"w:" + n.encode()] for n in NAMES
                        if b"w:" + n.encode() in record}
            assert recorded == job.recorded, (short_id, recorded, job)
            # Signals: each accepted one is consumed once (in one recorded outcome) or kept.
            consumed = {v[1:] for n, v in job.recorded.items() if KIND[n] == "signal"
                        and v[:1] == b"s"}
            kept = {p for box in job.mailbox.values() for p in box}
            assert not consumed & kept
            assert consumed | kept == self.accepted.get(short_id, set()), (short_id, job)
            for payload in consumed:
                assert payload not in delivered, ("a signal consumed twice", payload)
                delivered[payload] = short_id
            if job.state not in ENDED:
                for name in SIGNALS:
                    box = record.get(b"sig:" + name.encode(), b"")
                    for payload in job.mailbox.get(name, []):
                        assert payload in box, ("a kept signal was lost", short_id, name)
                    for payload in consumed:
                        assert payload not in box, ("a consumed signal is kept", short_id)
        sets = {name: {m.decode(): s for m, s in redis.zrange(key, 0, -1, withscores=True)}
                for name, key in (("leases", self.k.leases), ("delayed", self.k.delayed))}
        assert set(sets["leases"]) == set(self._in("active"))
        assert self._members(self.k.suspended) == set(self._in("suspended"))
        timed: dict[str, float] = {}
        for short_id in self._in("suspended"):
            deadline = self.jobs[short_id].waits[self.jobs[short_id].open_wait() or ""].deadline
            if deadline is not None:
                timed[short_id] = deadline
        assert sets["delayed"] == timed, (sets["delayed"], timed)
        counts = {k.decode(): int(v) for k, v in redis.hgetall(self.k.counts).items()}
        assert counts.get("suspended", 0) == len(self._in("suspended")), counts
        assert counts.get("suspended_timed", 0) == len(timed), counts
        assert counts.get("ready", 0) == len(self._in("ready")), counts
        assert counts.get("running", 0) == len(self._in("active")), counts


WaitsMachine.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
    phases=[p for p in Phase if p != Phase.explain],  # tracing is slow on Python 3.11
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_durable_waits_match_their_model = WaitsMachine.TestCase
