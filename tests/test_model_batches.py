"""Model-based test of batch calls: hypothesis enqueues jobs of a batch task (with tenants,
attempt limits and deadlines), leases them with ``fetch``, gathers them into buffers with
the worker's own grouping code (:class:`conveyor.worker.batches.Batches`, which reads each
item's tenant from its record), makes calls of them, and ends each call with ONE ``finish``
carrying an outcome per item, built by the worker's own mapping
(:class:`conveyor.worker.batch_outcomes.ItemOutcomes`) from what the function marked on
each item (``result``, ``fail``, ``retry``, a result then ``fail``) and what the call raised
(nothing, an error its policy retries, one it does not, ``Fail``, ``Snooze``). Between the
steps: cancels (of a waiting job, of a gathered item, of an item in a call, heard or not
yet heard by the worker's heartbeat), heartbeats that tell a run's start (or not), a stop
that hands gathered items back, lost replies sent again, and time moving (the scripts'
``now`` override), so that leases expire and are taken again (the old holder's outcome
then carries a stale token) and deadlines pass.

The model's rules are the contract's (DESIGN §2, §5, §6 and docs/batches.md), not a
reading of the scripts:

- an item marked ``fail`` is dead; ``retry`` retries it alone (dead once its attempts are
  spent); ``result`` makes it succeed with that result, also when the call raises, and
  ``fail``/``retry`` win over a result set earlier; an item left alone succeeds when the
  call returns, and when it raises is settled as if its own run had raised (``Fail``:
  dead; an error ``no_retry_on`` names: dead; another: retried; ``Snooze``: scheduled,
  the attempt not counted);
- each outcome is fenced by its own item's token: one whose lease was lost and taken again
  is refused, the others of the same call are recorded;
- a job someone cancelled while it was held ends cancelled whatever its call reports; past
  its deadline it ends expired (a waiting job past it never starts); on two points of
  deadlines the scripts differ and the model follows them, so as to check the rest: the
  tests at the end of this file hold the contract's side, expected to fail until fixed;
- an attempt is charged only for a run that started: a lease lost before a heartbeat told
  its start, a gathered item handed back or cancelled before its call, give it back;
- a finish whose reply was lost, sent again, answers as the first time and applies once.

After every step each job's state and attempts equal the model's, no job has two
successes, and the queue's books (ready count, active per task, the lease, delayed and
dead sets, the ready lists) name every job exactly where its state says, and only there.

The worker's grouping is driven for real; the choice of which buffer becomes a call, and
when, is the test's (a step), not ``Batches.dispatch``'s timing rules, which
``test_batches.py`` covers. A lease taken again is taken, as far as the old holder
knows, by another worker: the old hold stays in its buffer or call.

``CONVEYOR_MODEL_EXAMPLES`` raises the number of examples (default 100).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import conveyor
from conveyor import keys as keyspace
from conveyor.clock import ServerClock
from conveyor.scripts import calls
from conveyor.worker.batch_outcomes import ItemOutcomes
from conveyor.worker.batches import Batches
from conveyor.worker.executor import Held
from helpers import RedisServer
from lost_reply import LoseReplies

EXAMPLES = int(os.environ.get("CONVEYOR_MODEL_EXAMPLES", "100"))
T0 = 1_800_000_000_000.0
VT = 1000  # lease length (ms): a few time steps lose a lease
MAX = 3  # items in a call at most
BACKOFF = 0.5  # the task's base back-off (s)
SNOOZE_CAP = 2
TASK = "b"
MARKS = ("none", "none", "result", "fail", "retry", "result_then_fail")
RAISES = (None, None, "error", "not_retried", "fail", "snooze")
WAITING = ("ready", "scheduled", "retrying")
FINAL = ("succeeded", "dead", "cancelled", "expired")

SERVER: RedisServer | None = None


@pytest.fixture(scope="module", autouse=True)
def _server() -> Iterator[None]:
    global SERVER
    SERVER = RedisServer().start()
    yield
    SERVER.cleanup()
    SERVER = None


@dataclass
class Job:
    state: str
    tenant: str
    max_attempts: int
    deadline: float | None  # ms: must finish by (and so start by)
    start_by: float | None  # ms: the earlier of its expires and its deadline
    attempts: int = 0
    due: float = 0.0  # ms, while scheduled or retrying
    lease: float = 0.0  # ms, while active
    token: str = ""  # the current lease's token ('' when none)
    cancel: bool = False  # a cancel was asked while it was held (or its deadline passed)
    began: bool = False  # a heartbeat told that the current lease's run began
    unstarted: int = 0  # leases lost before their run was told to begin
    snoozes: int = 0
    successes: int = 0
    result: bytes | None = None


def exception(kind: str | None) -> BaseException | None:
    return {None: None, "error": ValueError("boom"), "not_retried": KeyError("gone"),
            "fail": conveyor.Fail("refused"), "snooze": conveyor.Snooze(1)}[kind]


class BatchMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        assert SERVER is not None
        self.app = conveyor.Conveyor(SERVER.url, namespace=f"b{uuid.uuid4().hex[:10]}")
        self.k = self.app.keys("q")
        self.limits = calls.Limits(snooze_cap=SNOOZE_CAP)
        self.now = T0
        self.jobs: dict[str, Job] = {}
        self.serial = 0
        self.lose = False
        self.clock = ServerClock()
        self.loop = asyncio.new_event_loop()
        self.calls: list[list[conveyor.BatchItem]] = []  # calls in progress
        self.by: str | None = None

    def teardown(self) -> None:
        self.loop.run_until_complete(self.app.aclose())
        self.loop.close()
        self.app.redis.flushdb()
        self.app.close()

    def run(self, call: calls.ScriptCall[Any]) -> Any:
        if self.lose:  # DESIGN 5: a reply lost after Redis applied the call, sent again
            self.lose = False
            with LoseReplies(b"EVALSHA\r\n") as lost:
                reply = self.app.scripts.run(call)
            assert lost.lost == 1
            return reply
        return self.app.scripts.run(call)

    @initialize(by=st.sampled_from([None, "tenant"]))
    def start(self, by: str | None) -> None:
        self.by = by

        @self.app.task(name=TASK, queue="q", backoff=BACKOFF, no_retry_on=(KeyError,),
                       batch=conveyor.Batch(max=MAX, wait=60.0, by=by))  # type: ignore[arg-type]
        def index(items: list[conveyor.BatchItem]) -> None:
            raise AssertionError("the test settles the calls itself")

        self.task = index
        self.outcomes = ItemOutcomes(
            lambda held, task, value: self.app.codec.encode_result(value), self.clock)

        async def make() -> Batches:
            # No slot is ever free: calls are made by the test's own step, not by dispatch.
            return Batches(self.app, self.clock, cast(Any, None), concurrency=4,
                           slot_free=lambda: False, finished=lambda held, outcome: None)

        self.batches = self.loop.run_until_complete(make())

    @rule()
    def lose_the_next_reply(self) -> None:
        self.lose = True

    @rule(ms=st.sampled_from([10, 400, 1100, 2500]))
    def advance_time(self, ms: int) -> None:
        self.now += ms

    @rule(n=st.integers(1, 4), tenant=st.sampled_from(["", "t1", "t2"]),
          attempts=st.integers(1, 3), deadline=st.sampled_from([None, None, 300, 1500, 4000]),
          expires=st.sampled_from([None, None, None, 500]))
    def enqueue(self, n: int, tenant: str, attempts: int, deadline: int | None,
                expires: int | None) -> None:
        spec = calls.JobSpec(TASK, 5, tenant, None, None, attempts, "", VT,
                             expires="" if expires is None else f"+{expires}",
                             deadline="" if deadline is None else f"+{deadline}")
        start_by = [self.now + t for t in (expires, deadline) if t is not None]
        batch = []
        for _ in range(n):
            self.serial += 1
            batch.append((f"j{self.serial}", b"[[],{}]"))
        stored = self.run(calls.enqueue(self.k, spec, batch, self.limits, now=self.now))
        assert stored == [(short, True) for short, _ in batch]
        for short, _ in batch:
            self.jobs[short] = Job("ready", tenant, attempts,
                                   None if deadline is None else self.now + deadline,
                                   min(start_by, default=None))

    # -- leases ----------------------------------------------------------------------------

    def _maintain(self) -> None:
        """What a fetch does before it leases: expired leases come back (an attempt given
        back when no heartbeat told the run began; dead when a started run spent the last;
        cancelled when a cancel was asked), due retries are ready, and past a deadline a
        waiting job expires and a running one is asked to cancel."""
        for job in self.jobs.values():
            if job.state == "active" and job.lease <= self.now:
                if not job.began:
                    job.attempts -= 1
                    job.unstarted += 1
                job.token = ""
                if job.cancel:  # expired when the cancel was its deadline's
                    job.state = self._ended_by_cancel(job)
                elif job.began and job.attempts >= job.max_attempts:
                    job.state = "dead"
                else:
                    job.state = "ready"
            elif job.state in ("scheduled", "retrying") and job.due <= self.now:
                job.state = "ready"
            if job.start_by is not None and self.now >= job.start_by \
                    and job.state in WAITING:
                job.state = "expired"  # it must start by then: it never will
            elif job.deadline is not None and self.now >= job.deadline \
                    and job.state == "active":
                job.cancel = True  # cancelled as a running job is

    def _ended_by_cancel(self, job: Job) -> str:
        past = job.deadline is not None and self.now >= job.deadline
        return "expired" if past else "cancelled"

    @rule(count=st.integers(1, 5))
    def fetch(self, count: int) -> None:
        self._maintain()
        ready = {s for s, j in self.jobs.items() if j.state == "ready"}
        fetched = self.run(calls.fetch(self.k, count, self.limits, now=self.now, worker="w"))
        assert isinstance(fetched, calls.Fetched)
        leased = [j.short_id for j in fetched.jobs]
        assert len(leased) == len(set(leased)) == min(count, len(ready)), (leased, ready)
        assert set(leased) <= ready, (leased, ready)
        arrived = []
        for lease in fetched.jobs:
            job = self.jobs[lease.short_id]
            job.state, job.attempts = "active", job.attempts + 1
            job.lease, job.began, job.cancel = self.now + VT, False, False
            assert lease.token != job.token
            job.token = lease.token
            assert (lease.attempts, lease.max_attempts) == (job.attempts, job.max_attempts)
            assert lease.confirm == (job.unstarted > 0), "a run that must tell its start"
            if lease.confirm:  # the worker tells the start before it gathers the item
                assert self.run(calls.heartbeat(
                    self.k, [(lease.short_id, lease.token, VT, True)], now=self.now)) == [1]
                job.began = True
            arrived.append(Held("q", lease))
        self._gather(arrived)

    def _gather(self, arrived: list[Held]) -> None:
        async def place() -> None:
            for held in arrived:
                self.batches.add(held)
            while self.batches._placing:
                await asyncio.gather(*list(self.batches._placing.values()))
        self.loop.run_until_complete(place())

    def _gathered(self) -> list[Held]:
        return [held for buffer in self.batches._buffers.values()
                for held, _, _ in buffer.items if not held.withdrawn]

    def _held(self) -> list[Held]:
        in_calls = [item._lease for call in self.calls for item in call
                    if not item._lease.withdrawn]
        return self._gathered() + in_calls

    # -- calls -----------------------------------------------------------------------------

    @precondition(lambda self: self._gathered())
    @rule(data=st.data())
    def start_call(self, data: st.DataObject) -> None:
        """A buffer becomes a call of at most ``max`` items, as ``Batches._start`` takes
        them: in the order they arrived, skipping those withdrawn meanwhile."""
        keys = sorted((k for k, b in self.batches._buffers.items() if b.items), key=str)
        key = data.draw(st.sampled_from(keys))
        buffer = self.batches._buffers[key]
        self.clock.observe(self.now)
        items: list[conveyor.BatchItem] = []
        while buffer.items and len(items) < MAX:
            held, tenant, _ = buffer.items.popleft()
            if not held.try_start(self.clock):
                continue
            leased = held.leased
            job = self.jobs[leased.short_id]
            assert tenant == (job.tenant or None), "the tenant read from the record"
            if self.by == "tenant":  # one call never mixes tenants
                assert key[2] == tenant, (key, tenant)
            items.append(conveyor.BatchItem(
                keyspace.job_id("q", leased.short_id), [], {}, tenant, leased.attempts,
                leased.max_attempts, lease=held))
        if not buffer.items:
            del self.batches._buffers[key]
        if items:
            self.calls.append(items)

    @rule(data=st.data(), count=st.integers(1, 5), raises=st.sampled_from(RAISES))
    def work(self, data: st.DataObject, count: int, raises: str | None) -> None:
        """A worker's usual round: a fetch, a call of one buffer, its end (so that calls
        end in most examples, not a few; the steps apart let other steps come between)."""
        self.fetch(count)
        if self._gathered():
            self.start_call(data)
            if self.calls:
                self._end(data, data.draw(st.integers(0, len(self.calls) - 1)), raises)

    @precondition(lambda self: self.calls)
    @rule(data=st.data(), raises=st.sampled_from(RAISES))
    def end_call(self, data: st.DataObject, raises: str | None) -> None:
        self._end(data, data.draw(st.integers(0, len(self.calls) - 1)), raises)

    def _end(self, data: st.DataObject, index: int, raises: str | None) -> None:
        """The call returns or raises; one ``finish`` records an outcome for every item the
        worker still holds (one withdrawn, cancelled, has had its outcome already)."""
        items = self.calls.pop(index)
        marks = {}
        for item in items:
            mark = data.draw(st.sampled_from(MARKS))
            marks[id(item)] = mark
            if mark in ("result", "result_then_fail"):
                item.result = f"r-{item.id}"
            if mark == "fail" or mark == "result_then_fail":
                item.fail("refused by the index")
            elif mark == "retry":
                item.retry("throttled")
        self.clock.observe(self.now)
        settled = self.outcomes.settle(self.task, items, exception(raises))
        kept = [(held, outcome) for held, outcome in settled if not held.withdrawn]
        if not kept:
            return
        expected = []
        for (held, outcome), item in zip(settled, items, strict=True):
            if not held.withdrawn:
                expected.append(self._apply(outcome, marks[id(item)], raises))
        finished = self.run(calls.finish(self.k, [o for _, o in kept], self.limits,
                                         now=self.now))
        assert isinstance(finished, calls.Finished)
        assert finished.codes == expected, (finished.codes, expected, kept)

    def _contract(self, job: Job, mark: str, raises: str | None) -> str:
        """docs/batches.md's table: what becomes of an item."""
        if mark in ("fail", "result_then_fail"):
            return "dead"
        if mark == "retry":
            return "retry"
        if mark == "result" or raises is None:
            return "ok"
        return {"fail": "dead", "not_retried": "dead", "snooze": "snooze"}.get(raises, "retry")

    def _apply(self, outcome: calls.Outcome, mark: str, raises: str | None) -> int:
        """The model's end of one item; the code its outcome must get."""
        job = self.jobs[outcome.short_id]
        if job.state != "active" or outcome.token != job.token:
            return calls.FINISH_REFUSED
        job.token = ""
        # Past its deadline the job is expired whatever the run reports, also when no fetch
        # asked the run to cancel yet.
        if job.cancel or (job.deadline is not None and self.now >= job.deadline):
            job.state = self._ended_by_cancel(job)
            return calls.FINISH_EXPIRED if job.state == "expired" else calls.FINISH_CANCELLED
        end = self._contract(job, mark, raises)
        assert outcome.outcome == end, ("the mapping of the item", mark, raises, outcome)
        if end == "ok":
            job.state, job.successes = "succeeded", job.successes + 1
            job.result = self.app.codec.encode_result(
                f"r-{keyspace.job_id('q', outcome.short_id)}" if mark == "result" else None)
            return calls.FINISH_SUCCEEDED
        if end == "dead" or (end == "retry" and job.attempts >= job.max_attempts):
            job.state = "dead"
            return calls.FINISH_DEAD
        if end == "snooze":
            if job.snoozes >= SNOOZE_CAP:
                job.state = "dead"
                return calls.FINISH_DEAD
            job.state, job.snoozes, job.attempts = "scheduled", job.snoozes + 1, job.attempts - 1
            job.due = self.now + 1000
            assert outcome.retry_delay_ms == 1000
            return calls.FINISH_SNOOZED
        # its own back-off, by its own attempts: base x 2^(attempts-1), jittered down to half
        full = BACKOFF * 2 ** (job.attempts - 1) * 1000
        assert full / 2 - 1 <= outcome.retry_delay_ms <= full, (outcome, job)
        job.state, job.due = "retrying", self.now + outcome.retry_delay_ms
        return calls.FINISH_RETRYING

    # -- while items are held --------------------------------------------------------------

    @precondition(lambda self: self._held())
    @rule(data=st.data(), tell=st.booleans(), act=st.booleans())
    def heartbeat(self, data: st.DataObject, tell: bool, act: bool) -> None:
        """The worker beats every lease it holds; an item in a call tells its start (once
        ``tell``); an item whose beat says it is cancelled is ended cancelled at once when
        the worker ``act``s on it (``Slots.cancel``), and its call goes on without it."""
        held = self._held()
        beats = [(h.leased.short_id, h.leased.token, VT, tell and h.started_at is not None)
                 for h in held]
        codes = self.run(calls.heartbeat(self.k, beats, now=self.now))
        expected = []
        for short, token, _, started in beats:
            job = self.jobs[short]
            if job.state != "active" or job.token != token:
                expected.append(calls.BEAT_LOST)
                continue
            expected.append(calls.BEAT_CANCEL if job.cancel else calls.BEAT_KEPT)
            job.lease, job.began = self.now + VT, job.began or started
        assert codes == expected, (codes, expected)
        hears = [h for h, code in zip(held, codes, strict=True) if code == calls.BEAT_CANCEL]
        if not act or not hears:
            return
        outcomes = []
        for h in hears:
            h.withdraw(running_too=True)
            outcomes.append(calls.Outcome(h.leased.short_id, h.leased.token, "cancelled",
                                          h.started_at or 0.0, ""))
        finished = self.run(calls.finish(self.k, outcomes, self.limits, now=self.now))
        expected = []
        for outcome in outcomes:
            job = self.jobs[outcome.short_id]
            if job.state != "active" or job.token != outcome.token:  # the same job twice
                expected.append(calls.FINISH_REFUSED)
                continue
            job.state, job.token = self._ended_by_cancel(job), ""
            if outcome.started_at == 0:  # gathered, never passed: its attempt is given back
                job.attempts -= 1
            expected.append(calls.FINISH_EXPIRED if job.state == "expired"
                            else calls.FINISH_CANCELLED)
        assert finished.codes == expected, (finished.codes, expected)

    @precondition(lambda self: self._gathered())
    @rule()
    def stop(self) -> None:
        """A stop hands the gathered items back untouched (attempt refunded); a job being
        cancelled is not handed back (it ends cancelled when its lease expires)."""
        back = []
        for held in self._gathered():
            assert held.withdraw(running_too=False)
            back.append((held.leased.short_id, held.leased.token))
        self.batches._buffers.clear()
        returned = self.run(calls.release(self.k, back))
        expected = 0
        for short, token in back:
            job = self.jobs[short]
            if job.state == "active" and job.token == token and not job.cancel:
                job.state, job.token, job.attempts = "ready", "", job.attempts - 1
                expected += 1
        assert returned == expected

    @precondition(lambda self: self.jobs)
    @rule(data=st.data(), held=st.booleans())
    def cancel(self, data: st.DataObject, held: bool) -> None:
        """Cancel a job (mostly one a worker holds: the race with its call): waiting, it
        never runs; held (gathered or in a call), its holder is asked to stop and what its
        call reports is dropped; ended, nothing changes."""
        active = sorted(s for s, j in self.jobs.items() if j.state == "active")
        short = data.draw(st.sampled_from(active if held and active else sorted(self.jobs)))
        job = self.jobs[short]
        before = self.run(calls.cancel(self.k, short, self.limits, "test", now=self.now))
        assert before == job.state
        if job.state in WAITING:
            job.state = "cancelled"
        elif job.state == "active":
            job.cancel = True

    # -- comparison ------------------------------------------------------------------------

    @invariant()
    def records_match_the_model(self) -> None:
        redis = self.app.redis
        with redis.pipeline(transaction=False) as pipe:
            for short in self.jobs:
                pipe.hmget(self.k.job(short), "s", "attempts", "result")
            records = pipe.execute()
        for (short, job), (state, attempts, result) in zip(self.jobs.items(), records,
                                                             strict=True):
            assert (state or b"").decode() == job.state, (short, state, job)
            assert int(attempts or 0) == job.attempts, (short, attempts, job)
            assert job.successes <= 1, (short, "two successes")
            if job.state == "succeeded":
                assert result == job.result, (short, result, job.result)

    @invariant()
    def every_job_is_in_one_place(self) -> None:
        """Every job in exactly one of the queue's places, the one its state names (an
        ended one in none); no id there that names no job."""
        redis = self.app.redis
        places: dict[str, list[str]] = {}
        for name, key in (("leased", self.k.leases), ("delayed", self.k.delayed),
                          ("dead", self.k.dead)):
            for member in redis.zrange(key, 0, -1):
                places.setdefault(member.decode(), []).append(name)
        for key in redis.scan_iter(f"{self.k.ready_prefix}*"):
            if redis.type(key) == b"list":
                for member in redis.lrange(key, 0, -1):
                    places.setdefault(member.decode(), []).append("ready")
        where = {"ready": ["ready"], "active": ["leased"], "scheduled": ["delayed"],
                 "retrying": ["delayed"], "dead": ["dead"]}
        for short, job in self.jobs.items():
            found = places.get(short, [])
            if job.state != "ready":  # a ready list drops an id it no longer owns lazily
                found = [p for p in found if p != "ready"]
            assert found == where.get(job.state, []), (short, job, places)
        assert set(places) <= set(self.jobs), places

    @invariant()
    def the_books_match_the_records(self) -> None:
        redis = self.app.redis
        by_state: dict[str, set[str]] = {}
        for short, job in self.jobs.items():
            by_state.setdefault(job.state, set()).add(short)
        # A job that waits with a time to start by is on the timer at that time, so that it
        # expires then, not when a fetch happens to meet it (DESIGN §6).
        timer = {m.decode(): t for m, t in redis.zrange(self.k.expiring, 0, -1,
                                                        withscores=True)}
        for short, job in self.jobs.items():
            if job.state in WAITING and job.start_by is not None:
                assert timer.get(short) == job.start_by, (short, job, timer.get(short))
        counts = redis.hgetall(self.k.counts)
        assert int(counts.get(b"ready", 0)) == len(by_state.get("ready", ()))
        active = int(redis.hget(self.k.active, TASK) or 0)
        assert active == len(by_state.get("active", ())) == redis.zcard(self.k.leases)


BatchMachine.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_batches_match_their_model = BatchMachine.TestCase


# -- a deadline's end, whichever way the run is told ----------------------------------------
# DESIGN §6: a job with ``deadline`` "must finish within" it, "cancelled as a running job is
# when it passes, then 'expired'".


def _one_job(deadline_ms: int) -> tuple[conveyor.Conveyor, Any, str]:
    assert SERVER is not None
    app = conveyor.Conveyor(SERVER.url, namespace=f"d{uuid.uuid4().hex[:10]}")
    k = app.keys("q")
    spec = calls.JobSpec(TASK, 5, "", None, None, 3, "", VT, deadline=f"+{deadline_ms}")
    app.scripts.run(calls.enqueue(k, spec, [("j1", b"[[],{}]")], calls.Limits(), now=T0))
    fetched = app.scripts.run(calls.fetch(k, 1, calls.Limits(), now=T0))
    assert [j.short_id for j in fetched.jobs] == ["j1"]
    return app, k, fetched.jobs[0].token


def test_a_run_cancelled_by_its_deadline_whose_lease_is_lost_ends_expired() -> None:
    """DESIGN 6: past its deadline a running job is cancelled, then 'expired' — also when
    its holder died before it heard of the cancel (the fetch that reclaims the lease)."""
    app, k, token = _one_job(1500)
    try:
        assert app.scripts.run(calls.heartbeat(k, [("j1", token, VT, True)], now=T0 + 900)) \
            == [calls.BEAT_KEPT]
        app.scripts.run(calls.fetch(k, 1, calls.Limits(), now=T0 + 1500))  # deadline passes
        app.scripts.run(calls.fetch(k, 1, calls.Limits(), now=T0 + 2000))  # lease lost
        assert app.redis.hget(k.job("j1"), "s") == b"expired"
    finally:
        app.redis.flushdb()
        app.close()


def test_a_run_that_ends_past_its_deadline_is_expired() -> None:
    """A finish past the deadline is 'expired' whatever the run reports, also before any
    fetch's timer asked to cancel the run."""
    app, k, token = _one_job(500)
    try:
        done = app.scripts.run(calls.finish(
            k, [calls.Outcome("j1", token, "ok", T0 / 1000, b"1")], calls.Limits(),
            now=T0 + 800))
        assert done.codes == [calls.FINISH_EXPIRED]
        assert app.redis.hget(k.job("j1"), "s") == b"expired"
    finally:
        app.redis.flushdb()
        app.close()
