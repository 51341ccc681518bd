"""Each Lua script alone, through its typed wrapper, against a real redis-server."""

from __future__ import annotations

import pytest
import redis

import conveyor
from conveyor.scripts import calls, max_items
from conveyor.sink import stream_events

Q = "q"


@pytest.fixture
def app(app_on_each: conveyor.Conveyor) -> conveyor.Conveyor:
    """Every test here runs on a plain server and on a 3-primary Cluster, where a script
    that reaches a key outside its queue's hash slot fails."""
    return app_on_each


Job = tuple[calls.JobSpec, tuple[str, bytes]]


def new(short: str, priority: int = 5, tenant: str = "", **kw: object) -> Job:
    spec = calls.JobSpec(task="t", priority=priority, tenant=tenant, **kw)  # type: ignore[arg-type]
    return spec, (short, b"[[]]")


def enqueue(app: conveyor.Conveyor, *jobs: Job, now: float | None = None) -> list:
    """One script call per job (a call shares its options across its jobs)."""
    out = []
    for spec, job in jobs:
        out += app.scripts.run(calls.enqueue(app.keys(Q), spec, [job], app.limits, now=now))
    return out


def fetch(app: conveyor.Conveyor, count: int = 10, now: float | None = None) -> calls.Fetched:
    return app.scripts.run(calls.fetch(app.keys(Q), count, app.limits, now=now))


def finish(app: conveyor.Conveyor, *outcomes: calls.Outcome, now: float | None = None):
    return app.scripts.run(calls.finish(app.keys(Q), outcomes, app.limits, now=now))


def began(app: conveyor.Conveyor, *jobs: calls.Leased, now: float | None = None) -> list[int]:
    """Tell Redis that the runs of ``jobs`` began, as a worker's heartbeat does."""
    leases = [(j.short_id, j.token, j.visibility_ms, True) for j in jobs]
    return app.scripts.run(calls.heartbeat(app.keys(Q), leases, now=now))


def state(app: conveyor.Conveyor, short: str) -> str:
    return app.redis.hget(app.keys(Q).job(short), "s").decode()


def test_enqueue_stores_record_and_wakes(app: conveyor.Conveyor) -> None:
    assert enqueue(app, new("a"), new("b")) == [("a", True), ("b", True)]
    k = app.keys(Q)
    assert state(app, "a") == "ready"
    assert int(app.redis.hget(k.counts, "ready")) == 2
    assert app.redis.llen(k.wake) == 1


def test_enqueue_validates_before_writing(app: conveyor.Conveyor) -> None:
    with pytest.raises(redis.ResponseError, match="priority must be an integer 0-9"):
        enqueue(app, new("b", priority=12))
    spec = calls.JobSpec(task="t", key="k")
    call = calls.enqueue(app.keys(Q), spec, [("a", b"[[]]"), ("c", b"[[]]")], app.limits)
    with pytest.raises(redis.ResponseError, match="a dedupe key names one job"):
        app.scripts.run(call)
    assert app.redis.keys(f"*{app.namespace}*") == []


def test_enqueue_batch_shares_options_and_keeps_order(app: conveyor.Conveyor) -> None:
    spec = calls.JobSpec(task="t", priority=7, tenant="acme", max_attempts=2)
    jobs = [(f"j{i}", b"[[%d]]" % i) for i in range(max_items("enqueue"))]  # as many as fit
    reply = app.scripts.run(calls.enqueue(app.keys(Q), spec, jobs, app.limits))
    assert [short for short, _ in reply] == [j for j, _ in jobs]
    k = app.keys(Q)
    assert app.redis.lrange(k.ready_prefix + "7:acme", 0, -1) == [j.encode() for j, _ in jobs]
    assert app.redis.lrange(k.ring_prefix + "7", 0, -1) == [b"acme"]
    assert int(app.redis.hget(k.counts, "ready")) == len(jobs)
    info = app.job(f"{Q}~j9").info()
    assert (info.priority, info.tenant, info.max_attempts) == (7, "acme", 2)
    assert info.run_at == info.enqueued_at


def test_enqueue_with_delay_is_scheduled(app: conveyor.Conveyor) -> None:
    enqueue(app, new("a", delay_ms=5000), now=1_000_000)
    assert state(app, "a") == "scheduled"
    assert app.redis.zscore(app.keys(Q).delayed, "a") == 1_005_000
    assert fetch(app, now=1_004_999).jobs == []
    got = fetch(app, now=1_005_000)
    assert [j.short_id for j in got.jobs] == ["a"]


def test_dedupe_key_returns_unfinished_job(app: conveyor.Conveyor) -> None:
    assert enqueue(app, new("a", key="k")) == [("a", True)]
    assert enqueue(app, new("b", key="k")) == [("a", False)]
    job = fetch(app).jobs[0]
    finish(app, calls.Outcome("a", job.token, "ok", 1.0, b"1"))
    assert enqueue(app, new("c", key="k")) == [("c", True)]


def test_fetch_orders_by_priority_then_fifo(app: conveyor.Conveyor) -> None:
    enqueue(app, new("low1", 1), new("high1", 9), new("low2", 1), new("high2", 9), new("mid", 5))
    got = [j.short_id for j in fetch(app, 10).jobs]
    assert got == ["high1", "high2", "mid", "low1", "low2"]


def test_fetch_round_robins_tenants(app: conveyor.Conveyor) -> None:
    enqueue(app, *[new(f"a{i}", tenant="a") for i in range(5)], new("b0", tenant="b"),
            new("b1", tenant="b"), new("c0", tenant="c"))
    got = [j.short_id for j in fetch(app, 6).jobs]
    assert got == ["a0", "b0", "c0", "a1", "b1", "a2"]


def test_fetch_leases_with_fresh_tokens(app: conveyor.Conveyor) -> None:
    enqueue(app, new("a", visibility_ms=1000), new("b"))
    got = fetch(app, 2, now=5000).jobs
    assert len({j.token for j in got}) == 2
    assert got[0].attempts == 1
    assert app.redis.zscore(app.keys(Q).leases, "a") == 6000
    assert int(app.redis.hget(app.keys(Q).active, "t")) == 2


def test_due_delayed_job_goes_ahead_of_waiting_jobs(app: conveyor.Conveyor) -> None:
    enqueue(app, new("late", delay_ms=100), now=1000)
    enqueue(app, new("x1"), new("x2"), now=1050)
    got = [j.short_id for j in fetch(app, 3, now=1200).jobs]
    assert got == ["late", "x1", "x2"]


def test_expired_lease_is_reclaimed_and_old_token_refused(app: conveyor.Conveyor) -> None:
    enqueue(app, new("a", visibility_ms=1000), now=0)
    first = fetch(app, now=0).jobs[0]
    began(app, first, now=10)
    second = fetch(app, now=2000).jobs[0]  # the lease ran out: another worker takes it
    assert second.short_id == "a" and second.attempts == 2 and second.token != first.token
    done = finish(app, calls.Outcome("a", first.token, "ok", 0.5, b"1"), now=2100)
    assert done.codes == [calls.FINISH_REFUSED]
    done = finish(app, calls.Outcome("a", second.token, "ok", 2.0, b"2"), now=2100)
    assert done.codes == [calls.FINISH_SUCCEEDED]
    assert app.job(f"{Q}~a").info().result == 2


def test_a_lease_lost_before_its_run_was_told_to_begin_gives_its_attempt_back(
        app: conveyor.Conveyor) -> None:
    # DESIGN 5: an attempt is charged only for a run that started. A worker tells Redis
    # that a run began with a heartbeat; a lease lost before that (the worker died with the
    # job still waiting for a slot) costs no attempt, also on the last attempt.
    enqueue(app, new("a", visibility_ms=10, max_attempts=1), now=0)
    first = fetch(app, now=0).jobs[0]
    assert not first.confirm
    again = fetch(app, now=100)
    assert again.dead == [] and [j.short_id for j in again.jobs] == ["a"]
    second = again.jobs[0]
    assert second.attempts == 1 and second.confirm  # its next run tells its start first
    record = app.redis.hgetall(app.keys(Q).job_prefix + "a")
    assert record[b"lost"] == b"1" and record[b"lu"] == b"1"
    # A told start of a stale lease marks nothing; the current lease's does.
    assert began(app, first, now=101) == [calls.BEAT_LOST]
    assert b"rs" not in app.redis.hgetall(app.keys(Q).job_prefix + "a")
    assert began(app, second, now=101) == [calls.BEAT_KEPT]
    got = fetch(app, now=1000)  # told, then lost: charged, and this was the last attempt
    assert got.dead == ["a"]
    info = app.job(f"{Q}~a").info()
    assert info.attempts == 1 and "lease expired" in (info.error or "")


def test_lost_lease_on_last_attempt_goes_dead(app: conveyor.Conveyor) -> None:
    enqueue(app, new("a", visibility_ms=10, max_attempts=1), now=0)
    began(app, *fetch(app, now=0).jobs, now=1)
    got = fetch(app, now=100)
    assert got.dead == ["a"] and got.jobs == []
    info = app.job(f"{Q}~a").info()
    assert info.state == conveyor.JobState.DEAD
    assert "lease expired" in (info.error or "")
    assert app.monitor.active("t") == 0


def test_finish_retry_then_dead(app: conveyor.Conveyor) -> None:
    stream_events(app, Q)
    enqueue(app, new("a", max_attempts=2), now=0)
    job = fetch(app, now=0).jobs[0]
    done = finish(app, calls.Outcome("a", job.token, "retry", 0.0, "boom", 500), now=10)
    assert done.codes == [calls.FINISH_RETRYING]
    assert state(app, "a") == "retrying"
    assert app.redis.zscore(app.keys(Q).delayed, "a") == 510
    job = fetch(app, now=510).jobs[0]
    assert job.attempts == 2
    done = finish(app, calls.Outcome("a", job.token, "retry", 0.6, "boom again", 500), now=600)
    assert done.codes == [calls.FINISH_DEAD]
    assert app.redis.zscore(app.keys(Q).dead, "a") == 600
    assert app.redis.xlen(app.keys(Q).events) == 1


def test_dead_letters_are_capped(app: conveyor.Conveyor) -> None:
    app.limits = calls.Limits(dead_cap=2)
    enqueue(app, *[new(f"j{i}", max_attempts=1) for i in range(3)], now=0)
    jobs = fetch(app, 3, now=0).jobs
    done = finish(app, *[calls.Outcome(j.short_id, j.token, "dead", 0.0, "x") for j in jobs],
                  now=1)
    assert done.trimmed == ["j0"] or len(done.trimmed) == 1
    assert app.redis.zcard(app.keys(Q).dead) == 2


def test_heartbeat_extends_only_current_leases(app: conveyor.Conveyor) -> None:
    enqueue(app, new("a", visibility_ms=1000), now=0)
    job = fetch(app, now=0).jobs[0]
    k = app.keys(Q)
    leases = [("a", job.token, 5000), ("a", "stale", 9)]
    codes = app.scripts.run(calls.heartbeat(k, leases, now=500))
    assert codes == [1, 0]
    assert app.redis.zscore(k.leases, "a") == 5500


def test_release_hands_back_without_charging_an_attempt(app: conveyor.Conveyor) -> None:
    enqueue(app, new("a"), new("b"))
    jobs = fetch(app, 1).jobs
    assert app.scripts.run(calls.release(app.keys(Q), [("a", jobs[0].token)])) == 1
    again = fetch(app, 2).jobs
    assert [j.short_id for j in again] == ["a", "b"]
    assert again[0].attempts == 1


def test_cancel_ready_and_scheduled_but_not_active(app: conveyor.Conveyor) -> None:
    enqueue(app, new("r"), new("s", delay_ms=10_000), new("x"))
    k = app.keys(Q)
    assert app.scripts.run(calls.cancel(k, "s", app.limits)) == "scheduled"
    assert app.scripts.run(calls.cancel(k, "r", app.limits)) == "ready"
    assert [j.short_id for j in fetch(app, 5).jobs] == ["x"]
    assert app.scripts.run(calls.cancel(k, "x", app.limits)) == "active"
    assert state(app, "x") == "active"
    assert int(app.redis.hget(k.counts, "ready")) == 0


def test_a_cancelled_ready_record_outlives_its_list_entry(app: conveyor.Conveyor) -> None:
    # Were the record to expire while its id is still listed, the fetch that pops the id
    # would take it off the ready count a second time (found by the model-based test).
    enqueue(app, new("c"), new("r"))
    k = app.keys(Q)
    assert app.scripts.run(calls.cancel(k, "c", app.limits)) == "ready"
    assert app.redis.ttl(k.job("c")) == -1
    assert [j.short_id for j in fetch(app, 1).jobs] == ["r"]
    assert 0 < app.redis.ttl(k.job("c")) <= app.limits.retention
    assert int(app.redis.hget(k.counts, "ready")) == 0


def test_requeue_and_purge_dead(app: conveyor.Conveyor) -> None:
    enqueue(app, *[new(f"j{i}", max_attempts=1) for i in range(3)])
    jobs = fetch(app, 3).jobs
    finish(app, *[calls.Outcome(j.short_id, j.token, "dead", 0.0, "x") for j in jobs])
    k = app.keys(Q)
    assert app.scripts.run(calls.requeue_dead(k, ["j1"])) == 1
    assert [j.short_id for j in fetch(app, 5).jobs] == ["j1"]
    assert app.scripts.run(calls.purge_dead(k, 1)) == 1
    assert app.scripts.run(calls.purge_dead(k, 10)) == 1
    assert app.redis.zcard(k.dead) == 0 and app.redis.exists(k.job("j0")) == 0


def test_paused_queue_hands_out_nothing(app: conveyor.Conveyor) -> None:
    enqueue(app, new("a"))
    app.redis.set(app.keys(Q).paused, 1)
    assert fetch(app).jobs == []
    app.redis.delete(app.keys(Q).paused)
    assert len(fetch(app).jobs) == 1


def test_active_counter_never_negative_after_manual_delete(app: conveyor.Conveyor) -> None:
    enqueue(app, new("a"))
    job = fetch(app).jobs[0]
    app.redis.delete(app.keys(Q).active)
    finish(app, calls.Outcome("a", job.token, "ok", 0.0, b"1"))
    assert app.monitor.active("t") == 0
    assert int(app.redis.hget(app.keys(Q).active, "t")) == 0


TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def events(app: conveyor.Conveyor) -> dict[str, dict[bytes, bytes]]:
    """The queue's finished-job events by short id."""
    return {f[b"id"].decode(): f for _, f in app.redis.xrange(app.keys(Q).events)}


def test_trace_id_is_stored_only_when_given_and_validated(app: conveyor.Conveyor) -> None:
    with pytest.raises(redis.ResponseError, match="trace must be empty or 32 hex digits"):
        enqueue(app, new("bad", trace="not-a-trace"))
    with pytest.raises(redis.ResponseError, match="trace must be empty or 32 hex digits"):
        enqueue(app, new("bad", trace=TRACE + "0"))
    assert app.redis.keys(f"*{app.namespace}*") == []  # refused before any write
    enqueue(app, new("traced", trace=TRACE), new("plain"))
    k = app.keys(Q)
    assert app.redis.hget(k.job("traced"), "tr") == TRACE.encode()
    assert not app.redis.hexists(k.job("plain"), "tr")  # nothing stored without tracing


def test_every_finished_event_carries_the_trace_id(app: conveyor.Conveyor) -> None:
    # finish: succeeded, and dead after its last attempt failed (the trace of the enqueue
    # is the job's, whatever attempt ends it); plain jobs' events have no trace field.
    stream_events(app, Q)
    enqueue(app, new("ok", trace=TRACE), new("fails", trace=TRACE, max_attempts=1),
            new("plain"), now=0)
    leased = {j.short_id: j for j in fetch(app, now=0).jobs}
    finish(app, calls.Outcome("ok", leased["ok"].token, "ok", 0.0, b"1"),
           calls.Outcome("fails", leased["fails"].token, "retry", 0.0, "boom"),
           calls.Outcome("plain", leased["plain"].token, "ok", 0.0, b"1"), now=100)
    # dead_letter: a lost lease on the last attempt; cancel_lapsed: a running job whose
    # holder died after it was asked to cancel.
    enqueue(app, new("lost", trace=TRACE, visibility_ms=10, max_attempts=1),
            new("lapsed", trace=TRACE, visibility_ms=10), now=200)
    began(app, *fetch(app, now=200).jobs, now=200)
    assert app.scripts.run(calls.cancel(app.keys(Q), "lapsed", app.limits, now=201)) == "active"
    got = fetch(app, now=1000)
    assert got.dead == ["lost"]
    seen = events(app)
    assert {s: f[b"state"] for s, f in seen.items()} == {
        "ok": b"succeeded", "fails": b"dead", "plain": b"succeeded", "lost": b"dead",
        "lapsed": b"cancelled"}
    for short in ("ok", "fails", "lost", "lapsed"):
        assert seen[short][b"trace"] == TRACE.encode(), short
    assert b"trace" not in seen["plain"]


def test_a_run_never_began_after_the_finish_that_ends_it(app: conveyor.Conveyor) -> None:
    # The worker sends when a run began by its reckoning of the server clock, which may run
    # a little ahead: the record never shows a start later than the finish.
    enqueue(app, new("ahead"), new("behind"), now=1_000)
    leased = {j.short_id: j for j in fetch(app, now=1_000).jobs}
    finish(app, calls.Outcome("ahead", leased["ahead"].token, "ok", 2.5, b"1"),
           calls.Outcome("behind", leased["behind"].token, "ok", 1.5, b"1"), now=2_000)
    ahead, behind = app.job(f"{Q}~ahead").info(), app.job(f"{Q}~behind").info()
    assert ahead.started_at == ahead.finished_at == 2.0
    assert (behind.started_at, behind.finished_at) == (1.5, 2.0)


def test_a_run_that_goes_on_under_a_new_lease_costs_one_attempt(app: conveyor.Conveyor) -> None:
    # A worker whose heartbeats failed past the lease leases the same job again while its
    # run goes on: the run's start was told (and charged when the lease was reclaimed),
    # so the new lease tells that the run continues and its attempt is given back, once.
    enqueue(app, new("a", visibility_ms=1000), now=0)
    first = fetch(app, now=0).jobs[0]
    began(app, first, now=10)
    second = fetch(app, now=2000).jobs[0]
    assert second.attempts == 2
    k = app.keys(Q)
    go_on = calls.heartbeat(k, [("a", second.token, 1000, calls.CONTINUED)], now=2001)
    assert app.scripts.run(go_on) == [calls.BEAT_KEPT]
    assert app.redis.hget(k.job_prefix + "a", "attempts") == b"1"
    again = calls.heartbeat(k, [("a", second.token, 1000, calls.CONTINUED)], now=2002)
    assert app.scripts.run(again) == [calls.BEAT_KEPT]  # told before: nothing more given back
    assert app.redis.hget(k.job_prefix + "a", "attempts") == b"1"
    done = finish(app, calls.Outcome("a", second.token, "ok", 0.0, b"1"), now=2100)
    assert done.codes == [calls.FINISH_SUCCEEDED]
    assert app.job(f"{Q}~a").info().attempts == 1


def test_a_script_that_reaches_outside_its_queue_slot_fails_on_the_cluster(
        app: conveyor.Conveyor) -> None:
    """Why this module runs on a Cluster too: a key a script derives outside its queue's
    hash tag works on a plain server and fails there."""
    reach = app.redis.register_script(
        "#!lua\nredis.call('SET', KEYS[1], 1)\nredis.call('SET', ARGV[1], 1)\nreturn 1")
    k = app.keys(Q)
    probe = k.job_prefix + "probe"  # a key of the queue's slot
    inside, outside = k.job_prefix + "other", f"{app.namespace}:no-tag:probe"
    assert reach(keys=[probe], args=[inside]) == 1
    if isinstance(app.redis, redis.cluster.RedisCluster):
        with pytest.raises(redis.ResponseError, match=r"non local key|same slot"):
            reach(keys=[probe], args=[outside])
    else:
        assert reach(keys=[probe], args=[outside]) == 1
