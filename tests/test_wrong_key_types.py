"""A queue key written over by hand leaves no call half applied (scripts/include/key_types.lua).

A script that meets a key of the wrong type stops there, and Redis keeps what it wrote
before. Each test writes a string over one of a queue's fixed keys, makes the call, and
compares every key of the queue with what it held before: a fetch, a finish and a release
(a stopping worker handing its jobs back) refuse, naming the key, having changed nothing,
and work again once the key is put back; an enqueue that would hand its job to an idle
worker stores it once and wakes a worker instead. Keys named per job and per tenant (a
job's record, a tenant's ready list, the inbox) are set aside instead, and the call goes
on for every other job it meets.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import conveyor
from conveyor.scripts import calls
from conveyor.worker.handoff import WAITER_TTL_MS
from helpers import running_worker, wait_until

Q = "q"
MANGLED = "written over by hand"


def _write_over(app: conveyor.Conveyor, key: str) -> None:
    """Write a value of another type over ``key``: a hash where the token counter (a
    string) belongs, a string anywhere else."""
    app.redis.delete(key)
    if key.endswith(":seq"):
        app.redis.hset(key, "by", "hand")
    else:
        app.redis.set(key, MANGLED)


def _enqueue(app: conveyor.Conveyor, *ids: str, **options: object) -> None:
    spec = calls.JobSpec(task="t", **options)  # type: ignore[arg-type]
    app.scripts.run(calls.enqueue(app.keys(Q), spec, [(s, b"[[],{}]") for s in ids],
                                  app.limits))


def _snapshot(app: conveyor.Conveyor) -> dict[bytes, bytes | None]:
    """Every key of the queue, serialized."""
    tag = app.keys(Q).leases.split("}")[0] + "}"
    return {key: app.redis.dump(key) for key in app.redis.scan_iter(match=f"{tag}*")}


@contextlib.contextmanager
def _written_over(app: conveyor.Conveyor, key: str) -> Iterator[None]:
    """``key`` written over (:func:`_write_over`) for the block, then put back."""
    saved = app.redis.dump(key)
    _write_over(app, key)
    try:
        yield
    finally:
        app.redis.delete(key)
        if saved is not None:
            app.redis.restore(key, 0, saved)


def _refused(app: conveyor.Conveyor, call: calls.ScriptCall[Any], error: str) -> None:
    """``call`` raises an error matching ``error`` and leaves every key as it was."""
    before = _snapshot(app)
    with pytest.raises(redis.ResponseError, match=error):
        app.scripts.run(call)
    assert _snapshot(app) == before


def _busy_queue(app: conveyor.Conveyor) -> list[calls.Leased]:
    """A queue with every kind of work a fetch does: ready jobs, a delayed job now due, a
    lease that has lapsed; returns the jobs of one lease still held."""
    k = app.keys(Q)
    _enqueue(app, "held1", "held2")
    held = app.scripts.run(calls.fetch(k, 2, app.limits)).jobs
    _enqueue(app, "lapsed")
    now = float(app.redis.time()[0]) * 1000
    app.scripts.run(calls.fetch(k, 1, app.limits, now=now - 60_000))  # lease long over
    _enqueue(app, "r1", "r2", "r3")
    _enqueue(app, "due", delay_ms=1)
    time.sleep(0.01)
    return held


FETCH_KEYS = ("priorities", "delayed", "leases", "dead", "counts", "active", "seq",
              "events", "limits", "buckets", "running", "parked")


@pytest.mark.parametrize("name", FETCH_KEYS)
def test_a_fetch_meeting_a_key_of_the_wrong_type_changes_nothing(
    app: conveyor.Conveyor, name: str,
) -> None:
    k = app.keys(Q)
    _busy_queue(app)
    with _written_over(app, getattr(k, name)):
        _refused(app, calls.fetch(k, 10, app.limits, worker="w", waiter_ttl_ms=2000),
                 f"fetch: key .*{name}.* holds a (string|hash)")
    # Put back, the key serves again: the ready, due and reclaimed jobs are leased.
    fetched = app.scripts.run(calls.fetch(k, 10, app.limits))
    assert {j.short_id for j in fetched.jobs} == {"r1", "r2", "r3", "due", "lapsed"}


def test_a_fetch_meeting_a_token_counter_that_is_no_integer_changes_nothing(
    app: conveyor.Conveyor,
) -> None:
    k = app.keys(Q)
    _busy_queue(app)
    app.redis.set(k.seq, "twelve")
    _refused(app, calls.fetch(k, 10, app.limits), "'twelve', not an integer")


FINISH_KEYS = ("leases", "delayed", "dead", "active", "idle", "events", "counts", "running",
               "parked", "limits", "priorities", "handover")


@pytest.mark.parametrize("name", FINISH_KEYS)
def test_a_finish_meeting_a_key_of_the_wrong_type_changes_nothing(
    app: conveyor.Conveyor, name: str,
) -> None:
    k = app.keys(Q)
    held = _busy_queue(app)
    now = time.time()
    outcomes = [calls.Outcome(held[0].short_id, held[0].token, "ok", now),
                calls.Outcome(held[1].short_id, held[1].token, "retry", now, b"boom", 10)]
    with _written_over(app, getattr(k, name)):
        _refused(app, calls.finish(k, outcomes, app.limits),
                 f"finish: key .*{name}.* holds a string")
    done = app.scripts.run(calls.finish(k, outcomes, app.limits))
    assert done.codes == [calls.FINISH_SUCCEEDED, calls.FINISH_RETRYING]


HANDOFF_KEYS = ("leases", "dead", "active", "seq", "events", "limits", "buckets", "running",
                "parked", "handoff", "waiter_offers", "seq_text")


@pytest.mark.parametrize("name", HANDOFF_KEYS)
def test_an_enqueue_that_cannot_hand_its_job_over_stores_it_once_and_wakes_a_worker(
    app: conveyor.Conveyor, name: str,
) -> None:
    """The hand-off comes after the jobs are stored: were it to fail, the enqueue would
    fail with its job stored, and its caller would store it again."""
    k = app.keys(Q)
    app.scripts.run(calls.register_waiter(k, "w1", 4, WAITER_TTL_MS))
    key = {"handoff": k.handoff("w1"), "seq_text": k.seq}.get(name) or getattr(k, name)
    if name == "seq_text":
        app.redis.set(key, "twelve")  # a string, as the counter is, but no integer
    else:
        _write_over(app, key)
    mangled = app.redis.dump(key)
    _enqueue(app, "a", "b")
    assert app.redis.dump(key) == mangled  # passed over, not written
    assert app.redis.exists(k.handoff("w1")) == (name == "handoff")
    assert app.redis.hget(k.job("a"), "s") == b"ready"
    assert app.redis.hget(k.counts, "ready") == b"2"
    assert app.redis.llen(k.wake) == 1  # a worker is woken for them instead
    app.redis.delete(key)
    fetched = app.scripts.run(calls.fetch(k, 10, app.limits))
    assert [j.short_id for j in fetched.jobs] == ["a", "b"]  # each once


RELEASE_KEYS = ("priorities", "leases", "counts", "active", "running", "parked", "limits")


@pytest.mark.parametrize("name", RELEASE_KEYS)
def test_a_release_meeting_a_key_of_the_wrong_type_changes_nothing(
    app: conveyor.Conveyor, name: str,
) -> None:
    k = app.keys(Q)
    held = _busy_queue(app)
    leases = [(j.short_id, j.token, "stopping") for j in held]
    with _written_over(app, getattr(k, name)):
        _refused(app, calls.release(k, leases), f"release: key .*{name}.* holds a string")
    assert app.scripts.run(calls.release(k, leases)) == 2


# -- counts that are no integer ------------------------------------------------------------


def test_a_ready_count_that_is_no_integer_starts_again_from_zero(app: conveyor.Conveyor) -> None:
    """HINCRBY refuses a field that is no integer: the enqueue would fail (and every one
    after it), a fetch after its first leases."""
    k = app.keys(Q)
    app.redis.hset(k.counts, "ready", "many")
    _enqueue(app, "a", "b")
    assert app.redis.hget(k.counts, "ready") == b"2"
    app.redis.hset(k.counts, "ready", "many")
    fetched = app.scripts.run(calls.fetch(k, 10, app.limits))
    assert [j.short_id for j in fetched.jobs] == ["a", "b"]
    assert app.redis.hget(k.counts, "ready") == b"0"  # from 0, and never below it
    assert app.redis.zcard(k.leases) == 2


def test_an_active_count_that_is_no_integer_is_recounted(app: conveyor.Conveyor) -> None:
    k = app.keys(Q)
    _enqueue(app, "a", "b")
    app.redis.hset(k.active, "t", "busy")
    fetched = app.scripts.run(calls.fetch(k, 10, app.limits))
    assert app.redis.hget(k.active, "t") == b"2"
    app.redis.hset(k.active, "t", "busy")
    now = time.time()
    done = app.scripts.run(calls.finish(
        k, [calls.Outcome(j.short_id, j.token, "ok", now) for j in fetched.jobs], app.limits))
    assert done.codes == [calls.FINISH_SUCCEEDED] * 2
    assert int(app.redis.hget(k.active, "t")) == 0


def test_a_record_count_that_is_no_integer_fails_neither_a_snooze_nor_a_release(
    app: conveyor.Conveyor,
) -> None:
    """A record's snooze and interruption counts: a mangled one would stop a finish or a
    release after the outcomes before it in the batch."""
    k = app.keys(Q)
    _enqueue(app, "a", "b", "c")
    a, b, c = app.scripts.run(calls.fetch(k, 3, app.limits)).jobs
    app.redis.hset(k.job("b"), "snoozes", "lots")
    now = time.time()
    done = app.scripts.run(calls.finish(k, [calls.Outcome("a", a.token, "ok", now),
                                            calls.Outcome("b", b.token, "snooze", now, b"", 50)],
                                        app.limits))
    assert done.codes == [calls.FINISH_SUCCEEDED, calls.FINISH_SNOOZED]
    assert app.redis.hget(k.job("b"), "snoozes") == b"1"
    app.redis.hset(k.job("c"), "interruptions", "some")
    assert app.scripts.run(calls.release(k, [("c", c.token, "stopping")])) == 1
    assert app.redis.hget(k.job("c"), "interruptions") == b"1"
    assert app.redis.hget(k.job("c"), "s") == b"ready"


@pytest.mark.parametrize("name", ["waiters", "waiter_offers"])
def test_a_registration_meeting_a_key_of_the_wrong_type_registers_nobody(
    app: conveyor.Conveyor, name: str,
) -> None:
    """An idle worker registers before each wait: were a mangled key to fail it, the worker
    would never wait for its wake-ups."""
    k = app.keys(Q)
    key = getattr(k, name)
    _write_over(app, key)
    app.scripts.run(calls.register_waiter(k, "w1", 4, WAITER_TTL_MS))
    assert app.redis.get(key) == MANGLED.encode()
    _enqueue(app, "a")  # not handed over: woken for
    assert app.redis.exists(k.handoff("w1")) == 0
    assert app.redis.llen(k.wake) == 1


@pytest.mark.parametrize("name", ["priorities", "delayed", "counts", "handover"])
def test_a_workflow_meeting_a_key_of_the_wrong_type_is_stored_whole_or_not_at_all(
    app: conveyor.Conveyor, name: str,
) -> None:
    @app.task(name="wf.step", queue=Q)
    def step(x: int) -> int:
        return x

    def two_steps() -> conveyor.Workflow:
        wf = app.workflow()
        first = wf.add(step, 1, name="first")
        wf.add(step, 2, name="second", after=[first])
        return wf

    k = app.keys(Q)
    with _written_over(app, getattr(k, name)):
        before = _snapshot(app)
        with pytest.raises(redis.ResponseError,
                           match=f"workflow_enqueue: key .*{name}.* holds a"):
            two_steps().enqueue()
        assert _snapshot(app) == before
    two_steps().enqueue()
    fetched = app.scripts.run(calls.fetch(k, 10, app.limits))
    assert [j.task for j in fetched.jobs] == ["wf.step"]  # the first; the second waits


# -- a worker ------------------------------------------------------------------------------


def test_a_worker_names_a_key_written_over_and_serves_its_other_queues(
    app: conveyor.Conveyor, caplog: pytest.LogCaptureFixture,
) -> None:
    """One queue's wake key and delayed set written over: the worker's wait for markers
    and its look for work meet them, name both keys (Redis's own error names none), and go
    on serving the other queue at full speed, and the first once the keys are put back."""
    @app.task(name="wk.double", queue="other")
    def double(x: int) -> int:
        return 2 * x

    @app.task(name="wk.triple", queue="mangled")
    def triple(x: int) -> int:
        return 3 * x

    mangled = app.keys("mangled")
    caplog.set_level("WARNING", logger="conveyor.worker")
    with running_worker(app, queues=["mangled", "other"], concurrency=2):
        with _written_over(app, mangled.wake), _written_over(app, mangled.delayed):
            assert double.enqueue(21).result(timeout=10) == 42
            named = (f"key {mangled.wake} holds a string where a list belongs: written over",
                     f"key {mangled.delayed} holds a string where a zset belongs: written")
            wait_until(lambda: all(text in caplog.text for text in named), 10,
                       message="the wake listener naming both keys")
            # The wake key is left out of its wait, so the listener waits on for the other
            # queue's wake-ups (it used to fail every wait and retry after a back-off
            # growing to 5 s, the other queue's jobs waiting as long).
            for x in range(3):
                began = time.monotonic()
                assert double.enqueue(x).result(timeout=10) == 2 * x
                assert time.monotonic() - began < 2.0
            assert "wake listener: ResponseError" not in caplog.text
            stuck = triple.enqueue(1)  # run, or leased, or not: its outcome is refused
        # Put back: the job enqueued meanwhile ends (its outcome recorded, or it is found).
        assert stuck.result(timeout=20) == 3


def test_a_queue_whose_lease_set_is_written_over_holds_back_no_other_queue(
    app: conveyor.Conveyor,
) -> None:
    """While one queue's lease set is written over, its heartbeats and finishes are
    refused; the other queue's must go on: its job's short lease is extended (one attempt,
    never taken over) and its outcome is recorded."""

    @app.task(name="wk.slow", queue="other", visibility_timeout=0.6)
    async def slow() -> str:
        await asyncio.sleep(2.0)
        return "ok"

    @app.task(name="wk.brief", queue="mangled", visibility_timeout=0.9)
    async def brief() -> str:
        await asyncio.sleep(0.5)
        return "brief"

    with running_worker(app, queues=["mangled", "other"], concurrency=4):
        first = brief.enqueue()
        wait_until(lambda: first.info().state == "active", 10, message="the brief job leased")
        with _written_over(app, app.keys("mangled").leases):
            job = slow.enqueue()
            assert job.result(timeout=15) == "ok"
            assert job.info().attempts == 1  # its lease never lapsed
            assert first.info().state == "active"  # its outcome waits for the set
        assert first.result(timeout=20) == "brief"


# -- keys named per job and per tenant -------------------------------------------------------
#
# Which job records and ready lists a call meets is known only as it goes, so they are not
# checked before the first write: a job record of another type is set aside and its job
# dead-lettered with the reason, a ready list of another type is set aside and serves again
# from empty, and everything else the call meets goes on as it would have.

KINDS = ("string", "list", "set", "zset", "stream")


def _retype(app: conveyor.Conveyor, key: str, kind: str) -> None:
    """Write a value of ``kind`` over ``key``."""
    app.redis.delete(key)
    if kind == "string":
        app.redis.set(key, MANGLED)
    elif kind == "list":
        app.redis.rpush(key, MANGLED)
    elif kind == "set":
        app.redis.sadd(key, MANGLED)
    elif kind == "zset":
        app.redis.zadd(key, {MANGLED: 1})
    else:
        app.redis.xadd(key, {"by": "hand"})


def _aside(key: str) -> str:
    """Where a key of the wrong type is moved: its hash tag, ':mangled', the rest."""
    tag, rest = key.split("}", 1)
    return f"{tag}}}:mangled{rest}"


def _dead_lettered_aside(app: conveyor.Conveyor, short_id: str, kind: str) -> None:
    """The job is dead with a reason naming what its key held, and that value is kept
    aside for a while."""
    k = app.keys(Q)
    assert app.redis.zscore(k.dead, short_id) is not None
    record = app.redis.hgetall(k.job(short_id))
    assert record[b"s"] == b"dead"
    error = record[b"error"].decode()
    assert f"corrupt record: the job's key holds a {kind}, not a hash" in error
    assert _aside(k.job(short_id)) in error
    assert app.redis.type(_aside(k.job(short_id))).decode() == kind
    assert 0 < app.redis.ttl(_aside(k.job(short_id))) <= 7 * 86400
    info = app.job(f"{Q}~{short_id}").info()
    assert info.state == conveyor.JobState.DEAD and info.error == error


def _leased_as_expected(app: conveyor.Conveyor, leased: list[str], ready: int = 0) -> None:
    """``leased`` (and no other job) hold leases, counted; ``ready`` jobs are counted ready."""
    k = app.keys(Q)
    assert {m.decode() for m in app.redis.zrange(k.leases, 0, -1)} == set(leased)
    for short_id in leased:
        assert app.redis.hget(k.job(short_id), "s") == b"active"
    assert int(app.redis.hget(k.active, "t") or 0) == len(leased)
    assert int(app.redis.hget(k.counts, "running") or 0) == len(leased)
    assert int(app.redis.hget(k.counts, "ready") or 0) == ready


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("limited", [False, True])
def test_a_fetch_dead_letters_a_ready_job_whose_record_is_no_hash_and_leases_the_rest(
    app: conveyor.Conveyor, kind: str, limited: bool,
) -> None:
    """The job popped before the bad one and those after it are leased in the same claim;
    the bad one is dead-lettered with its reason, not left off every list."""
    k = app.keys(Q)
    if limited:
        app.queue(Q).set_limits(concurrency=10)
    _enqueue(app, "a", "bad", "c")
    _retype(app, k.job("bad"), kind)
    fetched = app.scripts.run(calls.fetch(k, 10, app.limits))
    assert [j.short_id for j in fetched.jobs] == ["a", "c"]
    assert fetched.dead == ["bad"]
    _leased_as_expected(app, ["a", "c"])
    _dead_lettered_aside(app, "bad", kind)


@pytest.mark.parametrize("kind", ["string", "list"])
def test_a_fetch_dead_letters_a_due_or_lapsed_job_whose_record_is_no_hash(
    app: conveyor.Conveyor, kind: str,
) -> None:
    """Due delayed jobs and lapsed leases are handled before the claim: a bad record among
    them stops nothing either, and the active counts come back to what the records say."""
    k = app.keys(Q)
    _enqueue(app, "held")
    held = app.scripts.run(calls.fetch(k, 1, app.limits)).jobs
    _enqueue(app, "lapsed")
    now = float(app.redis.time()[0]) * 1000
    app.scripts.run(calls.fetch(k, 1, app.limits, now=now - 60_000))  # 'lapsed': long over
    _enqueue(app, "due", "due2", delay_ms=1)
    _enqueue(app, "r1")
    time.sleep(0.01)
    _retype(app, k.job("lapsed"), kind)
    _retype(app, k.job("due"), kind)
    fetched = app.scripts.run(calls.fetch(k, 10, app.limits))
    assert sorted(j.short_id for j in fetched.jobs) == ["due2", "r1"]
    assert sorted(fetched.dead) == ["due", "lapsed"]
    _leased_as_expected(app, ["due2", "held", "r1"])
    _dead_lettered_aside(app, "due", kind)
    _dead_lettered_aside(app, "lapsed", kind)
    assert [j.short_id for j in held] == ["held"]


def test_an_enqueue_handing_jobs_over_dead_letters_a_record_that_is_no_hash(
    app: conveyor.Conveyor,
) -> None:
    """The hand-off claims as a fetch does: the bad job is dead-lettered, the others go to
    the waiting worker, and the enqueue stores its job once."""
    k = app.keys(Q)
    _enqueue(app, "bad")
    _retype(app, k.job("bad"), "string")
    app.scripts.run(calls.register_waiter(k, "w1", 4, WAITER_TTL_MS))
    _enqueue(app, "a", "b")
    [entry] = app.redis.lrange(k.handoff("w1"), 0, -1)
    handed = calls.parse_handoff(entry)
    assert [j.short_id for j in handed.jobs] == ["a", "b"]
    assert handed.dead == ["bad"]
    _leased_as_expected(app, ["a", "b"])
    _dead_lettered_aside(app, "bad", "string")


@pytest.mark.parametrize("kind", ["string", "hash"])
@pytest.mark.parametrize("where", ["alone", "turns", "limited", "promoted", "inbox"])
def test_a_ready_list_of_the_wrong_type_strands_nothing(
    app: conveyor.Conveyor, where: str, kind: str,
) -> None:
    """A tenant's ready list (or the inbox) written over: the claim goes on past it, the key
    is set aside, and the list serves that tenant again from empty. (The ids it held went
    with what was written over them.)"""
    k = app.keys(Q)
    if where == "limited":
        app.queue(Q).set_limits(concurrency=10, tenant_concurrency=5)
    _enqueue(app, "h1", "h2", priority=9)  # popped first: leased before the bad list is met
    lost = 0
    if where == "promoted":  # a due job is pushed onto the list written over
        _enqueue(app, "d1", tenant="t1", delay_ms=1)
        time.sleep(0.01)
    elif where != "inbox":
        _enqueue(app, "gone", tenant="t1")  # its id goes with the list
        lost = 1
    if where == "turns":
        _enqueue(app, "o1", tenant="t2")
    key = k.inbox if where == "inbox" else k.ready("5:t1")
    app.redis.delete(key)
    if kind == "string":
        app.redis.set(key, MANGLED)
    else:
        app.redis.hset(key, "by", "hand")
    fetched = app.scripts.run(calls.fetch(k, 10, app.limits))
    expected = {"h1", "h2", *(["d1"] if where == "promoted" else []),
                *(["o1"] if where == "turns" else [])}
    assert {j.short_id for j in fetched.jobs} == expected
    _leased_as_expected(app, sorted(expected), ready=lost)
    assert app.redis.type(_aside(key)).decode() == kind
    assert app.redis.type(key) == b"none"
    # The tenant is served again: a new job of it is listed and leased.
    _enqueue(app, "n1", tenant="t1")
    _enqueue(app, "n2")
    assert sorted(j.short_id for j in app.scripts.run(calls.fetch(k, 10, app.limits)).jobs) \
        == ["n1", "n2"]


def test_outcomes_heartbeats_progress_and_release_pass_over_a_record_that_is_no_hash(
    app: conveyor.Conveyor,
) -> None:
    """A batch that meets a record written over refuses that one and settles the rest; the
    lease of the bad one lapses, and the fetch that reclaims it dead-letters it."""
    k = app.keys(Q)
    _enqueue(app, "a", "bad", "c", "d", "e", "f")
    a, bad, c, d, e, _f = app.scripts.run(calls.fetch(k, 6, app.limits)).jobs
    _retype(app, k.job("bad"), "string")
    leases = [(j.short_id, j.token, 60_000) for j in (a, bad, c)]
    assert app.scripts.run(calls.heartbeat(k, leases)) == [1, 0, 1]
    reports = [(j.short_id, j.token, 0.5, "") for j in (a, bad, c)]
    assert app.scripts.run(calls.progress(k, reports)) == [1, 0, 1]
    assert app.scripts.run(calls.step(k, "bad", bad.token, "s", b"1"))[0] == calls.STEP_REFUSED
    now = time.time()
    done = app.scripts.run(calls.finish(k, [calls.Outcome("a", a.token, "ok", now),
                                            calls.Outcome("bad", bad.token, "ok", now),
                                            calls.Outcome("c", c.token, "ok", now)],
                                        app.limits))
    assert done.codes == [calls.FINISH_SUCCEEDED, calls.FINISH_REFUSED, calls.FINISH_SUCCEEDED]
    assert app.scripts.run(calls.release(k, [(j.short_id, j.token, "") for j in
                                             (d, bad, e)])) == 2
    assert app.scripts.run(calls.cancel(k, "bad", app.limits)) == ""
    assert app.redis.get(k.job("bad")) == MANGLED.encode()  # not written by any of them
    later = float(app.redis.time()[0]) * 1000 + 120_000
    fetched = app.scripts.run(calls.fetch(k, 10, app.limits, now=later))
    assert fetched.dead == ["bad"]
    assert sorted(j.short_id for j in fetched.jobs) == ["d", "e", "f"]  # f: lapsed, again
    _dead_lettered_aside(app, "bad", "string")
    assert int(app.redis.hget(k.active, "t")) == 3  # d, e, f: recounted from the records


def test_a_requeue_leaves_a_dead_record_that_is_no_hash_and_requeues_the_rest(
    app: conveyor.Conveyor,
) -> None:
    k = app.keys(Q)
    _enqueue(app, "a", "bad", "c", max_attempts=1)
    jobs = app.scripts.run(calls.fetch(k, 3, app.limits)).jobs
    app.scripts.run(calls.finish(k, [calls.Outcome(j.short_id, j.token, "dead", 0.0, "x")
                                     for j in jobs], app.limits))
    _retype(app, k.job("bad"), "list")
    assert app.dead_letters(Q).requeue() == 2
    assert app.redis.zrange(k.dead, 0, -1) == [b"bad"]
    assert app.redis.type(k.job("bad")) == b"list"  # left for whoever repairs it
    assert sorted(j.short_id for j in app.scripts.run(calls.fetch(k, 10, app.limits)).jobs) \
        == ["a", "c"]


def test_a_dedupe_key_of_the_wrong_type_fails_no_outcome(app: conveyor.Conveyor) -> None:
    """Freeing a job's dedupe key when it ends reads the key: one written over with another
    type would stop a finish after the outcomes before it in the batch."""
    k = app.keys(Q)
    _enqueue(app, "a")
    _enqueue(app, "keyed", key="dk")
    a, keyed = app.scripts.run(calls.fetch(k, 2, app.limits)).jobs
    app.redis.delete(k.dedupe_prefix + "dk")
    app.redis.hset(k.dedupe_prefix + "dk", "by", "hand")
    now = time.time()
    done = app.scripts.run(calls.finish(k, [calls.Outcome("a", a.token, "ok", now),
                                            calls.Outcome("keyed", keyed.token, "ok", now)],
                                        app.limits))
    assert done.codes == [calls.FINISH_SUCCEEDED] * 2
    assert app.redis.type(k.dedupe_prefix + "dk") == b"hash"  # names no job: left alone
