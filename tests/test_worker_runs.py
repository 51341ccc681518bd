"""How a worker accounts for the runs it holds: every attempt settled exactly once, no run
repeated on a healthy worker, no job lost or dead-lettered by a stop.

Each test reproduces a fault of production on a real redis-server: a lease that lapses
while its job still runs, jobs of different visibility timeouts side by side, tasks that
raise what a task should not, a stop past the grace period, a sync task past its timeout,
wake-ups taken by a worker that then goes away.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter

import pytest

import conveyor
from conveyor.clock import ServerClock
from conveyor.scripts import calls
from conveyor.worker.executor import Held
from helpers import RedisServer, record_field, running_worker, start_told, wait_until
from injection import FaultPlan


def _counter() -> tuple[Counter[str], threading.Lock]:
    return Counter(), threading.Lock()


def test_a_run_whose_lease_lapsed_goes_on_under_its_new_lease(app: conveyor.Conveyor) -> None:
    """The heartbeats fail long enough for the lease to lapse; the same worker leases the
    job again while the first run goes on. One run, and it succeeds (it used to end dead
    with 'lease expired', or run twice side by side)."""
    runs, lock = _counter()

    go = threading.Event()

    @app.task(name="slow", queue="q", visibility_timeout=0.6, retries=3)
    async def slow() -> str:
        with lock:
            runs["slow"] += 1
        while not go.is_set():
            await asyncio.sleep(0.02)
        return "ok"

    with running_worker(app, queues=["q"], concurrency=2), FaultPlan() as plan:
        plan.fail("script:heartbeat", "connection", times=10_000)
        job = slow.enqueue()
        first = wait_until(lambda: record_field(app, job.id, "token"), 10, message="leased")
        # Reclaimed (by this worker's own fetch), then leased here again: heartbeats may
        # go through from then on.
        wait_until(lambda: record_field(app, job.id, "token") not in (first, b"", None), 15,
                   message="leased again")
        plan.clear()
        go.set()
        assert job.result(timeout=20) == "ok"
        info = job.info()
    assert runs["slow"] == 1
    # The lost lease is counted; its attempt was given back, as no heartbeat could tell
    # Redis that its run began: the one run costs the one attempt of its second lease.
    assert info.state == "succeeded" and int(record_field(app, job.id, "lost") or 0) >= 1
    assert info.attempts == 1


def test_a_run_told_to_begin_then_leased_again_here_costs_one_attempt(
        app: conveyor.Conveyor) -> None:
    """The run's start is told, then the heartbeats fail past its lease; the same worker
    leases the job again while the run goes on. One run: one attempt (the reclaim charged
    the first lease, the second says the run continues and gives its own back)."""
    runs, lock = _counter()
    go = threading.Event()

    @app.task(name="told", queue="q", visibility_timeout=0.6, retries=3)
    async def told() -> str:
        with lock:
            runs["told"] += 1
        while not go.is_set():
            await asyncio.sleep(0.02)
        return "ok"

    with running_worker(app, queues=["q"], concurrency=2), FaultPlan() as plan:
        job = told.enqueue()
        wait_until(lambda: start_told(app, job.id), 10, message="the start told")
        first = record_field(app, job.id, "token")
        plan.fail("script:heartbeat", "connection", times=10_000)
        k = app.keys("q")

        def reclaimed() -> bool:  # another worker's fetch takes the lapsed lease back
            app.scripts.run(calls.fetch(k, 0, app.limits))
            return record_field(app, job.id, "token") != first

        wait_until(reclaimed, 10, interval=0.05, message="the lapsed lease reclaimed")
        plan.clear()
        wait_until(lambda: record_field(app, job.id, "token") not in (first, b""), 15,
                   message="leased again")
        wait_until(lambda: start_told(app, job.id), 10, message="the run's going on told")
        go.set()
        assert job.result(timeout=20) == "ok"
        info = job.info()
    assert runs["told"] == 1
    assert info.state == "succeeded" and info.attempts == 1
    assert int(record_field(app, job.id, "lost") or 0) >= 1


def test_short_lease_beside_long_one_gets_its_first_heartbeat_in_time(
        app: conveyor.Conveyor) -> None:
    """A job with a 30 s lease makes the heartbeat loop sleep 10 s; a 1 s-lease job leased
    meanwhile must still be beaten within a third of its own timeout."""
    runs, lock = _counter()

    @app.task(name="long_lease", queue="q", visibility_timeout=30)
    async def long_lease() -> None:
        await asyncio.sleep(6)

    @app.task(name="short_lease", queue="q", visibility_timeout=1)
    async def short_lease() -> str:
        with lock:
            runs["short"] += 1
        await asyncio.sleep(2.5)
        return "ok"

    with running_worker(app, queues=["q"], concurrency=4):
        long_job = long_lease.enqueue()
        wait_until(lambda: long_job.info().state == "active", 10, message="the long job")
        time.sleep(1.5)  # the heartbeat loop has gone to sleep for the long lease
        job = short_lease.enqueue()
        assert job.result(timeout=20) == "ok"
        long_job.result(timeout=20)
    assert runs["short"] == 1
    assert job.info().attempts == 1


def test_start_and_withdraw_exclude_each_other() -> None:
    leased = _leased()
    clock = ServerClock()
    held = Held("q", leased)
    assert held.try_start(clock)
    assert not held.withdraw(running_too=False)  # it runs: a stop must not hand it back
    assert not held.withdrawn
    other = Held("q", leased)
    assert other.withdraw(running_too=False)
    assert not other.try_start(clock)  # handed back: its thread must not run it


def _leased() -> conveyor.scripts.calls.Leased:
    from conveyor.scripts.calls import Leased
    return Leased("id", "t", "task", b"[[],{}]", 1, 1, 0.0, 0.0, 1000)


class _StrFails(Exception):
    def __str__(self) -> str:
        raise ValueError("no message for you")


class _NotAnException(BaseException):
    pass


RAISES = {
    "system_exit": SystemExit(3),
    "keyboard_interrupt": KeyboardInterrupt(),
    "base_exception": _NotAnException("odd"),
    "str_fails": _StrFails(),
}


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_whatever_a_task_raises_settles_the_attempt(app: conveyor.Conveyor,
                                                    is_async: bool) -> None:
    def make(name: str, exc: BaseException) -> conveyor.Task:
        if is_async:
            async def body() -> None:
                raise exc
        else:
            def body() -> None:
                raise exc
        return app.task(name=name, queue="q", retries=0)(body)

    tasks = {name: make(name, exc) for name, exc in RAISES.items()}
    with running_worker(app, queues=["q"], concurrency=4):
        jobs = {name: task.enqueue() for name, task in tasks.items()}
        for job in jobs.values():
            wait_until(lambda j=job: j.info().state == "dead", 10, message=f"{job.id} dead")
    assert "SystemExit" in (jobs["system_exit"].info().error or "")
    assert "_NotAnException" in (jobs["base_exception"].info().error or "")
    assert "_StrFails" in (jobs["str_fails"].info().error or "")


def test_a_deeply_nested_payload_dead_letters_its_job(app: conveyor.Conveyor) -> None:
    @app.task(name="nested", queue="q", retries=0)
    def nested(value: object) -> None: ...

    job = nested.enqueue(1)
    depth = 200_000
    key = app.keys("q").job(job.id.split("~")[1])
    app.redis.hset(key, "a", b"[[" + b"[" * depth + b"]" * depth + b"],{}]")
    with running_worker(app, queues=["q"], concurrency=2):
        wait_until(lambda: job.info().state == "dead", 15, message="the nested job dead")
        ok = app.task(name="after", queue="q")(lambda: 7).enqueue()
        assert ok.result(timeout=10) == 7  # and the worker carries on


def test_a_tasks_own_timeout_error_is_reported_as_such(app: conveyor.Conveyor) -> None:
    @app.task(name="client_timeout", queue="q", retries=0)
    async def client_timeout() -> None:
        raise TimeoutError("the payment API did not answer")

    @app.task(name="client_timeout_within", queue="q", retries=0, timeout=30)
    async def client_timeout_within() -> None:
        raise TimeoutError("the database did not answer")

    with running_worker(app, queues=["q"], concurrency=2):
        jobs = [client_timeout.enqueue(), client_timeout_within.enqueue()]
        for job in jobs:
            wait_until(lambda j=job: j.info().state == "dead", 10, message="dead")
    errors = [job.info().error or "" for job in jobs]
    assert "payment API" in errors[0] and "longer than" not in errors[0]
    assert "database" in errors[1] and "longer than" not in errors[1]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_stop_past_the_grace_period_never_dead_letters(app: conveyor.Conveyor,
                                                         is_async: bool) -> None:
    started = threading.Event()
    if is_async:
        async def body() -> None:
            started.set()
            await asyncio.sleep(30)
    else:
        def body() -> None:
            started.set()
            time.sleep(3)
    task = app.task(name="last_try", queue="q", retries=0)(body)  # one attempt in all
    with running_worker(app, queues=["q"], concurrency=2, grace=0.3):
        job = task.enqueue()
        assert started.wait(10)
    info = job.info()
    assert info.state == "ready", info  # back in its queue, not dead
    assert info.attempts == 0  # the interrupted run did not use up its only attempt
    assert "interrupted" in (info.error or "")
    assert app.redis.hget(app.keys("q").job(job.short_id), "interruptions") == b"1"


def test_an_overrunning_sync_task_keeps_its_slot(app: conveyor.Conveyor,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Unsupervised, concurrency 1: the overrunning run keeps its thread; the next job must
    wait for it and then run, not be failed for a timeout it never ran into."""
    @app.task(name="overrun", queue="q", timeout=0.3, retries=0)
    def overrun() -> None:
        time.sleep(2)

    @app.task(name="next", queue="q", timeout=1.0)
    def next_job() -> str:
        return "ran"

    caplog.set_level(logging.WARNING, "conveyor.worker")
    with running_worker(app, queues=["q"], concurrency=1) as worker:
        first = overrun.enqueue()
        wait_until(lambda: first.info().state == "dead", 10, message="the overrun recorded")
        second = next_job.enqueue()
        wait_until(lambda: worker.executor.stuck, 5, message="the stuck slot")
        assert worker.free_slots() == 0
        assert second.result(timeout=15) == "ran"
    assert "longer than" in (first.info().error or "")
    assert second.info().attempts == 1
    assert "overran its 0.3 s timeout" in caplog.text


def _enqueue_unannounced(app: conveyor.Conveyor, task: conveyor.Task, *args: object
                         ) -> conveyor.Job:
    """Enqueue a job and take its wake marker away in the same transaction, as a worker
    does that takes the marker and then dies or leaves before acting on it."""
    from conveyor import producer

    planned = producer.plan(task, [(args, {})])
    [(short_id, _)] = planned.jobs
    k = app.keys(task.queue)
    with app.redis.pipeline(transaction=True) as pipe:
        app.scripts.queue(planned.first_chunk(), pipe)
        pipe.delete(k.wake)
        pipe.execute()
    return app.job(f"{task.queue}~{short_id}")


def test_idle_workers_find_work_whose_wake_up_was_lost(app: conveyor.Conveyor,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from conveyor.worker import wake
    monkeypatch.setattr(wake, "WAKE_BLOCK_SECONDS", 1.0)

    @app.task(name="job", queue="q")
    def job(n: int) -> int:
        return n

    with running_worker(app, queues=["q"], concurrency=2):
        assert job.enqueue(-1).result(timeout=10) == -1  # the worker is up and idle
        ready = [_enqueue_unannounced(app, job, i) for i in range(3)]
        delayed = _enqueue_unannounced(app, job.options(delay=1.5), 9)
        assert [j.result(timeout=10) for j in ready] == [0, 1, 2]
        assert delayed.result(timeout=10) == 9


def test_a_stopping_worker_passes_wake_ups_on(app: conveyor.Conveyor) -> None:
    started = threading.Event()

    @app.task(name="holder", queue="q")
    async def holder() -> None:
        started.set()
        await asyncio.sleep(6)

    @app.task(name="job", queue="q")
    def job(n: int) -> int:
        return n

    with running_worker(app, queues=["q"], concurrency=2, grace=10) as draining:
        holder.enqueue()
        assert started.wait(10)
        with running_worker(app, queues=["q"], concurrency=2):
            draining.stop()  # drains its running job for up to 10 s, fetching nothing
            wait_until(lambda: draining.stopping, 5, message="the stop")
            for i in range(3):
                t0 = time.monotonic()
                assert job.enqueue(i).result(timeout=10) == i
                assert time.monotonic() - t0 < 5  # not left to a periodic look


def test_outcomes_and_hand_backs_wait_out_a_redis_outage_at_shutdown(
        make_server: type[RedisServer], namespace: str) -> None:
    """Redis goes away while a stopping worker holds one finished and one unstarted job:
    once it is back (within the worker's patience), the outcome is recorded and the
    unstarted job handed back — neither left to a lease expiry."""
    server = make_server(durable=True).start()
    app = conveyor.Conveyor(server.url, namespace=namespace)
    started = threading.Event()

    @app.task(name="brief", queue="q", visibility_timeout=60)
    def brief() -> str:
        started.set()
        time.sleep(1.0)
        return "done"

    try:
        worker = app.worker(queues=["q"], concurrency=1, grace=30)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        first = brief.enqueue()
        assert started.wait(10)
        second = brief.enqueue()  # leased later, never started while the worker stops
        server.stop(save=False)
        worker.stop()
        time.sleep(1.5)  # the first job finishes while Redis is down
        server.start()
        thread.join(30)
        assert not thread.is_alive()
        assert first.info().state == "succeeded"
        assert second.info().state in ("ready", "succeeded")
        assert second.info().attempts <= 1
    finally:
        app.close()


def test_a_batch_of_sync_jobs_runs_at_once_after_an_earlier_job_left_one_idle_thread(
        app: conveyor.Conveyor) -> None:
    """The thread pool grew only when no thread was idle: after one earlier sync job had
    left one idle thread, a batch of jobs arriving together ran one at a time."""
    @app.task(name="nap", queue="q")
    def nap(seconds: float) -> float:
        time.sleep(seconds)
        return time.monotonic()

    with running_worker(app, queues=["q"], concurrency=6):
        nap.enqueue(0.01).result(timeout=10)
        time.sleep(0.2)  # the one thread is idle now
        began = time.monotonic()
        jobs = nap.enqueue_many([(1.0,)] * 6)
        ends = [job.result(timeout=30) for job in jobs]
    assert max(ends) - began < 2.5, [round(e - began, 2) for e in ends]


def test_a_job_that_succeeds_after_failing_shows_no_error(app: conveyor.Conveyor) -> None:
    """The error of an earlier attempt goes when a later one succeeds (a retry, or a dead
    job requeued): a succeeded job does not show an error it no longer has."""
    fails = {"left": 1}

    @app.task(name="second_time", queue="q", retries=0)
    def second_time() -> str:
        if fails["left"]:
            fails["left"] -= 1
            raise RuntimeError("first attempt fails")
        return "ok"

    with running_worker(app, queues=["q"]):
        job = second_time.enqueue()
        wait_until(lambda: job.info().state == "dead", 10, message="dead")
        assert "first attempt fails" in (job.info().error or "")
        assert app.dead_letters("q").requeue(job.id) == 1
        assert job.result(timeout=10) == "ok"
    assert job.info().error is None
