"""The Prometheus collector: totals that only grow while the buckets under them expire."""

from __future__ import annotations

import sys
from pathlib import Path

import redis
from prometheus_client import CollectorRegistry

import conveyor
from conveyor import testing
from conveyor.clock import server_now
from conveyor.monitor.prometheus import RedisCollector
from conveyor.monitor.stats import bucket_starts
from helpers import RedisServer, running_worker, scrape, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.dashboard_cost import cost


def test_counters_grow_by_bucket_deltas_and_survive_expiry(app: conveyor.Conveyor) -> None:
    @app.task(name="t")
    def t(n: int) -> int:
        return n

    registry = CollectorRegistry()
    registry.register(RedisCollector(app, advice=False))
    key = 'conveyor_jobs_succeeded_total{queue="default",task="t"}'
    jobs = t.enqueue_many([(n,) for n in range(30)])
    with running_worker(app, concurrency=8):
        wait_until(lambda: all(j.info().state.finished for j in jobs), message="first 30")
        assert scrape(registry)[key] == 30
        more = t.enqueue_many([(n,) for n in range(12)])
        wait_until(lambda: all(j.info().state.finished for j in more), message="12 more")
    assert scrape(registry)[key] == 42
    for bucket in app.redis.scan_iter(match=f"{app.keys('default').metrics_prefix}*"):
        app.redis.delete(bucket)  # as if every bucket had expired
    first = scrape(registry)
    assert first[key] == 42
    assert first['conveyor_job_run_seconds_count{queue="default",task="t"}'] == 42
    assert first['conveyor_job_wait_seconds_bucket{le="+Inf",queue="default",task="t"}'] == 42
    assert first['conveyor_jobs_enqueued_total{queue="default",task="t"}'] == 42
    assert scrape(registry)[key] == 42  # nothing counted twice on the next scrape
    assert first['conveyor_queue_jobs{queue="default",state="ready"}'] == 0


def test_first_scrape_sums_the_closed_buckets_in_redis(make_server: type[RedisServer]) -> None:
    """An exporter's first scrape costs a few commands however much history Redis keeps
    (it read every bucket of the retention window one by one: thousands of commands), and
    a later scrape, even after a long pause, counts none of that history twice."""
    server = make_server().start()  # private: the commands counted are the scrape's
    app = conveyor.Conveyor(server.url, namespace="prom")

    @app.task(name="t")
    def t(n: int) -> int:
        return n

    t.enqueue_many([(n,) for n in range(20)])
    assert len(testing.drain(app)) == 20
    k, width = app.keys("default"), app.limits.bucket_seconds
    made = list(app.redis.scan_iter(match=f"{k.metrics_prefix}*"))
    app.redis.zunionstore("template", made)
    for bucket in made:
        app.redis.delete(bucket)
    now = server_now(app.redis)
    copies = bucket_starts(now - 3000, 3000 - 6 * width, width)  # ~50 min of closed buckets
    for start in copies:
        app.redis.copy("template", k.metrics(start))
        app.redis.expire(k.metrics(start), app.limits.bucket_ttl)
    app.redis.delete("template")
    expected = 20 * len(copies)

    collector = RedisCollector(app, advice=False)
    registry = CollectorRegistry()
    registry.register(collector)
    key = 'conveyor_jobs_succeeded_total{queue="default",task="t"}'
    client = redis.Redis.from_url(server.url)
    seen: list[dict[str, float]] = []
    commands, _ = cost(client, lambda: seen.append(scrape(registry)))
    assert seen[0][key] == expected
    assert seen[0]['conveyor_job_run_seconds_count{queue="default",task="t"}'] == expected
    assert seen[0]['conveyor_jobs_enqueued_total{queue="default",task="t"}'] == expected
    assert commands <= 30, commands  # the bucket reads: one ZUNION and three ZRANGEs
    collector.last_now = (collector.last_now or 0) - 3600  # the next scrape an hour later
    assert scrape(registry)[key] == expected
