"""``python -m bench.curves``: how conveyor's throughput and memory scale, plotted.

Against a private redis-server (persistence off, free port, temporary folder) and through
conveyor's own API only, it measures three curves:

1. **Drain throughput** with 1, 2 and 4 worker processes at concurrency 1, 4, 16, 64 and
   256, for a sync task body (one INCR through a per-process ``redis.Redis``) and an async
   one (one INCR through a per-process ``redis.asyncio.Redis``). Jobs are enqueued first
   with ``enqueue_many``; the worker processes import everything, wait at a barrier, then
   run ``app.worker(...).run(burst=True)``; the clock runs from the barrier until the
   counter in Redis reaches the number of jobs.
2. **Backlog**: with B = 10^3 ... 10^6 jobs queued, the Redis memory per queued job
   (``used_memory`` delta / B), the rate of enqueueing a further slice of S jobs, and the
   rate of draining S jobs (the queue holds between B and B + S jobs meanwhile).
3. **Fairness cost**: drain throughput of the same jobs spread over 1, 100 and 10,000
   tenants.

It writes one PNG per curve into ``bench/curves/``, the figures in
``bench/curves/data.json`` and the report ``bench/CURVES.md``. ``--quick`` is a short
smoke run written to a temporary folder instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

import conveyor

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "curves"
COUNTER = "curves:done"
CHUNK = 10_000  # jobs per enqueue_many call
BODIES = ("sync", "async")
_sync_client: redis.Redis | None = None
_async_client: Any = None  # redis.asyncio.Redis of the worker's loop (one loop per process)
# redis-py 8 pools hold at most 100 connections by default and raise beyond that, which
# concurrency 256 reaches: size the task bodies' pools above the highest concurrency.
BODY_CONNECTIONS = 1024


# -- the application under test ----------------------------------------------------------


def build_app(url: str) -> tuple[conveyor.Conveyor, dict[str, Any]]:
    """A fresh app with the two no-op tasks, each doing one INCR on the counter key."""
    app = conveyor.Conveyor(url, namespace="curves")

    @app.task(name="curves.sync", queue=QUEUE)
    def sync_incr(n: int) -> None:
        global _sync_client
        if _sync_client is None:
            _sync_client = redis.Redis.from_url(url, max_connections=BODY_CONNECTIONS)
        _sync_client.incr(COUNTER)

    @app.task(name="curves.async", queue=QUEUE)
    async def async_incr(n: int) -> None:
        global _async_client
        if _async_client is None:
            _async_client = redis.asyncio.Redis.from_url(url,
                                                          max_connections=BODY_CONNECTIONS)
        await _async_client.incr(COUNTER)

    return app, {"sync": sync_incr, "async": async_incr}


def _worker_process(url: str, concurrency: int, burst: bool, ready: Any, go: Any) -> None:
    """Body of one worker process: import and build everything, then wait for the start."""
    logging.basicConfig(level=logging.ERROR)  # the persistence-off warning is expected here
    app, _ = build_app(url)
    worker = app.worker(queues=[QUEUE], concurrency=concurrency)
    ready.release()
    go.wait()
    worker.run(burst=burst)


# -- the server and the measurements -------------------------------------------------------


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """A throw-away redis-server on a free port with persistence off; yields its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = tempfile.mkdtemp(prefix="conveyor-curves-")
    server = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind",
         "127.0.0.1", "--dir", folder, "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        wait_for(lambda: _pings(client), 10, "redis-server to start")
        yield url
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.exceptions.ConnectionError:
        return False


def wait_for(condition: Callable[[], bool], timeout: float, what: str,
             interval: float = 0.002) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class Bench:
    """Measurements against one server; every point starts from an empty database."""

    def __init__(self, url: str, timeout: float) -> None:
        self.url = url
        self.timeout = timeout
        self.client = redis.Redis.from_url(url)
        self.mp = multiprocessing.get_context("spawn")  # children import a clean state

    def fresh(self) -> tuple[conveyor.Conveyor, dict[str, Any]]:
        self.client.flushall()
        return build_app(self.url)

    def used_memory(self) -> int:
        return int(self.client.info("memory")["used_memory"])

    def done(self) -> int:
        return int(self.client.get(COUNTER) or 0)

    def enqueue(self, task: Any, n: int, first: int = 0) -> float:
        """Enqueue ``n`` jobs in chunks; returns the seconds it took."""
        began = time.perf_counter()
        for start in range(first, first + n, CHUNK):
            task.enqueue_many([(i,) for i in range(start, min(first + n, start + CHUNK))])
        return time.perf_counter() - began

    def drain(self, procs: int, concurrency: int, target: int, burst: bool = True) -> float:
        """Start worker processes, release them together, and time until the counter in
        Redis reaches ``target``; returns jobs/s. Workers still running are stopped."""
        base = self.done()
        ready, go = self.mp.Semaphore(0), self.mp.Event()
        workers = [self.mp.Process(target=_worker_process,
                                   args=(self.url, concurrency, burst, ready, go))
                   for _ in range(procs)]
        for w in workers:
            w.start()
        try:
            for _ in workers:
                deadline = time.monotonic() + 60
                while not ready.acquire(timeout=0.2):
                    if time.monotonic() > deadline or not all(w.is_alive() for w in workers):
                        raise RuntimeError("a worker process did not start")
            go.set()
            began = time.perf_counter()
            wait_for(lambda: self.done() - base >= target or not any(w.is_alive() for w in
                                                                     workers),
                     self.timeout, f"{target} jobs")
            seconds = time.perf_counter() - began
            if self.done() - base < target:
                raise RuntimeError(f"the workers stopped after {self.done() - base} of "
                                   f"{target} jobs (a task body failed?)")
        finally:
            for w in workers:
                w.join(0 if not burst else 30)
                if w.is_alive():
                    w.terminate()  # SIGTERM: a graceful stop that hands back leased jobs
            for w in workers:
                w.join(60)
        extra = self.done() - base - target
        if burst and extra:
            print(f"    note: {extra} runs beyond one per job", flush=True)
        return target / seconds


def median_of(reps: int, measure: Callable[..., float], *args: Any) -> float:
    return statistics.median(measure(*args) for _ in range(reps))


def drain_point(bench: Bench, body: str, procs: int, concurrency: int, jobs: int) -> float:
    _, tasks = bench.fresh()
    bench.enqueue(tasks[body], jobs)
    return bench.drain(procs, concurrency, jobs)


def tenants_point(bench: Bench, cfg: argparse.Namespace, tenants: int,
                  enqueue_times: list[float]) -> float:
    """Spread the jobs evenly over ``tenants`` (one enqueue_many per tenant), drain them."""
    per_tenant = cfg.jobs // tenants
    _, tasks = bench.fresh()
    task = tasks[cfg.body]
    began = time.perf_counter()
    for t in range(tenants):
        task.options(tenant=f"t{t}").enqueue_many(
            [(i,) for i in range(t * per_tenant, (t + 1) * per_tenant)])
    enqueue_times.append(time.perf_counter() - began)
    return bench.drain(cfg.drain_procs, cfg.drain_concurrency, tenants * per_tenant)


def drain_curve(bench: Bench, cfg: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for body in BODIES:
        for procs in cfg.procs:
            for conc in cfg.concurrency:
                jobs = cfg.jobs_c1 if conc == 1 else cfg.jobs
                rate = median_of(cfg.reps, drain_point, bench, body, procs, conc, jobs)
                rows.append({"body": body, "procs": procs, "concurrency": conc,
                             "jobs": jobs, "rate": rate})
                print(f"  drain {body:5} {procs} proc x c={conc:<3} {jobs:>6} jobs: "
                      f"{rate:>9,.0f} jobs/s", flush=True)
    return rows


def backlog_curve(bench: Bench, cfg: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for backlog in cfg.backlogs:
        _, tasks = bench.fresh()
        task = tasks[cfg.body]
        before = bench.used_memory()
        bulk = backlog / bench.enqueue(task, backlog)
        per_job = (bench.used_memory() - before) / backlog
        enqueue_rates, drain_rates = [], []
        for rep in range(cfg.reps):
            seconds = bench.enqueue(task, cfg.slice, first=backlog + rep * cfg.slice)
            enqueue_rates.append(cfg.slice / seconds)
            drain_rates.append(bench.drain(cfg.drain_procs, cfg.drain_concurrency, cfg.slice,
                                           burst=False))
        rows.append({"backlog": backlog, "bytes_per_job": per_job, "bulk_enqueue": bulk,
                     "enqueue": statistics.median(enqueue_rates),
                     "drain": statistics.median(drain_rates)})
        print(f"  backlog {backlog:>9,}: {per_job:6.0f} B/job, bulk {bulk:>9,.0f}/s, slice "
              f"enqueue {rows[-1]['enqueue']:>9,.0f}/s, drain {rows[-1]['drain']:>8,.0f}/s",
              flush=True)
    return rows


def fairness_curve(bench: Bench, cfg: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for tenants in cfg.tenants:
        per_tenant = cfg.jobs // tenants
        enqueue_times: list[float] = []
        rate = median_of(cfg.reps, tenants_point, bench, cfg, tenants, enqueue_times)
        rows.append({"tenants": tenants, "jobs": tenants * per_tenant, "rate": rate,
                     "enqueue_seconds": statistics.median(enqueue_times)})
        print(f"  fairness {tenants:>6,} tenants x {per_tenant:>5,} jobs: {rate:>9,.0f} "
              f"jobs/s", flush=True)
    return rows


# -- the run -------------------------------------------------------------------------------


def machine(url: str) -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f
                    if line.startswith("model name")), cpu)
    version = redis.Redis.from_url(url).info("server")["redis_version"]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    return {"nproc": os.cpu_count(), "cpu": cpu, "redis": version,
            "python": platform.python_version(), "commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M %Z")}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.curves", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="a short smoke run, written to a temporary folder")
    p.add_argument("--out", type=Path, help="folder for CURVES.md and curves/ (default bench/)")
    p.add_argument("--body", choices=BODIES, default="async",
                   help="task body for the backlog and fairness curves")
    p.add_argument("--drain-procs", type=int, default=2)
    p.add_argument("--drain-concurrency", type=int, default=64)
    p.add_argument("--reps", type=int, help="runs per point, the median is kept (default 3;"
                   " 1 with --quick)")
    p.add_argument("--replot", action="store_true",
                   help="only redraw the figures and report from curves/data.json")
    cfg = p.parse_args(argv)
    full = not cfg.quick
    cfg.procs = [1, 2, 4] if full else [1, 2]
    cfg.concurrency = [1, 4, 16, 64, 256] if full else [1, 16, 256]
    cfg.jobs, cfg.jobs_c1 = (10_000, 2_000) if full else (2_000, 500)
    cfg.backlogs = [10**3, 10**4, 10**5, 10**6] if full else [10**3, 10**4]
    cfg.slice = 20_000 if full else 2_000
    cfg.tenants = [1, 100, 10_000] if full else [1, 100]
    cfg.reps = cfg.reps or (3 if full else 1)
    cfg.timeout = 300.0
    if cfg.out is None:
        cfg.out = Path(__file__).parent if full else Path(tempfile.mkdtemp(prefix="curves-"))
    return cfg


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    from bench import curves_report  # matplotlib stays out of the worker processes

    data_file = cfg.out / "curves" / "data.json"
    if not cfg.replot:
        with private_redis() as url:
            bench = Bench(url, cfg.timeout)
            data: dict[str, Any] = {"machine": machine(url), "config": {
                "reps": cfg.reps, "slice": cfg.slice,
                "body": cfg.body,
                "drain_procs": cfg.drain_procs, "drain_concurrency": cfg.drain_concurrency,
                "command": " ".join(["python -m bench.curves", *(argv or sys.argv[1:])])}}
            for name, curve in (("drain", drain_curve), ("backlog", backlog_curve),
                                ("fairness", fairness_curve)):
                print(f"{name} curve", flush=True)
                began = time.monotonic()
                data[name] = curve(bench, cfg)
                data[f"{name}_load"] = os.getloadavg()[0]
                data[f"{name}_seconds"] = time.monotonic() - began
        data_file.parent.mkdir(parents=True, exist_ok=True)
        data_file.write_text(json.dumps(data, indent=1))
    data = json.loads(data_file.read_text())
    curves_report.write(data, cfg.out)
    print(f"wrote {cfg.out / 'CURVES.md'} and {cfg.out / 'curves'}/*.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
