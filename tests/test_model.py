"""Model-based test: hypothesis drives the queue's state changes on a real redis-server and
compares Redis with a plain Python model after every step.

The steps are the scripts every public call goes through (enqueue with priorities,
tenants, delays, attempt limits and dedupe keys; fetch; heartbeat and finish with current
and stale tokens, also asking to snooze; release; cancel, also of running jobs; progress
and steps with current and stale tokens; dead-letter requeue and purge; pause and resume),
the passage of time, through the scripts' ``now`` override, so that leases expire and
delayed jobs come due without sleeping, and the expiry of records that carry a TTL (done at
once with DEL, as Redis would do it when the TTL runs out). After each step, for every job:
its state and attempts, progress and recorded steps; and for the queue: the ready count,
jobs active per task, the lease, delayed and dead sets, and which job holds each dedupe key.
The model's rules are DESIGN's, not a reading of the scripts: a dedupe key is held by the
one unfinished job enqueued with it (also one requeued from the dead letters), and no two
unfinished jobs ever share a key.

Workflows join in: small DAGs stored by ``workflow_enqueue``, their hand-overs drained
(``conveyor.workflow.release``) and repeated (a second drainer, a retried release); the
model says which nodes wait, are released or cancelled, and what the hand-over outbox
holds.

Idle workers waiting for hand-offs join in: a step registers the worker as a waiter (or a
fetch does, offering the slots it left free), and every enqueue that makes jobs ready while
the registration is live must lease to it exactly what a fetch of that many would, under
the same limits, and push the jobs onto its hand-off list; paused, limited or lapsed, it
hands nothing over and the registration stays.

Flow control is part of it: a step sets or clears a queue cap and rate and a per-tenant
cap and rate, each fetch must lease exactly what the limits allow (no fewer: a tenant at
its limit never holds back another), the model keeps its own token buckets, and the
running counts (the queue's and each tenant's) always equal the jobs held, under every
interleaving of ends, releases, expiries and limit changes.

``CONVEYOR_MODEL_EXAMPLES`` raises the number of examples (default 75, for CI).
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from redis.exceptions import ResponseError

import conveyor
from conveyor.scripts import calls, plain
from conveyor.sink import stream_events
from conveyor.workflow.release import drain_sync
from helpers import ModuleServer
from lost_reply import LoseReplies

EXAMPLES = int(os.environ.get("CONVEYOR_MODEL_EXAMPLES", "75"))
VT = 1000  # lease length (ms)
WAITER_TTL = 2000  # ms: registrations lapse within a few time steps
WORKER = "w"
SNOOZE_CAP = 2
TASKS = ("a", "b")
# The fixed keys each script checks the type of before its first write (key_types.lua).
FETCH_CHECKS = ("priorities", "delayed", "leases", "dead", "counts", "active", "seq", "events",
                "limits", "buckets", "running", "parked")
FINISH_CHECKS = ("leases", "delayed", "dead", "active", "idle", "events", "counts", "running",
                 "parked", "limits", "priorities", "handover")


@dataclass
class Model:
    state: str
    task: str
    priority: int
    max_attempts: int
    tenant: str = ""
    attempts: int = 0
    due: float = 0.0  # ms, while scheduled or retrying
    lease: float = 0.0  # ms, while active
    tokens: list[str] = field(default_factory=list)  # every token handed out, last current
    key: str = ""  # dedupe key it was enqueued with
    dead_at: float = 0.0  # ms, when it last died: the dead set's order (then by id)
    cancel: bool = False  # a cancel was asked while it ran
    # DESIGN 5, an attempt is charged only for a run that started: the holder said (with a
    # heartbeat) that the current lease's run began; a lease lost before that is given back
    began: bool = False
    unstarted: int = 0  # leases lost before their run began; then runs say so first
    snoozes: int = 0
    progress: float | None = None
    steps: set[str] = field(default_factory=set)
    node: bool = False  # a workflow node
    order: int | None = None  # enqueue serial while it waits, ready, from its enqueue on
    waiting: bool = False  # a node waiting for its parents (state 'scheduled')
    parents: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    run_if: str = "succeeded"
    recorded: dict[str, bool] = field(default_factory=dict)  # parent -> it succeeded


UNFINISHED = ("scheduled", "ready", "active", "retrying")
FINAL = ("succeeded", "dead", "cancelled")


SERVER = ModuleServer()
_server = SERVER.fixture()


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.app = conveyor.Conveyor(SERVER.url, namespace=f"m{uuid.uuid4().hex[:10]}")
        self.k = self.app.keys("q")
        self.streaming = False  # whether a sink has read the queue: events are written
        self.limits = calls.Limits(snooze_cap=SNOOZE_CAP)
        self.now = 1_800_000_000_000.0
        self.jobs: dict[str, Model] = {}
        self.paused = False
        self.serial = 0
        self.cap: int | None = None  # the queue's concurrency cap
        self.tenant_cap: int | None = None  # every tenant's
        self.rate: float | None = None  # the queue's rate (jobs/s)
        self.tenant_rate: float | None = None  # every tenant's
        self.buckets: dict[str, tuple[float, float]] = {}  # '' queue, tenant -> (tokens, ms)
        self.pending: list[str] = []  # workflow nodes that ended, not yet handed over
        self.traces: dict[str, str] = {}  # short id -> trace id of its enqueue ('' untraced)
        self.waiter: tuple[int, float] | None = None  # slots offered, when it lapses (ms)
        self.overwritten: list[str] = []  # keys a hand edit wrote a string over
        self.lose_next_reply = False  # the next script call's reply is lost once

    def teardown(self) -> None:
        # The module's server is its own: emptied after each example, so that the steps
        # that scan the queue's keys stay as quick in a long hunt as in the first example.
        self.app.redis.flushdb()
        self.app.close()

    def run(self, call: calls.ScriptCall[object]) -> object:
        if self.lose_next_reply:
            # DESIGN 5: a call that Redis applied and whose reply was lost can be re-sent
            # without applying twice. The reply is lost on the wire after the server ran
            # the call; the client sends it again; the model is that of one application.
            self.lose_next_reply = False
            with LoseReplies(b"EVALSHA\r\n") as lost:
                reply = self.app.scripts.run(call)
            assert lost.lost == 1
            return reply
        return self.app.scripts.run(call)

    @rule()
    def lose_the_next_reply(self) -> None:
        self.lose_next_reply = True

    # -- steps -----------------------------------------------------------------------------

    @initialize(cap=st.sampled_from([None, 1, 2, 4]), tenant_cap=st.sampled_from([None, 1, 2]),
                rate=st.sampled_from([None, 1, 3]), tenant_rate=st.sampled_from([None, 2]),
                streaming=st.sampled_from([True, True, False]))
    def start(self, cap: int | None, tenant_cap: int | None, rate: int | None,
              tenant_rate: int | None, streaming: bool) -> None:
        self.app.redis.sadd(f"{self.app.namespace}:queues", "q")
        if streaming:  # most runs check the events' trace ids from the first end on
            self.sink_reads()
        # Most runs start under some limits (a step may change or remove them later).
        self.set_limits(cap, tenant_cap, rate, tenant_rate)


    @rule(task=st.sampled_from(TASKS), priority=st.integers(0, 9),
          tenant=st.sampled_from(["", "t1", "t2"]), delay=st.sampled_from([0, 0, 500, 3000]),
          attempts=st.integers(1, 3), n=st.integers(1, 3),
          key=st.sampled_from(["", "", "k1", "k2"]), traced=st.booleans(),
          offer=st.sampled_from([0, 0, 1, 2, 3]))
    def enqueue(self, task: str, priority: int, tenant: str, delay: int, attempts: int,
                n: int, key: str, traced: bool, offer: int) -> None:
        if offer:  # an idle worker waits for this enqueue, offering that many slots
            self.register_waiter(offer)
        if key:
            n = 1  # a dedupe key names one job
        trace = f"{self.serial + 1:032x}" if traced else ""  # one per call, like a span's
        spec = calls.JobSpec(task, priority, tenant, float(delay) if delay else None, None,
                             attempts, key, VT, trace=trace)
        batch = []
        for _ in range(n):
            self.serial += 1
            batch.append((f"j{self.serial}", b"[[],{}]"))
        stored = self.run(calls.enqueue(self.k, spec, batch, self.limits, now=self.now))
        holder = self._holder(key) if key else None
        if holder is not None:
            assert stored == [(holder, False)], (stored, holder)
            return
        assert stored == [(short_id, True) for short_id, _ in batch]
        for i, (short_id, _) in enumerate(batch):
            self.traces[short_id] = trace
            self.jobs[short_id] = Model("scheduled" if delay else "ready", task, priority,
                                        attempts, tenant, due=self.now + delay, key=key,
                                        order=None if delay else self.serial - n + 1 + i)
        self._check_hand_off(0 if delay else len(batch))

    @rule(task=st.sampled_from(TASKS), priority=st.sampled_from([5, 5, 0, 7, 9]),
          attempts=st.integers(1, 3), traced=st.booleans())
    def enqueue_plain(self, task: str, priority: int, attempts: int, traced: bool) -> None:
        """A plain single enqueue (scripts/plain.py): one MULTI onto the inbox, no script,
        so no hand-off; the next claim takes it in enqueue order within its priority."""
        trace = f"{self.serial + 1:032x}" if traced else ""
        spec = calls.JobSpec(task, priority, "", None, None, attempts, "", VT, trace=trace)
        assert plain.fits(spec)
        self.serial += 1
        short_id = f"j{self.serial}"
        self.app.scripts.enqueue_plain(self.k, spec, self.limits, short_id, b"[[],{}]",
                                       now_ms=self.now)
        self.traces[short_id] = trace
        self.jobs[short_id] = Model("ready", task, priority, attempts, "", due=self.now,
                                    order=self.serial)

    def _check_hand_off(self, made_ready: int) -> None:
        """What the enqueue that made ``made_ready`` jobs ready handed to the waiter."""
        entries = self.app.redis.lrange(self.k.handoff(WORKER), 0, -1)
        self.app.redis.delete(self.k.handoff(WORKER))
        live = self.waiter is not None and self.waiter[1] > self.now
        if not live or self.paused or made_ready == 0:
            assert entries == []
            return
        assert self.waiter is not None
        ready = {i for i, j in self.jobs.items() if j.state == "ready"}
        expected = self._expected_leases(min(self.waiter[0], made_ready), ready)
        if expected == 0:
            assert entries == []  # the registration stays for a later enqueue
            return
        [entry] = entries
        self._take(calls.parse_handoff(entry).jobs, expected, ready)
        self.waiter = None  # a registration serves one enqueue

    @rule(slots=st.integers(1, 3))
    def register_waiter(self, slots: int) -> None:
        self.run(calls.register_waiter(self.k, WORKER, slots, WAITER_TTL, now=self.now))
        self.waiter = (slots, self.now + WAITER_TTL)

    @rule()
    def sink_reads(self) -> None:
        """A sink reads the queue: from now on every end is streamed (and stays so)."""
        stream_events(self.app, "q")
        self.streaming = True

    @rule(ms=st.sampled_from([10, 400, 1100, 3500]))
    def advance_time(self, ms: int) -> None:
        self.now += ms

    @rule(repair=st.booleans())
    def overwrite_bookkeeping(self, repair: bool) -> None:
        """A hand edit writes a string over the queue's wake key and the metric buckets of
        now and the next minute (or the edit is repaired): every step goes on as the model
        says, passing over the bookkeeping it cannot write."""
        if repair:
            if self.overwritten:
                self.app.redis.delete(*self.overwritten)
            self.overwritten = []
            return
        width = self.limits.bucket_seconds
        start = int(self.now / 1000 // width * width)
        self.overwritten = [self.k.wake, *(f"{self.k.metrics_prefix}{start + i * width}"
                                          for i in range(60 // width + 1))]
        for key in self.overwritten:
            self.app.redis.set(key, "written over by hand")

    @rule(data=st.data(), call=st.sampled_from(["fetch", "finish"]))
    def refused_by_a_key_of_the_wrong_type(self, data: st.DataObject, call: str) -> None:
        """A hand edit writes over one of the queue's fixed keys: a fetch or a finish
        refuses, naming it, and changes nothing (every key of the queue as it was); with the
        key put back, the steps go on as the model says."""
        active = self._active()
        if call == "finish" and not active:
            call = "fetch"
        name = data.draw(st.sampled_from(FETCH_CHECKS if call == "fetch" else FINISH_CHECKS))
        key = getattr(self.k, name)
        redis = self.app.redis
        saved, ttl = redis.dump(key), redis.pttl(key)
        redis.delete(key)
        if name == "seq":
            redis.hset(key, "by", "hand")
        else:
            redis.set(key, "written over by hand")
        before = self._queue_keys()
        if call == "fetch":
            attempt: calls.ScriptCall[object] = calls.fetch(  # type: ignore[assignment]
                self.k, 4, self.limits, now=self.now, worker=WORKER, waiter_ttl_ms=WAITER_TTL)
        else:
            short_id = data.draw(st.sampled_from(active))
            outcome = calls.Outcome(short_id, self.jobs[short_id].tokens[-1], "ok",
                                    self.now / 1000, b"1")
            attempt = calls.finish(self.k, [outcome], self.limits,  # type: ignore[assignment]
                                   now=self.now)
        with pytest.raises(ResponseError, match=f"{call}: key .* holds a"):
            self.run(attempt)
        assert self._queue_keys() == before, f"a refused {call} changed the queue's keys"
        redis.delete(key)
        if saved is not None:
            redis.restore(key, max(ttl, 0), saved)

    def _queue_keys(self) -> dict[bytes, bytes | None]:
        """Every key of the queue, serialized."""
        tag = self.k.leases.split("}")[0] + "}"
        return {key: self.app.redis.dump(key) for key in self.app.redis.scan_iter(f"{tag}*")}

    @rule(cap=st.sampled_from([None, None, 1, 2, 4]),
          tenant_cap=st.sampled_from([None, None, 1, 2]),
          rate=st.sampled_from([None, None, 1, 3]), tenant_rate=st.sampled_from([None, None, 2]))
    def set_limits(self, cap: int | None, tenant_cap: int | None, rate: int | None,
                   tenant_rate: int | None) -> None:
        changes = [(name, "" if value is None else str(value)) for name, value in
                   (("concurrency", cap), ("tenant_concurrency", tenant_cap), ("rate", rate),
                    ("tenant_rate", tenant_rate))]
        self.run(calls.set_limits(self.k, changes))
        self.cap, self.tenant_cap = cap, tenant_cap
        self.rate = None if rate is None else float(rate)
        self.tenant_rate = None if tenant_rate is None else float(tenant_rate)
        if (cap, tenant_cap, rate, tenant_rate) == (None, None, None, None):
            self.buckets.clear()  # no limit left: the buckets go too

    def _tokens(self, bucket: str, rate: float) -> float:
        """As flow.lua's bucket_tokens: an absent bucket is full (one second's worth)."""
        size = max(rate, 1.0)
        if bucket not in self.buckets:
            return size
        tokens, at = self.buckets[bucket]
        return min(size, tokens + max(0.0, self.now - at) * rate / 1000)

    def _allowance(self, tenant: str) -> float:
        """Jobs ``tenant`` may still start under its cap and rate (no tenant: no limit)."""
        if not tenant:
            return math.inf
        room = math.inf
        if self.tenant_cap is not None:
            running = sum(1 for j in self.jobs.values()
                          if j.state == "active" and j.tenant == tenant)
            room = max(0, self.tenant_cap - running)
        if self.tenant_rate is not None:
            room = min(room, math.floor(self._tokens(tenant, self.tenant_rate) + 1e-9))
        return room

    def _consume(self, leased: list[str]) -> None:
        """Take the tokens the leases used, as the claim stores them."""
        if self.rate is not None and leased:
            left = self._tokens("", self.rate) - len(leased)
            self.buckets[""] = (float(f"{left:.6f}"), float(f"{self.now:.3f}"))
        if self.tenant_rate is None:
            return
        per: dict[str, int] = {}
        for short_id in leased:
            if self.jobs[short_id].tenant:
                per[self.jobs[short_id].tenant] = per.get(self.jobs[short_id].tenant, 0) + 1
        for tenant, n in per.items():
            left = self._tokens(tenant, self.tenant_rate) - n
            self.buckets[tenant] = (float(f"{left:.6f}"), float(f"{self.now:.3f}"))

    def _expected_leases(self, count: int, ready: set[str]) -> int:
        room: float = count
        if self.cap is not None:
            active = sum(1 for j in self.jobs.values() if j.state == "active")
            room = min(room, max(0, self.cap - active))
        if self.rate is not None:
            room = min(room, math.floor(self._tokens("", self.rate) + 1e-9))
        by_tenant: dict[str, int] = {}
        for short_id in ready:
            by_tenant[self.jobs[short_id].tenant] = by_tenant.get(self.jobs[short_id].tenant, 0) + 1
        eligible = sum(min(n, self._allowance(t)) for t, n in by_tenant.items())
        return int(min(room, eligible))

    @rule(count=st.integers(1, 4), as_waiter=st.booleans())
    def fetch(self, count: int, as_waiter: bool) -> None:
        self._reclaim_and_promote()
        ready = {i for i, j in self.jobs.items() if j.state == "ready"}
        expected = self._expected_leases(count, ready)
        fetched = self.run(calls.fetch(self.k, count, self.limits, now=self.now,
                                       worker=WORKER if as_waiter else "",
                                       waiter_ttl_ms=WAITER_TTL if as_waiter else 0))
        assert isinstance(fetched, calls.Fetched)
        if as_waiter:  # the fetch offers the slots it left free, or takes the offer back
            left = count - len(fetched.jobs)
            self.waiter = (left, self.now + WAITER_TTL) if left > 0 else None
        if self.paused:
            assert fetched.jobs == [], "a paused queue handed out a job"
            return
        self._take(fetched.jobs, expected, ready)

    def _take(self, jobs: list[calls.Leased], expected: int, ready: set[str]) -> None:
        """Check leases handed out (by a fetch or a hand-off) and apply them to the model."""
        leased = [job.short_id for job in jobs]
        assert len(leased) == expected, (leased, ready, self.cap, self.tenant_cap)
        assert set(leased) <= ready
        # Higher priorities first, among the jobs a cap did not hold back.
        rest = {i for i in ready - set(leased)
                if self._allowance(self.jobs[i].tenant) - sum(
                    1 for j in leased if self.jobs[j].tenant == self.jobs[i].tenant) > 0}
        if leased and rest:
            assert min(self.jobs[i].priority for i in leased) >= max(
                self.jobs[i].priority for i in rest)
        # First in, first out within a priority and tenant, among the jobs that wait since
        # their enqueue (one that waited elsewhere first goes ahead of them).
        for level in {(self.jobs[i].priority, self.jobs[i].tenant) for i in leased}:
            def orders(ids: Iterable[str], level: tuple[int, str] = level) -> list[int]:
                return [o for i in ids if (self.jobs[i].priority, self.jobs[i].tenant) == level
                        and (o := self.jobs[i].order) is not None]
            taken, left = orders(leased), orders(ready - set(leased))
            if taken and left:
                assert max(taken) < min(left), ("FIFO within a level", level, taken, left)
        self._consume(leased)
        for job in jobs:
            model = self.jobs[job.short_id]
            model.order = None
            assert job.token not in model.tokens, "a fencing token was handed out twice"
            model.state, model.lease, model.began = "active", self.now + VT, False
            model.attempts += 1
            model.tokens.append(job.token)
            assert job.attempts == model.attempts
            assert job.confirm == (model.unstarted > 0), "a run that must tell its start"

    def _reclaim_and_promote(self) -> None:
        for short_id, model in self.jobs.items():
            expired = model.state == "active" and model.lease <= self.now
            if expired and not model.began:  # the attempt is given back
                model.attempts -= 1
                model.unstarted += 1
            if expired and model.cancel:
                self._set(short_id, "cancelled")  # its holder never learned of the cancel
            elif expired and not model.began:
                self._set(short_id, "ready")
            elif expired:
                self._set(short_id, "dead" if model.attempts >= model.max_attempts else "ready")
            elif model.state in ("scheduled", "retrying") and model.due <= self.now \
                    and not model.waiting:
                model.state = "ready"

    def _active(self) -> list[str]:
        return sorted(i for i, j in self.jobs.items() if j.state == "active" and j.lease > self.now)

    @precondition(lambda self: self._active())
    @rule(data=st.data(), outcome=st.sampled_from(["ok", "retry", "dead", "snooze"]),
          stale=st.booleans(), retry_ms=st.sampled_from([0, 700]))
    def finish(self, data: st.DataObject, outcome: str, stale: bool, retry_ms: int) -> None:
        self._finish(data.draw(st.sampled_from(self._active())), outcome, stale, retry_ms)

    @rule(data=st.data(), count=st.integers(1, 3))
    def run_and_finish(self, data: st.DataObject, count: int) -> None:
        """A worker's usual round: a fetch, then an outcome for every job it leased (so that
        runs end, and jobs reach the dead letters, in most examples, not a few)."""
        before = set(self._active())
        self.fetch(count, as_waiter=False)
        for short_id in sorted(set(self._active()) - before):
            self._finish(short_id, data.draw(st.sampled_from(["ok", "retry", "dead", "dead"])),
                         False, data.draw(st.sampled_from([0, 700])))

    def _finish(self, short_id: str, outcome: str, stale: bool, retry_ms: int) -> None:
        model = self.jobs[short_id]
        token = model.tokens[-1]
        if stale:
            token = model.tokens[0] if len(model.tokens) > 1 else token + "x"
        result = self.run(calls.finish(self.k, [calls.Outcome(
            short_id, token, outcome, self.now / 1000, b"1", retry_ms)], self.limits,
            now=self.now))
        assert isinstance(result, calls.Finished)
        if token != model.tokens[-1]:
            assert result.codes == [calls.FINISH_REFUSED]
            return
        spent = outcome == "retry" and model.attempts >= model.max_attempts
        snoozed_out = outcome == "snooze" and model.snoozes >= SNOOZE_CAP
        if model.cancel:
            outcome = "cancelled"  # whatever a cancelled run reports
        elif spent or snoozed_out:
            outcome = "dead"
        elif outcome == "snooze":
            model.snoozes += 1
            model.attempts -= 1
        self._set(short_id, {"ok": "succeeded", "retry": "retrying", "dead": "dead",
                             "snooze": "scheduled", "cancelled": "cancelled"}[outcome])
        model.due = self.now + retry_ms
        expected = {"succeeded": calls.FINISH_SUCCEEDED, "retrying": calls.FINISH_RETRYING,
                    "dead": calls.FINISH_DEAD, "scheduled": calls.FINISH_SNOOZED,
                    "cancelled": calls.FINISH_CANCELLED}[model.state]
        assert result.codes == [expected]

    @precondition(lambda self: self._active())
    @rule(data=st.data(), stale=st.booleans(), fraction=st.sampled_from([0.0, 0.5, 1.0]))
    def progress(self, data: st.DataObject, stale: bool, fraction: float) -> None:
        short_id = data.draw(st.sampled_from(self._active()))
        model = self.jobs[short_id]
        token = model.tokens[-1] + ("x" if stale else "")
        codes = self.run(calls.progress(self.k, [(short_id, token, fraction, "n")]))
        accepted = not stale and not model.cancel
        assert codes == [int(accepted)]
        if accepted:
            model.progress = fraction

    @precondition(lambda self: self._active())
    @rule(data=st.data(), stale=st.booleans(), name=st.sampled_from(["s1", "s2"]))
    def step(self, data: st.DataObject, stale: bool, name: str) -> None:
        short_id = data.draw(st.sampled_from(self._active()))
        model = self.jobs[short_id]
        token = model.tokens[-1] + ("x" if stale else "")
        code, _ = self.run(calls.step(self.k, short_id, token, name, b"1"))  # type: ignore[misc]
        if stale:
            assert code == calls.STEP_REFUSED
        elif model.cancel:
            assert code == calls.STEP_CANCELLING
        elif name in model.steps:
            assert code == calls.STEP_KEPT
        else:
            assert code == calls.STEP_RECORDED
            model.steps.add(name)

    @precondition(lambda self: self._active())
    @rule(data=st.data(), stale=st.booleans(), began=st.booleans())
    def heartbeat(self, data: st.DataObject, stale: bool, began: bool) -> None:
        """A holder's heartbeat, also telling that the lease's run began."""
        short_id = data.draw(st.sampled_from(self._active()))
        model = self.jobs[short_id]
        token = model.tokens[-1] + ("x" if stale else "")
        codes = self.run(calls.heartbeat(self.k, [(short_id, token, VT, began)], now=self.now))
        assert codes == [0 if stale else (calls.BEAT_CANCEL if model.cancel else 1)]
        if not stale:
            model.lease = self.now + VT
            model.began = model.began or began

    @precondition(lambda self: self._active())
    @rule(data=st.data(), interrupted=st.booleans())
    def release(self, data: st.DataObject, interrupted: bool) -> None:
        short_id = data.draw(st.sampled_from(self._active()))
        model = self.jobs[short_id]
        job = (short_id, model.tokens[-1], "interrupted: test" if interrupted else "")
        if model.cancel:  # not handed back: it ends cancelled when its lease expires
            assert self.run(calls.release(self.k, [job])) == 0
            return
        assert self.run(calls.release(self.k, [job])) == 1
        model.state, model.attempts = "ready", model.attempts - 1

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        short_id = data.draw(st.sampled_from(sorted(self.jobs)))
        model = self.jobs[short_id]
        before = self.run(calls.cancel(self.k, short_id, self.limits, now=self.now))
        assert before == model.state
        if model.state in ("scheduled", "retrying", "ready"):
            self._set(short_id, "cancelled")
        elif model.state == "active":
            model.cancel = True

    @precondition(lambda self: any(j.state == "dead" for j in self.jobs.values()))
    @rule()
    def requeue_dead(self) -> None:
        """Dead jobs, oldest first, get fresh attempts; a keyed one is unfinished again, so
        it holds its key, and stays dead when another unfinished job holds it (DESIGN §2:
        one unfinished job per key)."""
        dead = sorted((j.dead_at, i) for i, j in self.jobs.items() if j.state == "dead")
        requeued = 0
        for _, short_id in dead:
            model = self.jobs[short_id]
            if model.key and self._holder(model.key) is not None:
                continue
            model.state, model.attempts = "ready", 0
            requeued += 1
        assert self.run(calls.requeue_dead(self.k, [])) == requeued

    @precondition(lambda self: any(j.state == "dead" for j in self.jobs.values()))
    @rule()
    def purge_dead(self) -> None:
        dead = [i for i, j in self.jobs.items() if j.state == "dead"]
        assert self.run(calls.purge_dead(self.k)) == len(dead)
        for short_id in dead:
            del self.jobs[short_id]

    def _holder(self, key: str) -> str | None:
        """The job an enqueue with dedupe ``key`` returns (DESIGN §2): the unfinished job
        enqueued with it, if any. Never two: the invariant checks it."""
        return next((i for i, j in self.jobs.items() if j.key == key and j.state in UNFINISHED),
                    None)

    def _set(self, short_id: str, state: str) -> None:
        """Move a job to ``state``."""
        model = self.jobs[short_id]
        model.state = state
        if state == "dead":
            model.dead_at = self.now
        if state in FINAL and model.node:
            model.waiting = False
            self.pending.append(short_id)

    # -- workflows -------------------------------------------------------------------------

    @rule(data=st.data(), n=st.integers(1, 4))
    def enqueue_workflow(self, data: st.DataObject, n: int) -> None:
        shorts = []
        for _ in range(n):
            self.serial += 1
            shorts.append(f"j{self.serial}")
        parents = [[p for p in shorts[:i] if data.draw(st.booleans())] for i in range(n)]
        run_if = [data.draw(st.sampled_from(["succeeded", "finished"])) for _ in range(n)]
        task = data.draw(st.sampled_from(TASKS))
        spec = calls.JobSpec(task, 5, "", None, None, 2, "", VT)
        enc = msgspec.json.encode
        nodes = [calls.NodeSpec(
            s, spec, b"[[],{}]", s, len(parents[i]), run_if[i],
            enc([[p, f"q~{p}"] for p in parents[i]]) if parents[i] else b"",
            enc([f"q~{c}" for j, c in enumerate(shorts) if s in parents[j]]) or b"",
        ) for i, s in enumerate(shorts)]
        home = calls.WorkflowHome(f"w{self.serial}", b"[]", n)
        stored = self.run(calls.workflow_enqueue(self.k, f"q~w{self.serial}", nodes,
                                                 self.limits, home=home, total=n, now=self.now))
        assert stored == n
        for i, s in enumerate(shorts):
            self.jobs[s] = Model("scheduled" if parents[i] else "ready", task, 5, 2, node=True,
                                 waiting=bool(parents[i]), parents=parents[i],
                                 children=[c for j, c in enumerate(shorts) if s in parents[j]],
                                 run_if=run_if[i])

    @rule()
    def hand_over(self) -> None:
        """A drainer empties the outbox (cancellations cascade through it)."""
        drain_sync(self.app, ["q"])
        while self.pending:
            batch, self.pending = self.pending, []
            for short_id in batch:
                parent = self.jobs.get(short_id)
                if parent is None or parent.state not in FINAL:
                    continue  # gone, or requeued from the dead letters: nothing to tell
                for child_id in parent.children:
                    self._tell(child_id, short_id, parent.state == "succeeded")

    def _tell(self, child_id: str, parent_id: str, succeeded: bool) -> None:
        child = self.jobs.get(child_id)
        if child is None or not child.waiting or parent_id in child.recorded:
            return
        child.recorded[parent_id] = succeeded
        if not succeeded and child.run_if == "succeeded":
            self._set(child_id, "cancelled")
        elif len(child.recorded) == len(child.parents):
            child.waiting, child.state = False, "ready"

    @precondition(lambda self: any(j.node and j.recorded for j in self.jobs.values()))
    @rule(data=st.data())
    def repeat_hand_over(self, data: st.DataObject) -> None:
        """A hand-over done already, sent again (a second drainer, a restarted worker)."""
        told = sorted((c, p) for c, j in self.jobs.items() for p in j.recorded)
        child_id, parent_id = data.draw(st.sampled_from(told))
        reply = self.run(calls.workflow_release(
            self.k, [(child_id, f"q~{parent_id}", "")], self.limits, now=self.now))
        assert reply == (0, 0)

    @rule()
    def pause(self) -> None:
        self.app.pause("q")
        self.paused = True

    @rule()
    def resume(self) -> None:
        self.app.resume("q")
        self.paused = False

    @precondition(lambda self: any(j.state in FINAL for j in self.jobs.values()))
    @rule(data=st.data())
    def expire_record(self, data: st.DataObject) -> None:
        """A record whose TTL runs out is gone: only records that carry one may go."""
        finished = sorted(i for i, j in self.jobs.items() if j.state in FINAL)
        short_id = data.draw(st.sampled_from(finished))
        ttl = self.app.redis.pttl(self.k.job(short_id))
        if self.jobs[short_id].state == "dead":
            assert ttl == -1, "a dead letter's record must not expire"
        if ttl > 0:
            self.app.redis.delete(self.k.job(short_id))
            del self.jobs[short_id]

    # -- comparison ------------------------------------------------------------------------

    @invariant()
    def redis_matches_the_model(self) -> None:
        redis = self.app.redis
        with redis.pipeline(transaction=False) as pipe:
            for short_id in self.jobs:
                pipe.hmget(self.k.job(short_id), "s", "attempts", "progress", "tr",
                           "step:s1", "step:s2")
            records = pipe.execute()
        for (short_id, model), record in zip(self.jobs.items(), records, strict=True):
            state, attempts, progress, trace, *steps = record
            assert (trace or b"").decode() == self.traces.get(short_id, ""), short_id
            assert (state or b"").decode() == model.state, (short_id, model)
            assert int(attempts or 0) == model.attempts, (short_id, model)
            assert (None if progress is None else float(progress)) == model.progress
            assert {n for n, v in zip(("s1", "s2"), steps, strict=True) if v} == model.steps
        by_state: dict[str, set[str]] = {}
        for short_id, model in self.jobs.items():
            by_state.setdefault(model.state, set()).add(short_id)
        members = {name: {m.decode() for m in redis.zrange(key, 0, -1)} for name, key in
                   (("leases", self.k.leases), ("delayed", self.k.delayed),
                    ("dead", self.k.dead))}
        assert members["leases"] == by_state.get("active", set())
        waiting = {i for i, j in self.jobs.items() if j.waiting}
        assert members["delayed"] == (by_state.get("scheduled", set()) - waiting) | by_state.get(
            "retrying", set())
        outbox = sorted(m.decode().split(" ")[0] for m in redis.lrange(self.k.handover, 0, -1))
        assert outbox == sorted(self.pending)
        for short_id in waiting:
            recorded = {f.decode().split("~")[1] for f in redis.hkeys(self.k.waiting(short_id))}
            assert recorded == set(self.jobs[short_id].recorded), short_id
        assert members["dead"] == by_state.get("dead", set())
        offer = redis.hget(self.k.waiter_offers, WORKER)
        score = redis.zscore(self.k.waiters, WORKER)
        if self.waiter is None:
            assert offer is None and score is None
        else:
            assert offer is not None and int(offer.split(b":")[0]) == self.waiter[0]
            assert score == self.waiter[1]
        # No event before a sink has read the queue; then every finished job's event
        # carries the trace id its enqueue call was given.
        if not self.streaming:
            assert redis.xlen(self.k.events) == 0
        for _, event in redis.xrange(self.k.events):
            short_id = event[b"id"].decode()
            assert event.get(b"trace", b"").decode() == self.traces.get(short_id, ""), short_id
        assert int(redis.hget(self.k.counts, "ready") or 0) == len(by_state.get("ready", ()))
        # One unfinished job per dedupe key, and the key names it (none: the key is free).
        for key in ("k1", "k2"):
            unfinished = [i for i, j in self.jobs.items()
                          if j.key == key and j.state in UNFINISHED]
            assert len(unfinished) <= 1, ("two unfinished jobs share a key", key, unfinished)
            holder = redis.get(self.k.dedupe_prefix + key)
            assert (holder.decode() if holder else None) == self._holder(key), key
        active = {k.decode(): int(v) for k, v in redis.hgetall(self.k.active).items()}
        for task in TASKS:
            running = sum(1 for j in self.jobs.values() if j.state == "active" and j.task == task)
            assert active.get(task, 0) == running, (task, active)
        # The limits' running counts equal the jobs held, the queue's and each tenant's.
        held = by_state.get("active", set())
        assert int(redis.hget(self.k.counts, "running") or 0) == len(held)
        per_tenant: dict[str, int] = {}
        for short_id in held:
            if self.jobs[short_id].tenant:
                per_tenant[self.jobs[short_id].tenant] = per_tenant.get(
                    self.jobs[short_id].tenant, 0) + 1
        stored = {k.decode(): int(v) for k, v in redis.hgetall(self.k.running).items()}
        assert stored == per_tenant


QueueMachine.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_queue_matches_its_model = QueueMachine.TestCase
