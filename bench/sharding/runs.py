"""The runs of ``bench.sharding``: the cluster, the workers, and one measurement each."""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import conveyor

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "shardbench"
QUEUE = "q"  # the nearly free jobs
SLOW_QUEUE = "p"  # the priority mix, 2 ms each
COST = 0.002  # seconds a job of the priority mix takes
CHUNK = 1000  # jobs per enqueue_many
DRAIN_WORKERS = 2
DRAIN_CONCURRENCY = 64
PRIORITY_CONCURRENCY = 4
HIGH, LOW, HIGH_SHARE = 8, 2, 0.2


def build(url: str) -> conveyor.Conveyor:
    app = conveyor.Conveyor(url, namespace=NAMESPACE)

    @app.task(name="bench.noop", queue=QUEUE)
    async def noop() -> None:
        return None

    @app.task(name="bench.slow", queue=SLOW_QUEUE)
    async def slow() -> None:
        await asyncio.sleep(COST)

    return app


def serve() -> None:
    """A worker process: ``url queue concurrency burst``; a burst worker prints when it
    began and ended (epoch s) and the CPU it spent meanwhile (its imports left out) as
    JSON once the queue is empty."""
    url, queue, concurrency, burst = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    app = build(url)
    began, cpu = time.time(), own_cpu()
    app.worker(queues=[queue], concurrency=concurrency).run(burst=burst == "1")
    print(json.dumps({"began": began, "ended": time.time(), "cpu": own_cpu() - cpu}))


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def start_worker(url: str, queue: str, concurrency: int, burst: bool
                 ) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", "from bench.sharding.runs import serve; serve()", url, queue,
         str(concurrency), "1" if burst else "0"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])})


def stop_worker(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.communicate(timeout=60)


def wait_registered(app: conveyor.Conveyor, count: int = 1) -> None:
    deadline = time.monotonic() + 30
    while len(app.monitor.workers()) < count:
        if time.monotonic() > deadline:
            raise RuntimeError("the worker did not register within 30 s")
        time.sleep(0.05)


class Primaries:
    """Private servers, each read through a client of its own (``INFO`` is per server):
    the tests' ``RedisCluster`` (3 redis-servers joined by ``redis-cli``), or with
    ``cluster=False`` the tests' plain ``RedisServer``, where every shard shares the one
    server (what the sharding costs conveyor itself, apart from spreading the load)."""

    def __init__(self, cluster: bool = True) -> None:
        sys.path.insert(0, str(ROOT / "tests"))
        from helpers import RedisCluster, RedisServer

        started = RedisCluster().start() if cluster else RedisServer().start()
        self.url: str = started.url
        self._cleanup = started.cleanup
        self.cluster = started if isinstance(started, RedisCluster) else None
        nodes = started.nodes if isinstance(started, RedisCluster) else [started]
        self.clients = {node.port: node.client() for node in nodes}

    def cpu(self) -> dict[int, float]:
        """Each primary's CPU seconds so far (``used_cpu_user`` + ``used_cpu_sys``)."""
        out = {}
        for port, client in self.clients.items():
            info = client.info("cpu")
            out[port] = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        return out

    def calls(self) -> Counter[str]:
        """Calls of each command so far, summed over the primaries (``INFO commandstats``:
        the commands scripts run count too)."""
        out: Counter[str] = Counter()
        for client in self.clients.values():
            for name, stats in client.info("commandstats").items():
                out[name.removeprefix("cmdstat_")] += int(stats["calls"])
        return out

    def commands(self) -> int:
        return sum(int(c.info("stats")["total_commands_processed"])
                   for c in self.clients.values())

    def flush(self) -> None:
        for client in self.clients.values():
            client.flushall()

    def port_of(self, app: conveyor.Conveyor, shard: str) -> int:
        if self.cluster is None:
            return next(iter(self.clients))
        return self.cluster.node_of(app.keys(shard).tag)

    def idle_rate(self, seconds: float) -> dict[int, float]:
        """Each primary's CPU seconds per second with no client at work."""
        before, began = self.cpu(), time.monotonic()
        time.sleep(seconds)
        after, took = self.cpu(), time.monotonic() - began
        return {port: (after[port] - before[port]) / took for port in before}

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self._cleanup()


def fresh_app(primaries: Primaries, queue: str, shards: int) -> conveyor.Conveyor:
    primaries.flush()
    app = build(primaries.url)
    if shards > 1:
        app.queue(queue).set_shards(shards)
    return app


def shard_of(job_id: str) -> str:
    return job_id.rsplit("~", 1)[0]


def ran_once(app: conveyor.Conveyor, queue: str, placed: Counter[str]) -> tuple[list[str], int]:
    """What went wrong with the jobs placed on each shard (nothing: each succeeded once,
    none is left), and how many leases were handed back: the monitor counts a lease as
    started, and a lease handed back at once (more jobs leased than slots were free) is
    counted again when the job is leased anew (its attempt is refunded, its run is one)."""
    problems, handed_back = [], 0
    # Each shard apart (the queue's own name reads the shards summed).
    by_shard: dict[str, list[int]] = {}
    for row in app.monitor.stats_by_task(queue=queue, shards=True):
        counts = by_shard.setdefault(row.queue or "", [0, 0, 0, 0])
        for i, n in enumerate((row.enqueued, row.started, row.succeeded, row.dead)):
            counts[i] += n
    states = app.monitor.queue_states([queue], shards=True)
    for shard in app.queue(queue).served():
        enqueued, started, succeeded, dead = by_shard.get(shard, [0, 0, 0, 0])
        backlog = states[shard].backlog if shard in states else None
        left = 0 if backlog is None else backlog.ready + backlog.active + backlog.scheduled
        want = placed.get(shard, 0)
        handed_back += started - succeeded
        if (enqueued, succeeded, left) != (want, want, 0) or dead:
            problems.append(f"{shard}: {want} placed, {enqueued} enqueued, {started} started,"
                            f" {succeeded} succeeded, {dead} dead, {left} left")
    return problems, handed_back


@dataclass
class Drain:
    """One enqueue + drain of the nearly free jobs."""

    shards: int
    tenants: int
    jobs: int
    placed: Counter[str]  # shard -> jobs placed on it
    port_of: dict[str, int]  # shard -> the primary that holds it
    server_cpu: dict[int, float]  # primary -> CPU seconds over the run, idle burn taken off
    enqueue_rate: float
    drain_rate: float
    worker_cpu: float  # seconds, both worker processes
    calls: Counter[str] = field(default_factory=Counter)  # commands run over the run
    problems: list[str] = field(default_factory=list)
    handed_back: int = 0

    def per_job(self, *commands: str) -> float:
        """Calls per job of ``commands`` (none named: of every command)."""
        counted = commands or tuple(self.calls)
        return sum(self.calls[c] for c in counted) / self.jobs

    def us_per_job(self, port: int | None = None) -> float:
        cpu = sum(self.server_cpu.values()) if port is None else self.server_cpu[port]
        return cpu / self.jobs * 1e6

    def busiest_us(self) -> float:
        return max(self.server_cpu.values()) / self.jobs * 1e6


def enqueue(app: conveyor.Conveyor, jobs: int, tenants: int) -> list[str]:
    noop = app.tasks["bench.noop"]
    ids: list[str] = []
    if not tenants:
        for start in range(0, jobs, CHUNK):
            ids += (j.id for j in noop.enqueue_many([()] * min(CHUNK, jobs - start)))
        return ids
    for t in range(tenants):  # jobs // tenants each, the rest to the first ones
        count = jobs // tenants + (t < jobs % tenants)
        ids += (j.id for j in noop.options(tenant=f"t{t}").enqueue_many([()] * count))
    return ids


def drain(primaries: Primaries, shards: int, jobs: int, tenants: int,
          idle: dict[int, float]) -> Drain:
    app = fresh_app(primaries, QUEUE, shards)
    port_of = {s: primaries.port_of(app, s) for s in app.queue(QUEUE).served()}
    calls_before, cpu_before, began = primaries.calls(), primaries.cpu(), time.monotonic()
    ids = enqueue(app, jobs, tenants)
    enqueue_rate = jobs / (time.monotonic() - began)
    workers = [start_worker(primaries.url, QUEUE, DRAIN_CONCURRENCY, burst=True)
               for _ in range(DRAIN_WORKERS)]
    reports = []
    for proc in workers:
        out, _ = proc.communicate(timeout=600)
        if proc.returncode:
            raise RuntimeError(f"a worker exited with {proc.returncode}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    cpu_after, took, calls = primaries.cpu(), time.monotonic() - began, primaries.calls()
    calls.subtract(calls_before)
    server_cpu = {port: max(0.0, cpu_after[port] - cpu_before[port] - idle[port] * took)
                  for port in cpu_after}
    placed = Counter(shard_of(i) for i in ids)
    seconds = max(r["ended"] for r in reports) - min(r["began"] for r in reports)
    result = Drain(shards, tenants, jobs, placed, port_of, server_cpu, enqueue_rate,
                   jobs / seconds, sum(r["cpu"] for r in reports), calls,
                   *ran_once(app, QUEUE, placed))
    app.close()
    return result


@dataclass
class Claim:
    priority: int
    enqueued: float  # epoch s, the server's clock
    started: float


@dataclass
class Mix:
    claims: list[Claim]
    handed_back: int
    problems: list[str]


def priority_mix(primaries: Primaries, shards: int, jobs: int, seed: int) -> Mix:
    """The claims of ``jobs`` jobs of mixed priority enqueued while one worker drains."""
    app = fresh_app(primaries, SLOW_QUEUE, shards)
    slow = app.tasks["bench.slow"]
    send = {HIGH: slow.options(priority=HIGH), LOW: slow.options(priority=LOW)}
    rng = random.Random(seed)
    worker = start_worker(primaries.url, SLOW_QUEUE, PRIORITY_CONCURRENCY, burst=False)
    try:
        wait_registered(app)
        handles = [send[HIGH if rng.random() < HIGH_SHARE else LOW].enqueue()
                   for _ in range(jobs)]
        deadline = time.monotonic() + 300
        while app.monitor.stats(queue=SLOW_QUEUE).succeeded < jobs:  # all shards summed
            if time.monotonic() > deadline:
                raise RuntimeError("the priority mix was not drained within 300 s")
            time.sleep(0.1)
    finally:
        stop_worker(worker)
    claims = []
    problems, handed_back = ran_once(app, SLOW_QUEUE, Counter(shard_of(h.id) for h in handles))
    for handle in handles:
        info = handle.info()
        if info.attempts != 1 or info.enqueued_at is None or info.started_at is None:
            problems.append(f"{info.id}: {info.attempts} attempts, {info.state}")
            continue
        claims.append(Claim(info.priority, info.enqueued_at, info.started_at))
    app.close()
    return Mix(claims, handed_back, problems)


@dataclass
class Idle:
    commands_per_s: float
    cpu_ms_per_s: float  # summed over the primaries, idle burn taken off


def idle_worker(primaries: Primaries, shards: int, seconds: float,
                idle: dict[int, float]) -> Idle:
    """What one worker costs the servers while its queue stays empty."""
    app = fresh_app(primaries, QUEUE, shards)
    worker = start_worker(primaries.url, QUEUE, DRAIN_CONCURRENCY, burst=False)
    try:
        wait_registered(app)
        time.sleep(1.0)  # past its start
        commands, cpu, began = primaries.commands(), primaries.cpu(), time.monotonic()
        time.sleep(seconds)
        commands_after, cpu_after = primaries.commands(), primaries.cpu()
        took = time.monotonic() - began
    finally:
        stop_worker(worker)
    app.close()
    own = 2 * len(primaries.clients)  # the INFO calls of the reads after
    burn = sum(cpu_after[p] - cpu[p] - idle[p] * took for p in cpu)
    return Idle((commands_after - commands - own) / took, max(0.0, burn) / took * 1e3)
