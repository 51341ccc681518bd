"""Scaling advice: the arithmetic on its own, then against Redis with a worker registry."""

from __future__ import annotations

import math
import time

import pytest

import conveyor
from conveyor import keys as keyspace
from conveyor.monitor import WorkerInfo
from conveyor.monitor.advice import decide

NOW = 1_800_000_000.0


def stats(*, enqueued: int = 0, ready: int = 0, active: int = 0, scheduled: int = 0,
          wait_p95: float | None = None, run_mean: float | None = None,
          window: float = 60) -> conveyor.Stats:
    timing = conveyor.Timing(10, run_mean, run_mean, run_mean, run_mean)
    wait = conveyor.Timing(10, (wait_p95 or 0) / 2, wait_p95, wait_p95, wait_p95)
    return conveyor.Stats(
        task=None, queue="q", window=window, span=window, enqueued=enqueued, started=0,
        succeeded=0, failed=0, retried=0, dead=0, throughput=0.0,
        arrival_rate=enqueued / window, wait=wait if wait_p95 is not None else conveyor.Timing(),
        run=timing if run_mean is not None else conveyor.Timing(),
        backlog=conveyor.Backlog(ready=ready, scheduled=scheduled, active=active), now=NOW)


def workers(n: int, concurrency: int = 10, jobs: int = 10) -> list[WorkerInfo]:
    return [WorkerInfo(f"w{i}", "h", i, ("q",), concurrency, jobs, NOW - 60, NOW)
            for i in range(n)]


def test_idle_queue_needs_no_worker() -> None:
    advice = decide("q", stats(), 0.1, workers(2), True, 10, None)
    assert advice.workers_needed == 0 and advice.eta_seconds == 0.0
    assert "idle" in advice.reasons[0]


def test_no_registry_assumes_one_worker_at_concurrency_32_and_says_so() -> None:
    advice = decide("q", stats(enqueued=60, ready=5, run_mean=0.1), 0.1, [], False, 10, None)
    assert advice.assumed_workers and advice.workers == 1 and advice.concurrency == 32
    assert "assumed" in advice.reasons[0]
    assert advice.workers_needed == 1


def test_waits_over_target_scale_out_by_littles_law() -> None:
    # 10 jobs/s of 2 s each keep 20 slots busy (Little's law); 2 workers x 10 slots cannot
    # keep up, and 300 ready jobs x 2 s must clear within 10 s: 60 more slots.
    s = stats(enqueued=600, ready=300, active=20, wait_p95=40, run_mean=2.0)
    advice = decide("q", s, 2.0, workers(2), True, 10, None)
    assert advice.arrival_rate == pytest.approx(10)
    assert advice.capacity == pytest.approx(10)  # 20 slots / 2 s
    assert advice.workers_needed == math.ceil((10 * 2 / 0.85 + 300 * 2 / 10) / 10)
    assert advice.eta_seconds == math.inf  # arrivals use up all capacity
    text = " ".join(advice.reasons)
    assert "over the 10 s target: scale out to 9 worker(s)" in text
    assert "arrive faster" not in text  # equal rates: not faster, but no spare either


def test_long_runs_point_at_the_job_itself() -> None:
    s = stats(enqueued=6, ready=2, active=4, wait_p95=1, run_mean=45)
    advice = decide("q", s, 45, workers(1, concurrency=4, jobs=4), True, 10, None)
    assert any("Run time dominates" in r and "split" in r for r in advice.reasons)


def test_deadline_that_cannot_be_met_says_how_many_workers_would() -> None:
    # 1000 pending jobs of 1 s on 10 slots take 100 s; the deadline is in 50 s.
    s = stats(ready=990, active=10, run_mean=1.0)
    advice = decide("q", s, 1.0, workers(1), True, 60, NOW + 50)
    assert advice.eta_seconds == pytest.approx(100)
    assert advice.workers_needed >= 2
    assert any("past the deadline" in r for r in advice.reasons)
    relaxed = decide("q", s, 1.0, workers(1), True, 200, NOW + 500)
    assert any("before the deadline" in r for r in relaxed.reasons)


def test_unknown_run_time_keeps_a_worker() -> None:
    advice = decide("q", stats(ready=5), None, [], True, 10, None)
    assert advice.workers_needed == 1 and advice.eta_seconds is None
    assert any("unknown" in r for r in advice.reasons)


def test_advice_reads_the_worker_registry(app: conveyor.Conveyor) -> None:
    @app.task(name="slow", queue="mail")
    def slow() -> None: ...

    slow.enqueue_many([()] * 50)
    fresh = time.time() * 1000
    for wid, queues, beat in (("a", "mail,other", fresh), ("b", "mail", fresh),
                              ("c", "other", fresh), ("gone", "mail", fresh - 600_000)):
        app.redis.zadd(keyspace.workers_key(app.namespace), {wid: beat})
        app.redis.hset(keyspace.worker_key(app.namespace, wid), mapping={
            "host": "h", "pid": 1, "queues": queues, "concurrency": 8, "jobs": 3,
            "started_at": time.time()})
    bucket = int(time.time() // 10 * 10)
    app.redis.zadd(app.keys("mail").metrics(bucket),
                   {"slow|r|10": 4, "slow|rsum": 2.0, "slow|succeeded": 4})
    advice = app.monitor.advice("mail", target_wait=5)
    assert not advice.assumed_workers
    assert (advice.workers, advice.concurrency, advice.busy_slots) == (2, 8, 6)
    assert advice.run_time == pytest.approx(0.5)
    # 50 ready x 0.5 s within 5 s = 5 slots, plus the arrivals' share: one worker of 8.
    assert advice.workers_needed == 1
    assert advice.backlog.ready == 50


def test_a_limit_holding_jobs_is_named_before_any_job_finished(
        app: conveyor.Conveyor) -> None:
    @app.task(name="capped", queue="capped")
    def capped() -> None:
        return None

    capped.enqueue_many([() for _ in range(5)])
    app.pause("capped")
    advice = app.monitor.advice(queue="capped")
    assert advice.run_time is None  # nothing finished: run time unknown
    assert any("held by the queue's pause" in reason
               for reason in advice.reasons), advice.reasons
