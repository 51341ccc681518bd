"""A dead job requeued from the dead letters holds its dedupe key again.

DESIGN §2: while a job enqueued with ``key=`` is unfinished, an enqueue with the same key
returns it and creates nothing. A job that dies gives its key up; requeued, it is
unfinished again, so it takes the key back. When another unfinished job took the key
while it was dead, requeueing it would leave two unfinished jobs with one key: it stays
in the dead set, is not counted as requeued, and can be requeued once the other job has
finished.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import conveyor
from conveyor import deadletters
from conveyor.scripts import calls
from helpers import ModuleServer

Q = "q"


def _task(app: conveyor.Conveyor) -> conveyor.Task[[int], int]:
    @app.task(name="dd.work", queue=Q, retries=0)
    def work(x: int) -> int:
        return x

    return work


def _end(app: conveyor.Conveyor, outcome: str, *short_ids: str) -> None:
    """Lease the ready jobs and record ``outcome`` for those named (all must be leased)."""
    k = app.keys(Q)
    leased = {j.short_id: j for j in app.scripts.run(calls.fetch(k, 100, app.limits)).jobs}
    outcomes = [calls.Outcome(s, leased[s].token, outcome, 0.0, b"1" if outcome == "ok"
                              else "boom") for s in short_ids]
    assert app.scripts.run(calls.finish(k, outcomes, app.limits)).codes == [
        calls.FINISH_SUCCEEDED if outcome == "ok" else calls.FINISH_DEAD] * len(short_ids)


def _holder(app: conveyor.Conveyor, key: str) -> str | None:
    value = app.redis.get(app.keys(Q).dedupe_prefix + key)
    return None if value is None else value.decode()


def test_a_requeued_job_holds_its_key_again(app: conveyor.Conveyor) -> None:
    work = _task(app)
    first = work.options(key="order-17").enqueue(1)
    _end(app, "dead", first.short_id)
    assert _holder(app, "order-17") is None  # a dead job gives its key up
    assert app.dead_letters(Q).requeue(first.id) == 1
    assert _holder(app, "order-17") == first.short_id
    assert work.options(key="order-17").enqueue(2) == first  # nothing new made
    assert app.redis.hget(app.keys(Q).counts, "ready") == b"1"
    _end(app, "ok", first.short_id)
    assert _holder(app, "order-17") is None  # and ends holding it no longer
    assert work.options(key="order-17").enqueue(3) != first


def test_requeue_all_gives_every_job_its_key_back(app: conveyor.Conveyor) -> None:
    work = _task(app)
    jobs = [work.options(key=f"k{i}").enqueue(i) for i in range(3)]
    _end(app, "dead", *(j.short_id for j in jobs))
    assert app.dead_letters(Q).requeue() == 3
    for i, job in enumerate(jobs):
        assert work.options(key=f"k{i}").enqueue(9) == job


def test_a_dead_job_whose_key_was_taken_meanwhile_stays_dead(app: conveyor.Conveyor) -> None:
    """Two unfinished jobs must never share a key: the one that took the key while the
    first was dead keeps it, and the first stays dead until the key is free again."""
    work = _task(app)
    first = work.options(key="order-17").enqueue(1)
    _end(app, "dead", first.short_id)
    second = work.options(key="order-17").enqueue(2)
    assert second != first
    dead = app.dead_letters(Q)
    assert dead.requeue(first.id) == 0
    assert dead.requeue() == 0
    assert first.info().state == conveyor.JobState.DEAD
    assert first.info().error == "boom"  # its dead letter as it was
    assert [info.id for info in dead.list()] == [first.id]
    assert _holder(app, "order-17") == second.short_id
    assert app.redis.hget(app.keys(Q).counts, "ready") == b"1"  # the second only
    # Once the second has finished, the key is free: the first is requeued and takes it.
    _end(app, "ok", second.short_id)
    assert dead.requeue() == 1
    assert first.info().state == conveyor.JobState.READY
    assert _holder(app, "order-17") == first.short_id
    assert work.options(key="order-17").enqueue(3) == first


def test_requeue_all_goes_past_jobs_left_dead(
    app: conveyor.Conveyor, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Jobs left in the dead set stay at its front (oldest first): requeueing all must go
    on past them, however many there are, rather than stop at a batch of them."""
    monkeypatch.setattr(deadletters, "BATCH", 2)
    work = _task(app)
    blocked = [work.options(key=f"k{i}").enqueue(i) for i in range(5)]
    _end(app, "dead", *(j.short_id for j in blocked))
    holders = [work.options(key=f"k{i}").enqueue(i) for i in range(5)]  # take every key
    free = [work.enqueue(i) for i in range(3)]
    _end(app, "dead", *(j.short_id for j in free))
    assert app.dead_letters(Q).requeue() == 3
    assert {j.info().state for j in free} == {conveyor.JobState.READY}
    assert {j.info().state for j in blocked} == {conveyor.JobState.DEAD}
    assert [_holder(app, f"k{i}") for i in range(5)] == [j.short_id for j in holders]


# -- the contract, model-based ---------------------------------------------------------------
#
# Every way a keyed job starts, ends and comes back, against a plain model of DESIGN §2:
# at most one unfinished job per key, and an enqueue with a key returns that job. (The
# queue's model in test_model.py checks the same rule among every other step; here the
# steps are only those that take or give up a key, so each example reaches them.)

KEYS = ("k1", "k2")
VT = 1000  # lease length (ms)
UNFINISHED = ("ready", "active", "retrying")
SERVER = ModuleServer()
_server = SERVER.fixture()


@dataclass
class Keyed:
    key: str
    max_attempts: int
    state: str = "ready"
    attempts: int = 0
    began: bool = False  # the holder told that the current lease's run began
    token: str = ""
    cancel: bool = False  # asked while it ran
    dead_at: float = 0.0


class DedupeMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.app = conveyor.Conveyor(SERVER.url, namespace=f"d{uuid.uuid4().hex[:10]}")
        self.k = self.app.keys(Q)
        self.now = 1_800_000_000_000.0
        self.jobs: dict[str, Keyed] = {}
        self.serial = 0

    def teardown(self) -> None:
        self.app.redis.flushdb()
        self.app.close()

    def holder(self, key: str) -> str | None:
        return next((i for i, j in self.jobs.items() if j.key == key and j.state in UNFINISHED),
                    None)

    def _dies(self, short_id: str) -> None:
        self.jobs[short_id].state, self.jobs[short_id].dead_at = "dead", self.now

    @rule(key=st.sampled_from(KEYS), attempts=st.integers(1, 2))
    def enqueue(self, key: str, attempts: int) -> None:
        self.serial += 1
        short_id = f"j{self.serial:03d}"
        spec = calls.JobSpec("t", key=key, max_attempts=attempts, visibility_ms=VT)
        stored = self.app.scripts.run(calls.enqueue(self.k, spec, [(short_id, b"[[],{}]")],
                                                    self.app.limits, now=self.now))
        holder = self.holder(key)
        if holder is not None:
            assert stored == [(holder, False)], "an enqueue with a held key made a job"
        else:
            assert stored == [(short_id, True)]
            self.jobs[short_id] = Keyed(key, attempts)

    def _leases_expire(self) -> None:
        """The next fetch reclaims every lease (their time passed)."""
        for short_id, job in self.jobs.items():
            if job.state != "active":
                continue
            if not job.began:  # DESIGN 5: an attempt is charged only for a run that started
                job.attempts -= 1
            if job.cancel:
                job.state = "cancelled"
            elif not job.began:
                job.state = "ready"
            elif job.attempts >= job.max_attempts:
                self._dies(short_id)
            else:
                job.state = "ready"

    @rule(data=st.data(), count=st.integers(1, 3), expire=st.booleans())
    def fetch_and_finish(self, data: st.DataObject, count: int, expire: bool) -> None:
        """A fetch (after the leases lapse, when ``expire``), then an outcome for some of
        the jobs it leased; the others stay active."""
        if expire:
            self.now += VT + 1
            self._leases_expire()
        for job in self.jobs.values():
            if job.state == "retrying":  # due at once: promoted by the fetch
                job.state = "ready"
        ready = {i for i, j in self.jobs.items() if j.state == "ready"}
        fetched = self.app.scripts.run(calls.fetch(self.k, count, self.app.limits,
                                                   now=self.now))
        leased = {j.short_id: j for j in fetched.jobs}
        assert len(leased) == min(count, len(ready)) and set(leased) <= ready
        for short_id, lease in sorted(leased.items()):
            job = self.jobs[short_id]
            job.state, job.attempts, job.token = "active", job.attempts + 1, lease.token
            job.began = False
            outcome = data.draw(st.sampled_from(["ok", "retry", "dead", "none"]))
            if outcome == "none":  # it stays active; its run began, and was told, or not
                job.began = data.draw(st.booleans())
                if job.began:
                    assert self.app.scripts.run(calls.heartbeat(
                        self.k, [(short_id, lease.token, VT, True)], now=self.now)) == [1]
                continue
            done = self.app.scripts.run(calls.finish(self.k, [calls.Outcome(
                short_id, lease.token, outcome, self.now / 1000, b"1")], self.app.limits,
                now=self.now))
            if outcome == "ok":
                job.state = "succeeded"
            elif outcome == "retry" and job.attempts < job.max_attempts:
                job.state = "retrying"
            else:
                self._dies(short_id)
            assert done.codes == [{"succeeded": calls.FINISH_SUCCEEDED,
                                   "retrying": calls.FINISH_RETRYING,
                                   "dead": calls.FINISH_DEAD}[job.state]]

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        short_id = data.draw(st.sampled_from(sorted(self.jobs)))
        job = self.jobs[short_id]
        assert self.app.scripts.run(calls.cancel(self.k, short_id, self.app.limits,
                                                 now=self.now)) == job.state
        if job.state in ("ready", "retrying"):
            job.state = "cancelled"
        elif job.state == "active":
            job.cancel = True

    @precondition(lambda self: any(j.state == "dead" for j in self.jobs.values()))
    @rule(data=st.data(), one=st.booleans())
    def requeue(self, data: st.DataObject, one: bool) -> None:
        """Dead jobs, oldest first, come back unless their key is held (DESIGN §2)."""
        dead = sorted((j.dead_at, i) for i, j in self.jobs.items() if j.state == "dead")
        if one:
            dead = [data.draw(st.sampled_from(dead))]
        expected = 0
        for _, short_id in dead:
            job = self.jobs[short_id]
            if self.holder(job.key) is None:
                job.state, job.attempts, expected = "ready", 0, expected + 1
        letters = self.app.dead_letters(Q)
        got = letters.requeue(f"{Q}~{dead[0][1]}") if one else letters.requeue()
        assert got == expected

    @precondition(lambda self: any(j.state == "dead" for j in self.jobs.values()))
    @rule()
    def purge(self) -> None:
        dead = [i for i, j in self.jobs.items() if j.state == "dead"]
        assert self.app.dead_letters(Q).purge() == len(dead)
        for short_id in dead:
            del self.jobs[short_id]

    @invariant()
    def one_unfinished_job_per_key(self) -> None:
        for key in KEYS:
            unfinished = [i for i, j in self.jobs.items()
                          if j.key == key and j.state in UNFINISHED]
            assert len(unfinished) <= 1, ("two unfinished jobs share a key", key, unfinished)
            held = self.app.redis.get(self.k.dedupe_prefix + key)
            assert (held.decode() if held else None) == self.holder(key), key
        states = self.app.redis.hgetall(self.k.counts)
        ready = sum(j.state == "ready" for j in self.jobs.values())
        assert int(states.get(b"ready", 0)) == ready


DedupeMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=20,
                                           deadline=None)
test_keys_follow_the_contract = DedupeMachine.TestCase
