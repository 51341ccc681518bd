"""The Prometheus collector: totals that only grow while the buckets under them expire."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

import conveyor
from conveyor.monitor.prometheus import RedisCollector
from helpers import running_worker, scrape, wait_until


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
