"""Flow control decided in the fetch script: caps, token buckets, parked tenants, and the
running counts every end of a run gives back (real redis-server, times pinned by `now`)."""

from __future__ import annotations

import pytest

import conveyor
from conveyor.scripts import calls

Q = "fq"


@pytest.fixture
def app(app_on_each: conveyor.Conveyor) -> conveyor.Conveyor:
    """Every test here runs on a plain server and on a 3-primary Cluster, where a script
    that reaches a key outside its queue's hash slot fails."""
    return app_on_each


def enqueue(app: conveyor.Conveyor, n: int, tenant: str = "", priority: int = 5,
            prefix: str = "") -> list[str]:
    ids = [f"{prefix or tenant or 'j'}{i}" for i in range(n)]
    spec = calls.JobSpec(task="t", tenant=tenant, priority=priority)
    app.scripts.run(calls.enqueue(app.keys(Q), spec, [(i, b"[[]]") for i in ids], app.limits))
    return ids


def fetch(app: conveyor.Conveyor, count: int = 50, now: float | None = None) -> calls.Fetched:
    return app.scripts.run(calls.fetch(app.keys(Q), count, app.limits, now=now))


def finish(app: conveyor.Conveyor, jobs: list[calls.Leased], outcome: str = "ok",
           now: float | None = None) -> None:
    outcomes = [calls.Outcome(j.short_id, j.token, outcome, 0.0) for j in jobs]
    app.scripts.run(calls.finish(app.keys(Q), outcomes, app.limits, now=now))


def running(app: conveyor.Conveyor) -> tuple[int, dict[str, int]]:
    k = app.keys(Q)
    total = int(app.redis.hget(k.counts, "running") or 0)
    per = {a.decode(): int(b) for a, b in app.redis.hgetall(k.running).items()}
    return total, per


def tenant_of(job: calls.Leased) -> str:
    return job.short_id.rstrip("0123456789")


def test_queue_cap_leases_at_most_the_free_slots(app: conveyor.Conveyor) -> None:
    q = app.queue(Q)
    q.set_limits(concurrency=3)
    enqueue(app, 10)
    first = fetch(app).jobs
    assert len(first) == 3
    assert fetch(app).jobs == []  # at its cap: nothing more
    finish(app, first[:2])
    assert len(fetch(app).jobs) == 2
    assert running(app)[0] == 3


def test_tenant_cap_parks_the_tenant_and_serves_the_others(app: conveyor.Conveyor) -> None:
    app.queue(Q).set_limits(tenant_concurrency=2)
    enqueue(app, 20, tenant="a")
    enqueue(app, 5, tenant="b")
    jobs = fetch(app, 50).jobs
    assert sorted(tenant_of(j) for j in jobs) == ["a", "a", "b", "b"]
    k = app.keys(Q)
    # Both at their caps: parked (out of the ring), so a claim costs nothing for them.
    assert app.redis.llen(k.ring_prefix + "5") == 0
    assert fetch(app).jobs == []
    assert {m.decode() for m in app.redis.zrange(k.parked, 0, -1)} == {"5:a", "5:b"}
    a_jobs = [j for j in jobs if tenant_of(j) == "a"]
    finish(app, a_jobs[:1])  # a slot of a frees: a comes back, b stays parked
    again = fetch(app).jobs
    assert [tenant_of(j) for j in again] == ["a"]
    assert running(app) == (4, {"a": 2, "b": 2})


def test_tenant_override_and_untenanted_jobs(app: conveyor.Conveyor) -> None:
    q = app.queue(Q)
    q.set_limits(tenant_concurrency=1)
    q.set_tenant_limits("big", concurrency=4)
    enqueue(app, 10, tenant="big")
    enqueue(app, 10, tenant="small")
    enqueue(app, 3, prefix="free")
    jobs = fetch(app, 50).jobs
    got = sorted(tenant_of(j) for j in jobs)
    assert got.count("big") == 4 and got.count("small") == 1 and got.count("free") == 3


def test_queue_rate_is_a_bucket_of_one_seconds_worth(app: conveyor.Conveyor) -> None:
    app.queue(Q).set_limits(rate="10/s")
    enqueue(app, 100)
    t0 = 1_000_000.0
    first = fetch(app, 50, now=t0)
    assert len(first.jobs) == 10  # one second's worth of burst
    assert first.next_due_ms == pytest.approx(t0 + 100, abs=1)  # next token in 100 ms
    assert fetch(app, 50, now=t0 + 50).jobs == []
    assert len(fetch(app, 50, now=t0 + 500).jobs) == 5
    assert len(fetch(app, 50, now=t0 + 10_000).jobs) == 10  # never more than the bucket


def test_tenant_rate_parks_until_the_refill(app: conveyor.Conveyor) -> None:
    app.queue(Q).set_limits(tenant_rate="2/s")
    enqueue(app, 10, tenant="a")
    enqueue(app, 10, tenant="b")
    t0 = 2_000_000.0
    got = fetch(app, 50, now=t0)
    assert sorted(tenant_of(j) for j in got.jobs) == ["a", "a", "b", "b"]
    assert got.next_due_ms == pytest.approx(t0 + 500, abs=1)
    assert fetch(app, 50, now=t0 + 499).jobs == []
    assert len(fetch(app, 50, now=t0 + 500).jobs) == 2  # one token each


def test_queue_rate_and_tenant_rate_together(app: conveyor.Conveyor) -> None:
    app.queue(Q).set_limits(rate=3, tenant_rate=2)
    enqueue(app, 10, tenant="a")
    enqueue(app, 10, tenant="b")
    got = fetch(app, 50, now=3_000_000.0).jobs
    assert len(got) == 3


def test_every_end_of_a_run_gives_its_slot_back(app: conveyor.Conveyor) -> None:
    app.queue(Q).set_limits(concurrency=10, tenant_concurrency=10)
    enqueue(app, 4, tenant="a")
    t0 = 4_000_000.0
    jobs = fetch(app, 4, now=t0).jobs
    assert running(app) == (4, {"a": 4})
    finish(app, jobs[:1], "ok", now=t0)
    finish(app, jobs[1:2], "retry", now=t0)
    app.scripts.run(calls.release(app.keys(Q), [(jobs[2].short_id, jobs[2].token)]))
    assert running(app) == (1, {"a": 1})
    fetch(app, 0, now=t0 + 60_000)  # the last lease expired: reclaimed
    assert running(app) == (0, {})


def test_raising_a_limit_returns_parked_tenants_and_wakes(app: conveyor.Conveyor) -> None:
    q = app.queue(Q)
    q.set_limits(tenant_concurrency=1)
    enqueue(app, 5, tenant="a")
    assert len(fetch(app).jobs) == 1
    assert fetch(app).jobs == []
    app.redis.delete(app.keys(Q).wake)
    q.set_limits(tenant_concurrency=3)
    assert app.redis.llen(app.keys(Q).wake) == 1
    assert len(fetch(app).jobs) == 2
    q.clear_limits()
    assert len(fetch(app).jobs) == 2
    assert q.limits() == conveyor.QueueLimits()


def test_limits_round_trip_and_validation(app: conveyor.Conveyor) -> None:
    q = app.queue(Q)
    q.set_limits(concurrency=50, rate="200/s", tenant_concurrency=5, tenant_rate="60/m")
    q.set_tenant_limits("acme", concurrency=20, rate="100/s")
    lim = q.limits()
    assert lim == conveyor.QueueLimits(50, 200.0, 5, 1.0,
                                       {"acme": conveyor.TenantLimits(20, 100.0)})
    q.set_limits(rate=None)  # None removes, a left-out argument is unchanged
    assert q.limits().rate is None and q.limits().concurrency == 50
    q.set_tenant_limits("acme", rate=None)
    assert q.limits().tenants == {"acme": conveyor.TenantLimits(20, None)}
    for bad in ({"concurrency": -1}, {"concurrency": 1.5}, {"rate": "fast"}, {"rate": 0},
                {"tenant_rate": "5/d"}, {"concurrency": True}):
        with pytest.raises(conveyor.ConfigurationError):
            q.set_limits(**bad)
    with pytest.raises(conveyor.ConfigurationError):
        q.set_tenant_limits("", concurrency=1)
    assert q.limits().concurrency == 50


def test_paused_queue_through_the_handle(app: conveyor.Conveyor) -> None:
    q = app.queue(Q)
    enqueue(app, 2)
    q.pause()
    assert q.is_paused() and fetch(app).jobs == []
    q.resume()
    assert not q.is_paused() and len(fetch(app).jobs) == 2


def test_many_parked_tenants_cost_nothing_per_claim(app: conveyor.Conveyor) -> None:
    app.queue(Q).set_limits(tenant_concurrency=1)
    for t in range(200):
        enqueue(app, 3, tenant=f"t{t}x")
    assert len(fetch(app, 500).jobs) == 200
    k = app.keys(Q)
    assert app.redis.zcard(k.parked) == 200 and app.redis.zcard(k.priorities) == 0
    enqueue(app, 1, tenant="late")
    assert [j.short_id for j in fetch(app, 500).jobs] == ["late0"]


def test_held_counts_in_the_monitor_and_stats(app: conveyor.Conveyor) -> None:
    q = app.queue(Q)
    q.set_limits(tenant_concurrency=1)
    enqueue(app, 5, tenant="a")
    enqueue(app, 3, tenant="b")
    enqueue(app, 2, prefix="free")
    assert app.monitor.stats(queue=Q).backlog.held == 0  # nothing parked until a claim
    assert len(fetch(app, 50).jobs) == 4  # a, b and the two without a tenant
    flow = app.monitor.flow(Q)
    assert flow.held_by_tenant == {"a": 4, "b": 2} and flow.held == 6
    assert flow.running == 4 and flow.running_by_tenant == {"a": 1, "b": 1}
    assert app.monitor.stats(queue=Q).backlog.held == 6
    q.set_limits(concurrency=4)  # the queue itself at its cap: every ready job is held
    fetch(app, 50)
    assert app.monitor.flow(Q).blocked_by == "concurrency"
    assert app.monitor.backlog(Q).held == app.monitor.backlog(Q).ready == 6
    q.clear_limits()
    assert app.monitor.backlog(Q).held == 0


def test_advice_names_the_limit_and_asks_for_no_idle_workers(app: conveyor.Conveyor) -> None:
    from conveyor.monitor.advice import decide
    from conveyor.monitor.flow import FlowState
    from conveyor.monitor.stats import Backlog, Stats, Timing

    stats = Stats(task=None, queue=Q, window=60, span=60, enqueued=600, started=600,
                  succeeded=600, failed=0, retried=0, dead=0, throughput=10,
                  arrival_rate=10, wait=Timing(600, 30, 30, 60, 60),
                  run=Timing(600, 1, 1, 1, 1),
                  backlog=Backlog(ready=1000, held=1000), now=1000.0)
    import dataclasses

    free = decide(Q, dataclasses.replace(stats, backlog=Backlog(ready=1000)), 1.0, [], False,
                  10, None)
    capped = decide(Q, stats, 1.0, [], False, 10, None, flow=FlowState(
        Q, conveyor.QueueLimits(concurrency=8), ready=1000, held=1000, running=8,
        blocked_by="concurrency"))
    assert free.workers_needed > 1
    assert capped.workers_needed == 1  # 8 slots fit in one worker of 32
    assert any("concurrency cap of 8" in r for r in capped.reasons)
    assert any("held by the queue's concurrency cap" in r for r in capped.reasons)


def test_held_jobs_are_no_reason_to_scale_out(app: conveyor.Conveyor) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from conveyor.fleet.autoscale import SignalReader
    from conveyor.monitor.prometheus import RedisCollector

    enqueue(app, 30)
    reader = SignalReader(app, [Q], target_wait=1.0)
    assert reader.backlog(1_000_000.0)[0] == 30
    app.queue(Q).set_limits(concurrency=2)
    fetch(app, 50)  # two run; the queue is at its cap: the other 28 are held
    assert reader.backlog(1_000_000.0)[0] == 0  # nothing more workers could start
    registry = CollectorRegistry()
    registry.register(RedisCollector(app, queues=[Q]))
    text = generate_latest(registry).decode()
    assert f'conveyor_queue_held{{queue="{Q}"}} 28.0' in text


def test_mangled_limits_and_counts_never_wedge_the_queue(app: conveyor.Conveyor) -> None:
    q = app.queue(Q)
    q.set_limits(concurrency=5, tenant_concurrency=2, rate=100)
    k = app.keys(Q)
    app.redis.hset(k.limits, mapping={"concurrency": "lots", "r:a": "\xff", "c:b": "inf"})
    app.redis.hset(k.counts, "running", "x")
    app.redis.hset(k.running, "a", "junk")
    app.redis.hset(k.buckets, "", "not a bucket")
    enqueue(app, 3, tenant="a")
    jobs = fetch(app).jobs  # a bad value reads as no limit; bad counts start again from 0
    assert len(jobs) == 2
    finish(app, jobs)
    assert running(app) == (0, {})
    assert q.limits().concurrency is None and q.limits().tenant_concurrency == 2
    assert q.limits().tenants["b"].concurrency is None
    assert app.monitor.flow(Q).running == 0
