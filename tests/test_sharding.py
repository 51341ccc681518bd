"""Sharded queues: one queue spread over several hash tags (conveyor.sharding).

Checked against the contract: every job runs once wherever it was placed, a tenant's jobs
stay on one shard, the queue's concurrency cap holds for all shards together (also when
workers are killed holding jobs and while the count changes), and a higher priority on one
shard is not passed over for long by a lower one on another. The end-to-end tests run real
worker processes on the real 3-primary test cluster.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

import conveyor
from apps.flow_app import make_app, read_ledger
from conveyor import sharding
from conveyor.errors import ConfigurationError
from conveyor.scripts import calls
from helpers import FlowFleet, RedisCluster, run_async, running_worker, wait_until


def shard_of(job: conveyor.Job) -> str:
    return job.id.rpartition("~")[0]


@pytest.fixture
def sapp(redis_server, namespace) -> Iterator[conveyor.Conveyor]:
    application = conveyor.Conveyor(redis_server.url, namespace=namespace)

    @application.task(name="s.echo", queue="s")
    def echo(x: int) -> int:
        return x

    yield application
    application.close()


# -- the layout --------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, 65, "3", True, 2.0, None])
def test_a_bad_count_is_refused_and_changes_nothing(sapp: conveyor.Conveyor, bad: object) -> None:
    with pytest.raises(ConfigurationError, match="shards must be an integer from 1 to 64"):
        sapp.queue("s").set_shards(bad)  # type: ignore[arg-type]
    assert sapp.queue("s").shards() == 1


def test_counts_grow_shrink_and_retired_shards_stay_served(sapp: conveyor.Conveyor) -> None:
    q = sapp.queue("s")
    assert q.shards() == 1 and q.served() == ["s"]
    assert q.set_shards(3) == 3
    assert q.served() == ["s", "s~1", "s~2"]
    assert q.set_shards(2) == 2  # s~2 takes no new job, but may hold some: still served
    assert q.shards() == 2 and q.served() == ["s", "s~1", "s~2"]
    assert q.set_shards(4) == 4  # the retired shard comes back before a new one is made
    assert sharding.read_layout(sapp, "s").active == ("s", "s~1", "s~2", "s~3")
    assert q.set_shards(1) == 1
    assert q.served() == ["s", "s~1", "s~2", "s~3"]


def test_a_mangled_layout_sends_jobs_to_the_queue_and_hides_no_shard(
        sapp: conveyor.Conveyor) -> None:
    q = sapp.queue("s")
    q.set_shards(3)
    jobs = sapp.tasks["s.echo"].enqueue_many([(i,) for i in range(6)])
    sapp.redis.hset(sapp.keys("s").shards, mapping={"active": "{not json", "retired": "7"})
    assert q.shards() == 1
    # The shards that hold jobs are in the index of queues: still served.
    assert q.served() == ["s", "s~1", "s~2"]
    with running_worker(sapp, queues=["s"], concurrency=4, burst=False):
        assert [j.result(timeout=10) for j in jobs] == list(range(6))


def test_layout_names_only_shards_of_its_own_queue() -> None:
    layout = sharding.parse_layout("s", {b"active": b'["s~1", "other", "s", "s~1", 3]',
                                         b"retired": b'["s~2", "s~1", "t~1"]'})
    assert layout.active == ("s", "s~1")
    assert layout.retired == ("s~2",)


# -- where jobs go -----------------------------------------------------------------------


def test_jobs_are_spread_evenly_and_a_tenant_stays_on_one_shard(
        sapp: conveyor.Conveyor) -> None:
    echo = sapp.tasks["s.echo"]
    sapp.queue("s").set_shards(3)
    spread = collections.Counter(shard_of(j) for j in echo.enqueue_many([(i,) for i in range(300)]))
    assert spread == {"s": 100, "s~1": 100, "s~2": 100}
    singles = collections.Counter(shard_of(echo.enqueue(i)) for i in range(30))
    assert singles == {"s": 10, "s~1": 10, "s~2": 10}
    for tenant in ("acme", "globex", "initech"):
        placed = {shard_of(j) for j in echo.options(tenant=tenant).enqueue_many(
            [(i,) for i in range(20)])}
        assert len(placed) == 1
    tenants = {shard_of(echo.options(tenant=f"t{i}").enqueue(i)) for i in range(60)}
    assert tenants == {"s", "s~1", "s~2"}  # tenants themselves are spread


def test_a_dedupe_key_names_one_job_on_a_sharded_queue(sapp: conveyor.Conveyor) -> None:
    echo = sapp.tasks["s.echo"]
    sapp.queue("s").set_shards(4)
    for key in ("a", "b", "c", "d", "e"):
        first = echo.options(key=key).enqueue(1)
        assert {echo.options(key=key).enqueue(2).id for _ in range(5)} == {first.id}


def test_async_enqueues_are_placed_as_sync_ones(sapp: conveyor.Conveyor) -> None:
    echo = sapp.tasks["s.echo"]
    sapp.queue("s").set_shards(2)

    async def main() -> tuple[list[conveyor.Job], conveyor.Job]:
        many = await echo.aenqueue_many([(i,) for i in range(10)])
        one = await echo.options(tenant="acme").aenqueue(1)
        return many, one

    many, one = run_async(sapp, main())
    assert collections.Counter(shard_of(j) for j in many) == {"s": 5, "s~1": 5}
    assert shard_of(one) == shard_of(echo.options(tenant="acme").enqueue(2))


def test_on_a_cluster_new_shards_land_on_distinct_primaries(capp: conveyor.Conveyor) -> None:
    capp.queue("spread").set_shards(3)
    slots = capp.redis.nodes_manager.slots_cache
    owners = {slots[key_slot(capp.keys(s).tag[1:-1].encode())][0].name
              for s in capp.queue("spread").served()}
    assert len(owners) == 3


# -- the cap, shared out -----------------------------------------------------------------


@given(cap=st.integers(0, 50),
       shares=st.lists(st.tuples(st.integers(0, 20), st.integers(0, 200)), min_size=1,
                       max_size=8))
def test_targets_keep_each_shard_running_and_never_give_more_than_the_cap(
        cap: int, shares: list[tuple[int, int]]) -> None:
    want = sharding.targets(cap, shares)
    assert all(w >= running for w, (running, _) in zip(want, shares, strict=True))
    assert sum(want) <= max(cap, sum(running for running, _ in shares))
    if sum(running for running, _ in shares) <= cap:
        assert sum(want) == cap  # all of it is given out: nothing is left idle
        waiting = [ready for _, ready in shares]
        if sum(waiting) >= cap:  # jobs wait everywhere: none goes to a shard without
            assert all(w == running for w, (running, ready) in zip(want, shares, strict=True)
                       if ready == 0)


def test_a_round_older_than_one_a_shard_has_seen_writes_nothing(
        sapp: conveyor.Conveyor) -> None:
    k = sapp.keys("s")
    assert not sapp.scripts.run(calls.shard_allot(k, 5, 3)).stale
    stale = sapp.scripts.run(calls.shard_allot(k, 4, 9))
    assert stale.stale and stale.share == 3
    assert sapp.redis.hget(k.limits, "concurrency") == b"3"
    with pytest.raises(Exception, match="shard_allot: needs an epoch"):
        sapp.scripts.run(calls.shard_allot(k, 0, 1))


def test_rounds_racing_each_other_never_share_out_more_than_the_cap(
        sapp: conveyor.Conveyor) -> None:
    """Rounds that run at once (each one's lock lapsed under the next) interleave their
    writes; after every write the shares add up to no more than the cap."""
    q = sapp.queue("s")
    q.set_shards(4)
    q.set_limits(concurrency=10)
    echo = sapp.tasks["s.echo"]
    shards = q.served()
    sums: list[int] = []

    def total() -> int:
        return sum(int(sapp.redis.hget(sapp.keys(s).limits, "concurrency") or 0)
                   for s in shards)

    async def main() -> None:
        client, runner = sapp.aredis(), sapp.ascripts()
        for round_ in range(40):
            # The backlog moves between shards, so each round wants other shares.
            echo.options(tenant=f"t{round_}").enqueue_many([(i,) for i in range(round_ % 7)])
            await client.delete(sapp.keys("s").shards_lock)

            async def one() -> None:
                await client.delete(sapp.keys("s").shards_lock)
                await sharding.rebalance(sapp, client, runner, "s", shards)
                sums.append(total())

            await asyncio.gather(*(one() for _ in range(3)))

    run_async(sapp, main())
    assert max(sums) <= 10
    assert total() >= 1


# -- workers on the real cluster ---------------------------------------------------------


@pytest.fixture
def fleet_app(session_cluster: RedisCluster, namespace: str) -> Iterator[conveyor.Conveyor]:
    application = make_app(session_cluster.url, namespace)
    yield application
    application.close()


@pytest.fixture
def fleet(fleet_app: conveyor.Conveyor, tmp_path: Path) -> Iterator[FlowFleet]:
    f = FlowFleet(fleet_app, tmp_path)
    yield f
    f.stop()


def overlap(runs: list, seconds: float) -> int:
    """Most runs in progress at once; a run that never ended (its worker was killed)
    counts as running for the whole of its body's time, the longest it could have."""
    events: list[tuple[float, int]] = []
    for run in runs:
        events += [(run.start, 1), (run.end if run.end is not None else run.start + seconds, -1)]
    events.sort()
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


@pytest.mark.xdist_group("shard-fleet")
def test_the_cap_holds_across_shards_and_workers_killed_holding_jobs(
        fleet_app: conveyor.Conveyor, fleet: FlowFleet) -> None:
    q = fleet_app.queue("flow")
    q.set_shards(3)
    q.set_limits(concurrency=5)
    work = fleet_app.tasks["flow.work"]
    fleet.start(3, concurrency=8)
    jobs = work.enqueue_many([(f"j{i}", 0.3) for i in range(90)])
    assert len({shard_of(j) for j in jobs}) == 3
    wait_until(lambda: len(read_ledger(fleet_app.redis, fleet_app.namespace)) >= 10,
               timeout=60, message="the first runs")
    for _ in range(2):  # a SIGKILL storm: workers die holding jobs, others take over
        fleet.kill_one()
        fleet.start(1, concurrency=8)
        time.sleep(0.5)
    for job in jobs:
        assert job.result(timeout=120).startswith("j")
    runs = read_ledger(fleet_app.redis, fleet_app.namespace)
    assert {r.label for r in runs} == {f"j{i}" for i in range(90)}  # none lost
    assert 4 <= overlap(runs, 0.3) <= 5  # the whole queue's cap, used, never one per shard
    assert max(collections.Counter(r.label for r in runs).values()) <= 2  # lost leases only


@pytest.mark.xdist_group("shard-fleet")
def test_changing_the_count_while_jobs_flow_loses_and_repeats_nothing(
        fleet_app: conveyor.Conveyor, fleet: FlowFleet) -> None:
    q = fleet_app.queue("flow")
    work = fleet_app.tasks["flow.work"]
    fleet.start(2, concurrency=8)
    sent: list[conveyor.Job] = []
    stop = threading.Event()

    def produce() -> None:
        i = 0
        while not stop.is_set():
            sent.extend(work.enqueue_many([(f"p{i + n}", 0.0) for n in range(5)]))
            i += 5
            time.sleep(0.02)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        for count in (3, 2, 5, 1, 4):
            time.sleep(1.0)
            q.set_shards(count)
    finally:
        stop.set()
        producer.join(30)
    for job in sent:
        job.result(timeout=120)
    runs = read_ledger(fleet_app.redis, fleet_app.namespace)
    counts = collections.Counter(r.label for r in runs)
    assert set(counts) == {f"p{i}" for i in range(len(sent))}  # lost = 0
    assert max(counts.values()) == 1  # no worker died: no job ran twice
    assert len({shard_of(j) for j in sent}) == 5  # every shard took some


# -- priorities across shards ------------------------------------------------------------


def test_a_higher_priority_on_one_shard_goes_before_a_lower_one_on_another(
        sapp: conveyor.Conveyor) -> None:
    started: list[int] = []

    @sapp.task(name="s.note", queue="p")
    def note(priority: int) -> None:
        started.append(priority)

    sapp.queue("p").set_shards(2)
    low = note.options(priority=2, tenant="low")  # the two tenants live on two shards
    high_tenant = next(f"h{i}" for i in range(100)
                       if sharding.place(sharding.read_layout(sapp, "p"), f"h{i}", None, 0)
                       != sharding.place(sharding.read_layout(sapp, "p"), "low", None, 0))
    high = note.options(priority=8, tenant=high_tenant)
    low.enqueue_many([(2,) for _ in range(10)])
    high.enqueue_many([(8,) for _ in range(10)])
    with running_worker(sapp, queues=["p"], concurrency=1):
        wait_until(lambda: len(started) == 20, timeout=20, message="every job")
    # Until the worker has fetched from both shards it does not know which holds what: one
    # low job may go before the high ones; every other high one goes before every other low.
    last_high = max(i for i, priority in enumerate(started) if priority == 8)
    assert started[:last_high].count(2) <= 1, started


def test_workers_keep_serving_a_queue_whose_shards_came_after_them(
        sapp: conveyor.Conveyor) -> None:
    echo = sapp.tasks["s.echo"]
    with running_worker(sapp, queues=["s"], concurrency=4) as worker:
        sapp.queue("s").set_shards(3)
        jobs = echo.enqueue_many([(i,) for i in range(30)])
        assert sorted(j.result(timeout=20) for j in jobs) == list(range(30))
        assert set(worker.queues) == {"s", "s~1", "s~2"}


def test_a_sharded_queue_pauses_and_resumes_as_one(sapp: conveyor.Conveyor) -> None:
    q = sapp.queue("s")
    q.set_shards(3)
    q.pause()
    assert all(sapp.redis.exists(sapp.keys(s).paused) for s in q.served())
    jobs = sapp.tasks["s.echo"].enqueue_many([(i,) for i in range(6)])
    with running_worker(sapp, queues=["s"], concurrency=4):
        time.sleep(0.3)
        assert all(j.info().state == "ready" for j in jobs)  # paused everywhere
        q.resume()
        assert sorted(j.result(timeout=10) for j in jobs) == list(range(6))


def test_limits_read_back_as_the_whole_queue_s(sapp: conveyor.Conveyor) -> None:
    q = sapp.queue("s")
    q.set_limits(concurrency=6, rate="30/s", tenant_concurrency=2)
    q.set_shards(3)
    limits = q.limits()
    assert (limits.concurrency, limits.rate, limits.tenant_concurrency) == (6, 30.0, 2)
    for shard in q.served():
        fields = sapp.redis.hgetall(sapp.keys(shard).limits)
        assert fields[b"rate"] == b"10.0"  # the rate, split evenly
        assert fields[b"tenant_concurrency"] == b"2"  # a tenant lives on one shard
    q.set_limits(concurrency=None)
    assert q.limits().concurrency is None
    assert all(sapp.redis.hget(sapp.keys(s).limits, "concurrency") is None for s in q.served())


def test_a_counter_gone_back_is_moved_past_what_the_shards_have_seen(
        sapp: conveyor.Conveyor) -> None:
    """The counter of rounds lives on the queue's node, each shard's newest round on its
    own: a node restarted from an older copy gives numbers the shards refuse, and the
    round that meets the refusal moves the counter past them."""
    q = sapp.queue("s")
    q.set_shards(3)
    q.set_limits(concurrency=6)
    shards = q.served()
    for shard in shards:
        sapp.scripts.run(calls.shard_allot(sapp.keys(shard), 500))
    sapp.redis.set(sapp.keys("s").shards_epoch, 7)

    async def rounds() -> list[int | None]:
        client, runner = sapp.aredis(), sapp.ascripts()
        return [await sharding.rebalance(sapp, client, runner, "s", shards) for _ in range(2)]

    first, second = run_async(sapp, rounds())
    assert first is None and second is not None  # refused, and the counter moved past
    assert sum(int(sapp.redis.hget(sapp.keys(s).limits, "concurrency") or 0)
               for s in shards) == 6


def test_growing_never_gives_the_shards_more_than_the_rate(sapp: conveyor.Conveyor) -> None:
    q = sapp.queue("s")
    q.set_limits(rate="12/s")
    for count in (2, 4, 3, 6):
        q.set_shards(count)
        parts = [float(sapp.redis.hget(sapp.keys(s).limits, "rate") or 0) for s in q.served()]
        assert sum(parts) == pytest.approx(12.0)
        assert len(set(parts)) == 1
    assert q.limits().rate == 12.0


def test_purging_a_sharded_queue_cancels_the_ready_jobs_of_every_shard(
        sapp: conveyor.Conveyor) -> None:
    q = sapp.queue("s")
    q.set_shards(3)
    jobs = sapp.tasks["s.echo"].enqueue_many([(i,) for i in range(9)])
    assert q.purge_ready() == 9
    assert {j.info().state for j in jobs} == {"cancelled"}


def test_a_lost_layout_leaves_the_shares_as_they_are(sapp: conveyor.Conveyor) -> None:
    """A layout gone (a hand edit, a copy of the data older than the sharding) tells no
    cap: a round then moves nothing, rather than take the cap away from every shard."""
    q = sapp.queue("s")
    q.set_shards(3)
    q.set_limits(concurrency=6)
    sapp.tasks["s.echo"].enqueue_many([(i,) for i in range(9)])
    shards = q.served()

    async def one() -> int | None:
        return await sharding.rebalance(sapp, sapp.aredis(), sapp.ascripts(), "s", shards)

    assert run_async(sapp, one())
    before = [sapp.redis.hget(sapp.keys(s).limits, "concurrency") for s in shards]
    assert sum(int(b or 0) for b in before) == 6
    sapp.redis.delete(sapp.keys("s").shards)
    assert run_async(sapp, one()) == 0
    assert [sapp.redis.hget(sapp.keys(s).limits, "concurrency") for s in shards] == before


def test_delays_debounce_cancel_progress_steps_and_workflows_work_on_a_sharded_queue(
        sapp: conveyor.Conveyor) -> None:
    from conveyor import current_job

    calls_of: collections.Counter[str] = collections.Counter()
    release = threading.Event()

    @sapp.task(name="s.work", queue="w")
    def work(label: str) -> str:
        ctx = current_job()
        ctx.progress(0.5, "half")
        ctx.step("once", lambda: calls_of.update([label]))
        if label == "slow":
            release.wait(10)
        return label

    q = sapp.queue("w")
    q.set_shards(3)
    delayed = [work.options(delay=0.3).enqueue(f"d{i}") for i in range(6)]
    debounced = [work.options(key="deb", debounce=0.3).enqueue(f"b{i}") for i in range(3)]
    assert len({j.id for j in debounced}) == 1
    doomed = [work.options(delay=30).enqueue(f"c{i}") for i in range(3)]
    wf = sapp.workflow()
    first = wf.add(work, "w1")
    wf.add(work, "w2", after=first)
    handle = wf.enqueue()
    slow = work.enqueue("slow")
    assert len({shard_of(j) for j in delayed}) == 3 and len({shard_of(j) for j in doomed}) == 3
    assert all(j.cancel() for j in doomed)
    with running_worker(sapp, queues=["w"], concurrency=4):
        assert sorted(j.result(timeout=10) for j in delayed) == [f"d{i}" for i in range(6)]
        assert debounced[0].result(timeout=10) == "b2"  # the latest arguments
        wait_until(lambda: slow.info().progress == 0.5, timeout=10, message="progress")
        release.set()
        assert slow.result(timeout=10) == "slow"
        assert sorted(handle.result(timeout=10).values()) == ["w1", "w2"]
    assert {j.info().state for j in doomed} == {"cancelled"}
    assert calls_of["slow"] == 1 and calls_of["w2"] == 1


def test_a_cap_written_over_moves_no_share(sapp: conveyor.Conveyor) -> None:
    q = sapp.queue("s")
    q.set_shards(2)
    q.set_limits(concurrency=4)
    shards = q.served()

    async def one() -> int | None:
        return await sharding.rebalance(sapp, sapp.aredis(), sapp.ascripts(), "s", shards)

    run_async(sapp, one())
    before = [sapp.redis.hget(sapp.keys(s).limits, "concurrency") for s in shards]
    sapp.redis.hset(sapp.keys("s").shards, "concurrency", "four")
    assert sharding.read_layout(sapp, "s").garbled
    assert run_async(sapp, one()) == 0
    assert [sapp.redis.hget(sapp.keys(s).limits, "concurrency") for s in shards] == before


def test_on_the_cluster_a_tenant_and_a_priority_wait_for_no_other_shard_s_backlog(
        capp: conveyor.Conveyor) -> None:
    """On the 3-primary cluster: a backlog of one tenant on one shard holds back neither
    another tenant's jobs on another shard nor a higher priority on a third."""
    started: dict[str, float] = {}

    @capp.task(name="s.timed", queue="fair")
    async def timed(label: str) -> None:
        started[label] = time.time()
        await asyncio.sleep(0.005)

    q = capp.queue("fair")
    q.set_shards(3)
    layout = sharding.read_layout(capp, "fair")
    by_shard: dict[str, str] = {}
    for i in range(200):
        by_shard.setdefault(sharding.place(layout, f"t{i}", None, 0), f"t{i}")
    heavy, light, urgent = (by_shard[s] for s in layout.active)
    timed.options(tenant=heavy, priority=2).enqueue_many([(f"h{i}",) for i in range(1500)])
    with running_worker(capp, queues=["fair"], concurrency=4):
        wait_until(lambda: len(started) >= 50, timeout=20, message="the backlog under way")
        sent = time.time()
        timed.options(tenant=light, priority=2).enqueue_many([(f"l{i}",) for i in range(5)])
        timed.options(tenant=urgent, priority=8).enqueue_many([(f"u{i}",) for i in range(5)])
        wait_until(lambda: all(f"l{i}" in started and f"u{i}" in started for i in range(5)),
                   timeout=20, message="the light and urgent jobs")
        backlog_left = sum(f"h{i}" not in started for i in range(1500))
    assert backlog_left > 500  # they did not wait for the backlog to drain
    assert max(started[f"u{i}"] for i in range(5)) - sent < 0.5
    assert max(started[f"l{i}"] for i in range(5)) - sent < 1.0
