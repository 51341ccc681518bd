"""Debounce and throttle by key, decided in the enqueue script."""

from __future__ import annotations

import time

import pytest

import conveyor
from conveyor.scripts import calls
from helpers import running_worker, wait_until


def test_debounce_runs_once_after_the_last_enqueue_with_its_arguments(
    app: conveyor.Conveyor,
) -> None:
    calls_seen: list[tuple[int, float]] = []

    @app.task(queue="deb")
    def sync_user(n: int) -> int:
        calls_seen.append((n, time.time()))
        return n

    debounced = sync_user.options(key="user-17", debounce=1.5)
    with running_worker(app, queues=["deb"], concurrency=4):
        jobs = []
        for n in range(50):  # 50 enqueues within about a second
            jobs.append(debounced.enqueue(n))
            time.sleep(0.02)
        last_sent = time.time()
        assert len({j.id for j in jobs}) == 1  # the same job every time
        assert jobs[0].result(timeout=15) == 49  # the latest arguments
        time.sleep(0.3)
    assert [n for n, _ in calls_seen] == [49]  # one run
    ran_at = calls_seen[0][1]
    assert 1.5 - 0.05 <= ran_at - last_sent < 1.5 + 2.0  # 1.5 s after the last enqueue
    info = jobs[0].info()
    assert info.run_at is not None and info.run_at - info.enqueued_at > 1.5


def test_debounce_max_bounds_the_delay(app: conveyor.Conveyor) -> None:
    k = app.keys("deb")
    spec = calls.JobSpec(task="t", key="k", debounce_ms=5000, debounce_max_ms=12_000)

    def send(args: bytes, now: float) -> list[tuple[str, bool]]:
        return app.scripts.run(calls.enqueue(k, spec, [(f"id{now:.0f}", args)], app.limits,
                                             now=now))

    t0 = 1_000_000.0
    first = send(b"[[1]]", t0)[0][0]
    for i, at in enumerate((t0 + 4000, t0 + 8000, t0 + 11_000)):
        assert send(f"[[{i + 2}]]".encode(), at) == [(first, False)]
    # 5 s after the last (t0 + 16 s) would pass the 12 s bound: it runs at t0 + 12 s.
    assert app.redis.zscore(k.delayed, first) == pytest.approx(t0 + 12_000)
    assert app.redis.hget(k.job(first), "a") == b"[[4]]"


def test_a_started_debounced_job_is_left_alone(app: conveyor.Conveyor) -> None:
    k = app.keys("deb")
    spec = calls.JobSpec(task="t", key="k", debounce_ms=1000)
    t0 = 2_000_000.0
    first = app.scripts.run(calls.enqueue(k, spec, [("a", b"[[]]")], app.limits, now=t0))
    app.scripts.run(calls.fetch(k, 5, app.limits, now=t0 + 1500))  # it started
    again = app.scripts.run(calls.enqueue(k, spec, [("b", b"[[]]")], app.limits, now=t0 + 1600))
    assert first == [("a", True)] and again == [("b", True)]  # a new run for the new event


def test_throttle_returns_the_held_job_within_the_window(app: conveyor.Conveyor) -> None:
    @app.task(queue="thr")
    def ping(n: int) -> int:
        return n

    throttled = ping.options(key="acct-1", throttle=1.0)
    with running_worker(app, queues=["thr"], concurrency=2):
        first = throttled.enqueue(1)
        assert first.result(timeout=10) == 1
        assert throttled.enqueue(2).id == first.id  # finished, but the window holds
        wait_until(lambda: throttled.enqueue(3).id != first.id, timeout=5, interval=0.05,
                   message="a new job after the window")


def test_keyed_options_are_checked(app: conveyor.Conveyor) -> None:
    @app.task
    def f() -> None: ...

    for bad in ({"debounce": 5}, {"throttle": 5}, {"key": "k", "debounce_max": 9},
                {"key": "k", "debounce": 5, "throttle": 5},
                {"key": "k", "debounce": 5, "delay": 1},
                {"key": "k", "debounce": 5, "debounce_max": 2},
                {"key": "k", "debounce": -1}, {"key": "k", "throttle": True}):
        with pytest.raises(conveyor.ConfigurationError):
            f.options(**bad)


def test_enqueue_many_with_a_key_enqueues_each_item_in_turn(app: conveyor.Conveyor) -> None:
    """A key names one job: enqueue_many with one stores it once and returns it for every
    item, as that many enqueues would; a debounce keeps the last item's arguments."""
    @app.task(name="keyed", queue="k")
    def keyed(n: int) -> int:
        return n

    jobs = keyed.options(key="one").enqueue_many([(1,), (2,), (3,)])
    assert len({job.id for job in jobs}) == 1 and len(jobs) == 3
    assert app.codec.decode_args(app.redis.hget(app.keys("k").job(jobs[0].short_id), "a")
                                 ) == ([1], {})
    debounced = keyed.options(key="two", debounce=60).enqueue_many([(1,), (2,), (3,)])
    assert len({job.id for job in debounced}) == 1
    record = app.redis.hget(app.keys("k").job(debounced[0].short_id), "a")
    assert app.codec.decode_args(record) == ([3], {})
