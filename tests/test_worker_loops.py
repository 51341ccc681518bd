"""Every background loop of a worker survives every kind of Redis error.

A worker runs beside its fetch loop a wake listener, lease heartbeats, an outbox of
outcomes, a registry heartbeat and a periodic scheduler. Each error class a production
Redis answers with is injected into each of them (see ``injection.py``); afterwards the
worker must still wake for new jobs, keep a long job's lease, record outcomes and fire
cron ticks. A loop that cannot be kept alive stops the worker loudly.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter

import pytest

import conveyor
from helpers import running_worker, wait_until
from injection import ERRORS, FaultPlan

TARGETS = ["BLPOP", "script:fetch", "script:heartbeat", "script:finish", "script:enqueue",
           "pipeline"]


def _build(app: conveyor.Conveyor) -> tuple[Counter[str], dict[str, conveyor.Task]]:
    runs: Counter[str] = Counter()
    lock = threading.Lock()

    @app.task(name="quick", queue="q")
    def quick(n: int) -> int:
        with lock:
            runs[f"quick{n}"] += 1
        return n

    @app.task(name="long", queue="q", visibility_timeout=1.5)
    async def long(seconds: float) -> str:
        runs["long"] += 1
        await asyncio.sleep(seconds)
        return "done"

    @app.periodic("* * * * * *", queue="q", name="tick")  # every second
    def tick() -> None:
        runs["tick"] += 1

    return runs, {"quick": quick, "long": long}


@pytest.mark.parametrize("kind", sorted(ERRORS))
def test_every_loop_survives_each_redis_error(app: conveyor.Conveyor, kind: str) -> None:
    runs, tasks = _build(app)
    with running_worker(app, queues=["q"], concurrency=4):
        wait_until(lambda: runs["tick"] >= 1, 10, message="the first cron tick")
        with FaultPlan() as plan:
            long_job = tasks["long"].enqueue(3.0)  # outlives its 1.5 s lease twice over
            wait_until(lambda: runs["long"] == 1, 10, message="the long job to start")
            for target in TARGETS:
                plan.fail(target, kind, times=3)
            ticks = runs["tick"]
            # An idle worker still wakes for new work, records it, and cron still fires.
            jobs = [tasks["quick"].enqueue(i) for i in range(5)]
            assert [j.result(timeout=15) for j in jobs] == list(range(5))
            assert long_job.result(timeout=15) == "done"
            wait_until(lambda: runs["tick"] > ticks, 10, message="a cron tick after the faults")
        info = long_job.info()
        # Its lease was kept alive through the faults: one run, one attempt.
        assert (runs["long"], info.attempts) == (1, 1), info
        assert all(runs[f"quick{i}"] == 1 for i in range(5)), runs
        assert plan.injected["BLPOP"] >= 1 and plan.injected["script:heartbeat"] >= 1


class _Fatal(BaseException):
    """Not an Exception: no loop may swallow it."""


def test_a_loop_that_cannot_be_kept_alive_stops_the_worker(app: conveyor.Conveyor) -> None:
    from conveyor.worker import LoopDied

    _build(app)
    worker = app.worker(queues=["q"], concurrency=2, grace=1.0)
    errors: list[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as exc:
            errors.append(exc)

    with FaultPlan() as plan:
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        wait_until(worker.started.is_set, 10, message="worker start")
        plan.fail("BLPOP", _Fatal, times=1)
        app.task(name="nudge", queue="q")(lambda: None).enqueue()  # ends a block at once
        thread.join(20)
    assert not thread.is_alive(), "the worker kept running without its wake listener"
    assert errors and isinstance(errors[0], LoopDied), errors
    assert "wake listener" in str(errors[0])


def test_idle_worker_wakes_after_blocking_call_errors(app: conveyor.Conveyor) -> None:
    """An UNBLOCKED reply (a failover demoting the primary) used to end the wake listener
    for good: the idle worker then never woke for new jobs."""
    _, tasks = _build(app)
    with running_worker(app, queues=["q"], concurrency=2), FaultPlan() as plan:
        plan.fail("BLPOP", "unblocked", times=1)
        tasks["quick"].enqueue(0).result(timeout=10)  # ends the first block: refused
        wait_until(lambda: plan.pending() == 0, 10, message="the injected UNBLOCKED")
        started = time.monotonic()
        assert tasks["quick"].enqueue(1).result(timeout=10) == 1
        assert time.monotonic() - started < 5


def test_a_task_that_swallows_its_cancellation_does_not_hold_the_stop(
    app: conveyor.Conveyor, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A client call can swallow a cancellation (redis-py has had such bugs). A loop stuck
    in one, and a stray task the worker left behind, must not keep the worker from
    stopping: each step of the way out is bounded and names what it left."""
    import conveyor.worker as worker_module

    async def stubborn(worker: conveyor.Worker) -> None:
        while True:  # takes every cancellation and carries on
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)

    async def stray() -> None:
        while True:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)

    monkeypatch.setattr(worker_module, "listen_for_wakeups", stubborn)
    monkeypatch.setattr(worker_module, "STOP_STEP_SECONDS", 1.0)
    quick = app.task(name="quick", queue="q")(lambda n: n)
    job = quick.enqueue(7)  # before the start: no wake listener to wake the worker
    with running_worker(app, queues=["q"], concurrency=2) as worker:
        assert job.result(timeout=10) == 7
        assert worker._loop is not None
        worker._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(stray()))
        began = time.monotonic()
    took = time.monotonic() - began
    assert took < 15, f"the stop took {took:.1f} s"
    logged = caplog.text
    assert "wake listener did not stop" in logged and "stubborn" in logged
    assert "did not stop within 1.0 s of being cancelled" in logged and "stray" in logged


def test_a_loop_whose_client_turned_the_cancellation_into_an_error_still_stops(
        caplog: pytest.LogCaptureFixture) -> None:
    """A cancellation that arrives during a Redis call may come out as a connection
    error; the loop takes it for a fault and pauses. The stop cancels it again there."""
    import redis.exceptions

    from conveyor.worker.loops import Loops

    async def call() -> None:
        try:
            await asyncio.sleep(3600)  # on the wire
        except asyncio.CancelledError:
            raise redis.exceptions.ConnectionError("Connection closed by server.") from None

    async def in_a_call_then_pausing() -> None:
        while True:
            try:
                await call()
            except redis.exceptions.ConnectionError:
                await asyncio.sleep(10)  # the loop's pause before it tries again

    async def run() -> float:
        loops = Loops(on_fatal=lambda exc: None)
        loops.start("registry", in_a_call_then_pausing)
        await asyncio.sleep(0.05)
        began = time.monotonic()
        await loops.cancel(timeout=5.0)
        return time.monotonic() - began

    took = asyncio.run(run())
    assert took < 1.0, f"the loop held the stop {took:.1f} s"
    assert "did not stop" not in caplog.text
