"""A queue key written over by hand leaves no call half applied (scripts/include/key_types.lua).

A script that meets a key of the wrong type stops there, and Redis keeps what it wrote
before. Each test writes a string over one of a queue's fixed keys, makes the call, and
compares every key of the queue with what it held before: a fetch, a finish and a release
(a stopping worker handing its jobs back) refuse, naming the key, having changed nothing,
and work again once the key is put back; an enqueue that would hand its job to an idle
worker stores it once and wakes a worker instead.
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
