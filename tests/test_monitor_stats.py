"""Windowed stats: percentiles from the log histograms, counters, backlog, windows."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

import pytest

import conveyor
from conveyor.monitor.histogram import Histogram, bin_bounds, bin_of
from helpers import RedisServer, running_worker, wait_until
from monitor_app import make_app

LUA_BIN = """
local us = tonumber(ARGV[1]) * 1000000
if us < 1 then return 0 end
return math.floor(math.log(us) / math.log(1.1)) + 1
"""


@pytest.fixture
def mapp(redis_server: RedisServer, namespace: str) -> Iterator[conveyor.Conveyor]:
    application = make_app(redis_server.url, namespace)
    yield application
    application.close()


def exact(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def test_python_bins_match_the_lua_bins(redis_server: RedisServer) -> None:
    client = redis_server.client()
    rng = random.Random(7)
    samples = [0.0, 5e-7, 1e-6, 1.0, 3600.0] + [10 ** rng.uniform(-6, 4) for _ in range(300)]
    for seconds in samples:
        assert client.eval(LUA_BIN, 0, repr(seconds)) == bin_of(seconds), seconds
    low, high = bin_bounds(bin_of(0.123))
    assert low <= 0.123 < high and high / low == pytest.approx(1.1)


def test_histogram_percentiles_within_ten_percent_on_a_known_distribution() -> None:
    rng = random.Random(3)
    values = [rng.lognormvariate(-2, 1.2) for _ in range(5000)]
    hist = Histogram()
    for v in values:
        hist.observe(v)
    for q in (0.5, 0.9, 0.95, 0.99):
        assert hist.quantile(q) == pytest.approx(exact(values, q), rel=0.10)
    assert hist.mean == pytest.approx(sum(values) / len(values))
    assert Histogram().quantile(0.5) is None and Histogram().mean is None


def test_stats_percentiles_match_a_known_sleep_distribution(mapp: conveyor.Conveyor) -> None:
    # 120 runs sleeping 20..300 ms, evenly spread, in random order; 12 at a time so that
    # waits spread too. Percentiles read from the buckets must be within 10 % of the exact
    # percentiles of what the job records say, and close to the sleeps themselves.
    sleeps = [0.02 + 0.28 * i / 119 for i in range(120)]
    random.Random(5).shuffle(sleeps)
    jobs = mapp.tasks["nap"].enqueue_many([(s,) for s in sleeps])
    with running_worker(mapp, concurrency=12):
        for job in jobs:
            job.result(timeout=60)
    infos = [j.info() for j in jobs]
    runs = [i.run_time for i in infos if i.run_time is not None]
    waits = [i.wait_time for i in infos if i.wait_time is not None]
    stats = mapp.monitor.stats(task="nap", window=300)
    assert stats.succeeded == stats.started == stats.enqueued == 120
    assert stats.run.count == stats.wait.count == 120
    for q, name in ((0.5, "p50"), (0.95, "p95"), (0.99, "p99")):
        # within 10 % of the exact percentile (or 2 ms, for waits near zero)
        assert getattr(stats.run, name) == pytest.approx(exact(runs, q), rel=0.10), name
        assert getattr(stats.wait, name) == pytest.approx(
            exact(waits, q), rel=0.10, abs=0.002), name
        # the sleep itself: overshoot on a loaded machine adds a little, never removes
        assert exact(sleeps, q) * 0.9 <= getattr(stats.run, name) <= exact(sleeps, q) + 0.25
    assert stats.run.mean == pytest.approx(sum(runs) / len(runs), rel=0.01)
    assert stats.throughput == pytest.approx(120 / stats.span)
    assert 300 <= stats.span < 300 + mapp.limits.bucket_seconds


def test_counters_per_task_and_per_queue_and_backlog(redis_server: RedisServer,
                                                     namespace: str) -> None:
    app = conveyor.Conveyor(redis_server.url, namespace=namespace)

    @app.task(name="a", queue="qa")
    def a() -> None: ...

    @app.task(name="b", queue="qa")
    def b() -> None: ...

    @app.task(name="c", queue="qb", retries=1, backoff=0.01)
    def c() -> None:
        raise ValueError("no")

    jobs = a.enqueue_many([()] * 3) + b.enqueue_many([()] * 2) + [c.enqueue()]
    with running_worker(app, concurrency=4):
        wait_until(lambda: all(j.info().state.finished for j in jobs), message="all finished")
    # A fresh backlog after the run: ready, scheduled (delayed) and dead.
    a.enqueue_many([()] * 4)
    a.options(delay=600).enqueue()
    qa, qb = app.monitor.stats(queue="qa"), app.monitor.stats(queue="qb")
    assert (qa.enqueued, qa.started, qa.succeeded, qa.failed) == (10, 5, 5, 0)
    assert app.monitor.stats(task="a").succeeded == 3
    assert app.monitor.stats(task="b", queue="qa").succeeded == 2
    assert app.monitor.stats(task="b", queue="qb").succeeded == 0
    assert (qb.started, qb.failed, qb.retried, qb.dead, qb.succeeded) == (2, 2, 1, 1, 0)
    assert qa.backlog == conveyor.Backlog(ready=4, scheduled=1, active=0, dead=0)
    assert qb.backlog.dead == 1
    everything = app.monitor.stats()
    assert everything.succeeded == 5 and everything.dead == 1
    assert everything.backlog == qa.backlog + qb.backlog
    per_task = {(s.queue, s.task): s.succeeded for s in app.monitor.stats_by_task()}
    assert per_task == {("qa", "a"): 3, ("qa", "b"): 2, ("qb", "c"): 0}
    app.close()


def test_window_excludes_old_buckets_and_buckets_expire(app: conveyor.Conveyor) -> None:
    @app.task(name="t")
    def t() -> None: ...

    t.enqueue()
    now = app.monitor.stats().now
    keys = app.keys("default")
    old = int(now // 10 * 10) - 3600
    app.redis.zadd(keys.metrics(old), {"t|succeeded": 7, "t|r|50": 7, "t|rsum": 0.7})
    assert app.monitor.stats(task="t", window=300).succeeded == 0
    hour = app.monitor.stats(task="t", window=4000)
    assert hour.succeeded == 7 and hour.run.mean == pytest.approx(0.1)
    bucket = keys.metrics(int(now // 10 * 10))
    assert 0 < app.redis.ttl(bucket) <= app.limits.bucket_ttl
