"""Time and order: priorities, tenant fairness, delayed jobs, periodic jobs, wake-ups."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter

import pytest

import conveyor
from conveyor.clock import ServerClock
from conveyor.schedule import Scheduler
from conveyor.sink import stream_events
from helpers import running_worker, wait_until


def recorder(app: conveyor.Conveyor, **options: object):  # type: ignore[no-untyped-def]
    order: list[str] = []
    lock = threading.Lock()

    @app.task(name="record", **options)  # type: ignore[arg-type]
    def record(label: str) -> None:
        with lock:
            order.append(label)

    return record, order


def test_priorities_strict_and_fifo_within_a_level(app: conveyor.Conveyor) -> None:
    record, order = recorder(app)
    record.options(priority=1).enqueue_many([(f"p1-{i}",) for i in range(20)])
    record.enqueue_many([(f"p5-{i}",) for i in range(20)])
    record.options(priority=9).enqueue_many([(f"p9-{i}",) for i in range(20)])
    with running_worker(app, concurrency=1):
        wait_until(lambda: len(order) == 60, 20, message="60 jobs")
    assert order == ([f"p9-{i}" for i in range(20)] + [f"p5-{i}" for i in range(20)]
                     + [f"p1-{i}" for i in range(20)])


def test_a_flooding_tenant_does_not_starve_another(app: conveyor.Conveyor) -> None:
    record, order = recorder(app)
    record.options(tenant="flood").enqueue_many([("flood",)] * 3000)
    record.options(tenant="small").enqueue_many([(f"small-{i}",) for i in range(10)])
    with running_worker(app, concurrency=1):
        wait_until(lambda: sum(1 for o in order if o.startswith("small")) == 10, 30,
                   message="the small tenant's jobs")
        position = max(i for i, o in enumerate(order) if o.startswith("small"))
    assert position < 40, f"the small tenant's last job started at position {position}"


def test_due_delayed_job_runs_before_the_backlog(app: conveyor.Conveyor) -> None:
    record, order = recorder(app)

    @app.task(name="slowish")
    def slowish(label: str) -> None:
        time.sleep(0.005)
        record(label)

    delayed = slowish.options(delay=0.2).enqueue("delayed")
    slowish.enqueue_many([(f"b{i}",) for i in range(300)])
    with running_worker(app, concurrency=2):
        wait_until(lambda: "delayed" in order, 20, message="the delayed job")
        position = order.index("delayed")
    assert position < 150, f"the due delayed job ran at position {position} of 300"
    info = delayed.info()
    assert info.started_at is not None and info.run_at is not None
    assert info.started_at >= info.run_at, "a delayed job must never start early"


def test_delayed_job_never_starts_early_and_starts_promptly(app: conveyor.Conveyor) -> None:
    record, _ = recorder(app)
    with running_worker(app, concurrency=4):
        far = record.options(delay=3600).enqueue("far")  # the worker sleeps towards this one
        jobs = [record.options(delay=0.05 * i).enqueue(f"d{i}") for i in range(1, 11)]
        for job in jobs:
            job.result(timeout=10)
        late = []
        for job in jobs:
            info = job.info()
            assert info.started_at >= info.run_at, f"{job} started before it was due"
            late.append(info.started_at - info.run_at)
        now_job = record.enqueue("now")
        now_job.result(timeout=5)
        assert now_job.info().wait_time < 0.5
    assert sorted(late)[len(late) // 2] < 0.05, f"median lateness {sorted(late)} too high"
    assert far.info().state == conveyor.JobState.SCHEDULED


def test_concurrent_promotion_loses_and_duplicates_nothing(app: conveyor.Conveyor) -> None:
    runs: Counter[int] = Counter()
    lock = threading.Lock()

    @app.task(name="count")
    def count(i: int) -> None:
        with lock:
            runs[i] += 1

    at = time.time() + 0.5
    count.options(at=at).enqueue_many([(i,) for i in range(500)])
    workers = [running_worker(app, concurrency=8) for _ in range(4)]
    for w in workers:
        w.__enter__()
    try:
        wait_until(lambda: sum(runs.values()) >= 500, 30, message="500 runs")
        time.sleep(0.2)  # let any duplicate show itself
    finally:
        for w in workers:
            w.__exit__(None, None, None)
    assert set(runs) == set(range(500))
    assert max(runs.values()) == 1


def test_periodic_fires_once_per_tick_with_three_workers(app: conveyor.Conveyor) -> None:
    ticks: list[float] = []
    lock = threading.Lock()

    @app.periodic("* * * * * *", queue="cron", name="every_second")
    def every_second() -> None:
        with lock:
            ticks.append(time.time())

    workers = [running_worker(app, queues=["cron"], concurrency=2) for _ in range(3)]
    for w in workers:
        w.__enter__()
    try:
        wait_until(lambda: len(ticks) >= 4, 15, message="four ticks")
    finally:
        for w in workers:
            w.__exit__(None, None, None)
    q = app.keys("cron")
    recorded = [float(app.redis.hget(key, "tick"))
                for key in app.redis.scan_iter(match=q.job_prefix + "*", count=1000)]
    ticks_fired = sorted(recorded)
    assert len(ticks_fired) == len(set(ticks_fired)), f"a tick fired twice: {ticks_fired}"
    gaps = [b - a for a, b in itertools.pairwise(ticks_fired)]
    assert all(abs(g - 1.0) < 1e-6 for g in gaps), f"not one job per tick: {ticks_fired}"
    assert all(t == int(t) for t in ticks_fired), "the recorded tick is the schedule's second"


def test_periodic_missed_ticks_fire_once_after_an_outage(app: conveyor.Conveyor) -> None:
    @app.periodic("* * * * * *", queue="cron2", name="missed")
    def missed() -> None: ...

    k = app.keys("cron2")
    stream_events(app, "cron2")
    server_now = app.redis.time()[0]
    app.redis.set(k.schedule_prefix + "missed", (server_now - 30) * 1000)  # down for 30 ticks
    with running_worker(app, queues=["cron2"], concurrency=1, burst=False):
        wait_until(lambda: app.redis.xlen(k.events) >= 1, 10, message="a fired job")
    fired = [e for e in app.redis.xrange(k.events)]
    # one catch-up job for the latest missed tick plus at most a couple of live ticks
    assert 1 <= len(fired) <= 4


async def test_a_first_start_arms_a_periodic_without_showing_it_as_fired(
        app: conveyor.Conveyor) -> None:
    """A scheduler's first start records the current tick as its cursor (so that past
    ticks do not fire); the monitor shows no last fire until a tick really fires."""

    @app.periodic("0 * * * *", queue="cron4", name="hourly")
    def hourly() -> None: ...

    (periodic,) = app.periodics
    scheduler = Scheduler(app, ["cron4"], ServerClock())
    now = float(app.redis.time()[0])
    armed = periodic.latest_at_or_before(now)
    assert not await scheduler.fire(periodic, armed, only_if_seen=True)  # as a first start
    k = app.keys("cron4")
    assert int(app.redis.get(k.schedule("hourly"))) == round(armed * 1000)
    (row,) = app.monitor.schedules()
    assert (row.task, row.last) == ("hourly", None)

    tick = periodic.next_after(now)
    assert await scheduler.fire(periodic, tick)
    assert not await scheduler.fire(periodic, tick)  # another worker, the same tick
    (row,) = app.monitor.schedules()
    assert row.last == tick
    recorded = [float(app.redis.hget(key, "tick"))
                for key in app.redis.scan_iter(match=k.job_prefix + "*", count=1000)]
    assert recorded == [tick]
    await app.aclose()


async def test_a_cursor_left_by_an_older_version_is_not_shown_as_a_fire(
        app: conveyor.Conveyor) -> None:
    """Older versions kept only the cursor, also for a first start that fired nothing: it
    reads as no last fire, until the next tick fires."""

    @app.periodic("0 * * * *", queue="cron5", name="older")
    def older() -> None: ...

    (periodic,) = app.periodics
    now = float(app.redis.time()[0])
    armed = periodic.latest_at_or_before(now)
    app.redis.set(app.keys("cron5").schedule("older"), round(armed * 1000))
    (row,) = app.monitor.schedules()
    assert row.last is None
    scheduler = Scheduler(app, ["cron5"], ServerClock())
    assert not await scheduler.fire(periodic, armed)  # the cursor still holds that tick
    tick = periodic.next_after(now)
    assert await scheduler.fire(periodic, tick)
    (row,) = app.monitor.schedules()
    assert row.last == tick
    await app.aclose()


def test_a_worker_shows_only_the_ticks_it_fired(app: conveyor.Conveyor) -> None:
    """With a worker running: a periodic whose tick has not come yet shows no last fire,
    one that fires every second shows the tick of its latest job."""

    @app.periodic("0 0 1 1 *", queue="cron6", name="yearly")
    def yearly() -> None: ...

    @app.periodic("* * * * * *", queue="cron6", name="each_second")
    def each_second() -> None: ...

    k = app.keys("cron6")

    def fired() -> list[float]:
        return [float(app.redis.hget(key, "tick"))
                for key in app.redis.scan_iter(match=k.job_prefix + "*", count=1000)]

    with running_worker(app, queues=["cron6"], concurrency=1):
        wait_until(lambda: app.redis.exists(k.schedule("yearly")), 10,
                   message="the first start's cursor")
        rows = {r.task: r for r in app.monitor.schedules()}
        assert rows["yearly"].last is None
        wait_until(lambda: len(fired()) >= 2, 10, message="two ticks fired")
    rows = {r.task: r for r in app.monitor.schedules()}
    assert rows["yearly"].last is None
    assert rows["each_second"].last == max(fired())


def test_invalid_cron_is_refused(app: conveyor.Conveyor) -> None:
    with pytest.raises(conveyor.ConfigurationError, match="invalid cron"):
        app.periodic("* * *")(lambda: None)


def test_idle_worker_sends_almost_no_commands(make_server) -> None:  # type: ignore[no-untyped-def]
    server = make_server().start()
    app = conveyor.Conveyor(server.url)

    @app.task
    def f() -> None: ...

    client = server.client()
    with running_worker(app, concurrency=8):
        time.sleep(0.5)  # let the start-up commands pass
        before = client.info("commandstats")
        time.sleep(6)
        after = client.info("commandstats")
    calls = {k: after[k]["calls"] - before.get(k, {"calls": 0})["calls"] for k in after}
    calls.pop("cmdstat_info", None)
    total = sum(calls.values())
    assert total / 6 <= 0.5, f"idle worker sent {calls} in 6 s"
