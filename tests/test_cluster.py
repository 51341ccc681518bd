"""The same code on a real Redis Cluster: three primaries, queues spread over them.

Each queue's keys share its hash tag, so each script call lands on the node owning that
tag's slot; these tests pick queue names whose tags land on different nodes and check it
with the servers' own CLUSTER KEYSLOT and CLUSTER SLOTS.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
import redis
import redis.asyncio.cluster
import redis.cluster

import conveyor
from conveyor import clients
from conveyor.worker import wake
from helpers import RedisCluster, running_worker, wait_until


def spread_queues(app: conveyor.Conveyor, cluster: RedisCluster) -> list[str]:
    """One queue name per node: names whose hash tags land on distinct primaries."""
    by_node: dict[int, str] = {}
    for i in range(200):
        name = f"q{i}"
        by_node.setdefault(cluster.node_of(app.keys(name).tag), name)
        if len(by_node) == len(cluster.nodes):
            break
    assert len(by_node) == len(cluster.nodes), "no queue names cover every node"
    return [by_node[node.port] for node in cluster.nodes]


def test_a_cluster_url_makes_cluster_clients(capp: conveyor.Conveyor) -> None:
    assert isinstance(capp.redis, redis.cluster.RedisCluster)
    assert not capp.scripts.pipelined

    async def async_client_kind() -> object:
        client = capp.aredis()
        await capp.aclose()
        return client

    assert isinstance(asyncio.run(async_client_kind()), redis.asyncio.cluster.RedisCluster)
    assert clients.is_cluster("rediss+cluster://h:1/0")
    assert not clients.is_cluster("redis://h:1/0")
    with pytest.raises(conveyor.ConfigurationError, match="only database 0"):
        clients.sync_client("redis+cluster://127.0.0.1:1/2")


def test_jobs_on_queues_spread_over_the_nodes(
    capp: conveyor.Conveyor, cluster: RedisCluster
) -> None:
    queues = spread_queues(capp, cluster)
    tasks = [capp.task(name=f"add.{q}", queue=q)(lambda x, y: x + y) for q in queues]
    single = [task.enqueue(i, 1) for i, task in enumerate(tasks)]
    many = [job for task in tasks for job in task.enqueue_many([(1, 2), (3, 4)])]

    async def enqueue_async() -> list[conveyor.Job]:
        try:
            return [await task.aenqueue(10, 10) for task in tasks]
        finally:
            await capp.aclose()

    asynced = asyncio.run(enqueue_async())
    for job, node in zip(single, cluster.nodes, strict=True):
        # The record lives on the node that owns the queue's slot, and only there.
        short = job.id.split("~")[1]
        assert node.client().exists(capp.keys(job.queue).job(short)) == 1
    assert sorted(capp.known_queues()) == sorted(queues)
    with running_worker(capp, queues=queues, concurrency=4):
        assert [j.result(timeout=15) for j in single] == [1, 2, 3]
        assert [j.result(timeout=15) for j in many] == [3, 7] * 3
        assert [j.result(timeout=15) for j in asynced] == [20] * 3
    info = single[0].info()
    assert info.state == conveyor.JobState.SUCCEEDED and info.attempts == 1


def test_delayed_jobs_run_when_due(capp: conveyor.Conveyor, cluster: RedisCluster) -> None:
    queues = spread_queues(capp, cluster)
    tasks = [capp.task(name=f"echo.{q}", queue=q)(lambda x: x) for q in queues]
    with running_worker(capp, queues=queues, concurrency=4):
        jobs = [task.options(delay=0.6).enqueue(i) for i, task in enumerate(tasks)]
        assert jobs[0].info().state == conveyor.JobState.SCHEDULED
        assert [j.result(timeout=15) for j in jobs] == [0, 1, 2]
    for job in jobs:
        info = job.info()
        assert info.started_at is not None and info.run_at is not None
        assert info.started_at >= info.run_at >= info.enqueued_at + 0.5


def test_retries_end_in_dead_letters_and_requeue(
    capp: conveyor.Conveyor, cluster: RedisCluster
) -> None:
    queue = spread_queues(capp, cluster)[1]
    healed = threading.Event()
    runs: list[int] = []
    dead: list[conveyor.JobInfo] = []

    @capp.task(queue=queue, retries=1, backoff=0.01)
    def flaky(n: int) -> int:
        runs.append(n)
        if not healed.is_set():
            raise RuntimeError(f"boom {n}")
        return n

    capp.on_dead(dead.append)
    job = flaky.enqueue(7)
    with running_worker(capp, queues=[queue], concurrency=2):
        with pytest.raises(conveyor.JobFailed, match="boom 7"):
            job.result(timeout=15)
        wait_until(lambda: dead, 10, message="on_dead hook")
    assert runs == [7, 7] and dead[0].id == job.id
    letters = capp.dead_letters(queue)
    assert [i.id for i in letters.list()] == [job.id]
    assert letters.requeue() == 1
    healed.set()
    with running_worker(capp, queues=[queue], concurrency=2):
        assert job.result(timeout=15) == 7
    assert letters.list() == []


def test_priorities_order_a_queue(capp: conveyor.Conveyor, cluster: RedisCluster) -> None:
    queue = spread_queues(capp, cluster)[2]
    order: list[int] = []
    ran = capp.task(name="record", queue=queue)(order.append)
    low = ran.options(priority=1).enqueue_many([(1,), (1,)])
    high = ran.options(priority=9).enqueue_many([(9,), (9,)])
    middle = ran.enqueue(5)
    with running_worker(capp, queues=[queue], concurrency=1):
        for job in [*low, *high, middle]:
            job.result(timeout=15)
    assert order == [9, 9, 5, 1, 1]


def test_monitor_reads_active_and_stats(capp: conveyor.Conveyor, cluster: RedisCluster) -> None:
    queues = spread_queues(capp, cluster)
    release = threading.Event()
    slow = capp.task(name="slow", queue=queues[0])(lambda: release.wait(15))
    quick = capp.task(name="quick", queue=queues[1])(lambda: None)
    with running_worker(capp, queues=queues[:2], concurrency=4):
        for job in quick.enqueue_many([()] * 5):
            job.result(timeout=15)
        held = slow.enqueue_many([(), ()])
        wait_until(lambda: capp.monitor.active("slow") == 2, 10, message="2 active")
        release.set()
        for job in held:
            job.result(timeout=15)
        wait_until(lambda: capp.monitor.active("slow") == 0, 10, message="none active")
    stats = capp.monitor.stats(window=300)
    assert stats.enqueued == 7 and stats.succeeded == 7
    assert capp.monitor.stats(queue=queues[1]).succeeded == 5
    assert capp.monitor.stats(task="slow").run.count == 2
    assert stats.backlog.ready == 0 and stats.backlog.active == 0
    assert capp.monitor.idle_since("quick") is not None


def test_an_idle_worker_wakes_on_each_queue_and_stays_quiet(
    capp: conveyor.Conveyor, cluster: RedisCluster
) -> None:
    queues = spread_queues(capp, cluster)
    started: dict[str, float] = {}
    tasks = [capp.task(name=f"stamp.{q}", queue=q)(lambda q=q: started.setdefault(
        q, time.monotonic())) for q in queues]
    with running_worker(capp, queues=queues, concurrency=4) as worker:
        # one blocking call per slot
        assert len(wake._by_slot(worker.queues, capp.keys)) == len(queues)
        time.sleep(1.0)  # let it go idle: every listener blocked, nothing due
        before = cluster.commands_processed()
        time.sleep(4.0)
        idle = cluster.commands_processed() - before - len(cluster.nodes)  # minus INFO
        for queue, task in zip(queues, tasks, strict=True):
            sent = time.monotonic()
            task.enqueue().result(timeout=15)
            assert started[queue] - sent < 1.0, f"{queue} started late"
    # Idle budget: at most 0.5 commands per second per queue, across the whole cluster.
    assert idle <= 0.5 * len(queues) * 4.0, f"{idle} commands in 4 s while idle"


def test_scripts_are_loaded_again_after_a_script_flush(
    capp: conveyor.Conveyor, cluster: RedisCluster
) -> None:
    queues = spread_queues(capp, cluster)
    tasks = [capp.task(name=f"one.{q}", queue=q)(lambda: 1) for q in queues]
    for task in tasks:
        task.enqueue()

    async def enqueue_async() -> list[conveyor.Job]:
        try:
            return [await task.aenqueue() for task in tasks]
        finally:
            await capp.aclose()

    asyncio.run(enqueue_async())
    for node in cluster.nodes:  # as after a failover to a replica that never saw them
        node.client().script_flush()
    jobs = [task.enqueue() for task in tasks] + asyncio.run(enqueue_async())
    assert all(job.info().state == conveyor.JobState.READY for job in jobs)
    assert sum(capp.monitor.backlog(q).ready for q in queues) == 4 * len(queues)


def test_every_tool_runs_against_the_cluster(capp: conveyor.Conveyor, cluster: RedisCluster,
                                             tmp_path: Path) -> None:
    """The sink, every read-only CLI command, the exporter and the dashboard, on queues
    spread over the nodes (the sink used to read all queues' streams in one cross-slot
    command and crash)."""
    from click.testing import CliRunner
    from prometheus_client import CollectorRegistry, generate_latest
    from starlette.testclient import TestClient

    from conveyor.cli import main
    from conveyor.monitor.prometheus import RedisCollector
    from conveyor.sink import Sink, stream_events
    from conveyor.web import create_app

    queues = spread_queues(capp, cluster)
    tasks = []
    for queue in queues:
        stream_events(capp, queue)  # as if the sink had read them before
        tasks.append(capp.task(name=f"ok_{queue}", queue=queue)(lambda n: n))
        capp.task(name=f"bad_{queue}", queue=queue, retries=0)(_fail)
    done = [t.enqueue(1) for t in tasks]
    dead = [capp.tasks[f"bad_{q}"].enqueue() for q in queues]
    with running_worker(capp, queues=queues, concurrency=4):
        assert [j.result(timeout=15) for j in done] == [1] * len(queues)
        for job in dead:
            wait_until(lambda j=job: j.info().state == "dead", 15, message="dead")
    capp.tasks[f"ok_{queues[0]}"].options(delay=600).enqueue(2)

    db = f"sqlite:///{tmp_path / 'jobs.db'}"
    assert Sink(capp, db).run(until_idle=True) == 2 * len(queues)

    env = {"CONVEYOR_REDIS_URL": capp.url}
    common = ["--namespace", capp.namespace]
    runner = CliRunner()
    commands = [["info", *common], ["job", done[0].id, *common],
                ["dead", "list", queues[0], *common], ["stats", *common],
                ["advice", queues[0], *common],
                ["top", "-n", "1", "-i", "0.1", *common],
                ["report", "--db", db], ["sink", "--db", db, "--until-idle", *common]]
    for args in commands:
        result = runner.invoke(main, args, env=env, catch_exceptions=False)
        assert result.exit_code == 0, (args, result.output)
    assert done[0].id in runner.invoke(main, ["job", done[0].id, *common], env=env).output

    registry = CollectorRegistry()
    registry.register(RedisCollector(capp))
    exported = generate_latest(registry).decode()
    assert f'queue="{queues[1]}"' in exported

    with TestClient(create_app(capp)) as web:
        for path in ["/", f"/queues/{queues[0]}", f"/queues/{queues[0]}/jobs", "/tasks",
                     "/jobs", f"/jobs/{done[0].id}", "/workers", "/schedules",
                     "/api/overview", "/api/tasks", "/api/workers", f"/api/queues/{queues[1]}",
                     f"/api/queues/{queues[1]}/series", f"/api/jobs/{dead[0].id}"]:
            assert web.get(path).status_code == 200, path


def _fail() -> None:
    raise RuntimeError("fails on purpose")


def test_running_jobs_on_the_cluster_cancel_progress_steps_snooze(
    capp: conveyor.Conveyor, cluster: RedisCluster
) -> None:
    """Every new script (progress, step) and the look for cancels work across nodes."""
    queues = spread_queues(capp, cluster)
    snoozed: list[int] = []

    @capp.task(name="spin", queue=queues[0])
    async def spin() -> None:
        ctx = conveyor.current_job()
        ctx.progress(0.5, note="half")
        while True:
            await asyncio.sleep(0.05)

    @capp.task(name="stepper", queue=queues[2])
    def stepper() -> int:
        ctx = conveyor.current_job()
        value = ctx.step("one", lambda: 41) + 1
        if not snoozed:
            snoozed.append(ctx.attempt)
            raise conveyor.Snooze(0.1)
        return value

    with running_worker(capp, queues=queues, concurrency=4):
        running = spin.enqueue()
        wait_until(lambda: running.info().progress == 0.5, 10, message="progress on a node")
        assert running.cancel() is True
        wait_until(lambda: running.info().state == conveyor.JobState.CANCELLED, 3,
                   message="cancelled on a node")
        stepped = stepper.enqueue()
        assert stepped.result(timeout=15) == 42
    assert snoozed == [1] and stepped.info().attempts == 1


def test_limits_hold_on_every_node(capp: conveyor.Conveyor, cluster: RedisCluster) -> None:
    """Each queue's limits live in its slot: caps hold per queue wherever it is."""
    queues = spread_queues(capp, cluster)
    peak: dict[str, int] = dict.fromkeys(queues, 0)
    now: dict[str, int] = dict.fromkeys(queues, 0)
    lock = threading.Lock()

    def make(queue: str) -> conveyor.Task:
        async def hold(i: int) -> int:
            with lock:
                now[queue] += 1
                peak[queue] = max(peak[queue], now[queue])
            await asyncio.sleep(0.05)
            with lock:
                now[queue] -= 1
            return i
        return capp.task(name=f"hold.{queue}", queue=queue)(hold)

    tasks = [make(q) for q in queues]
    for q in queues:
        capp.queue(q).set_limits(concurrency=2, tenant_concurrency=1)
    jobs = [j for t in tasks for j in t.options(tenant="a").enqueue_many(range(6))]
    jobs += [j for t in tasks for j in t.options(tenant="b").enqueue_many(range(6))]
    with running_worker(capp, queues=queues, concurrency=16):
        for job in jobs:
            job.result(timeout=30)
    assert all(p == 2 for p in peak.values()), peak
    assert all(capp.monitor.flow(q).running == 0 for q in queues)
    assert capp.monitor.stats(queue=queues[0]).backlog.held == 0
