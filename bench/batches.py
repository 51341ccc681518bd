"""Batch tasks: ``python -m bench.batches``.

On a private redis-server, one worker process (``--concurrency``, default 16) drains
``--jobs`` jobs queued beforehand, of a task whose function costs a fixed 2 ms per call:

* **single**: the task without ``batch=`` (one call, 2 ms, per job);
* **batch**: the same task with ``Batch(max=100)`` (one call, 2 ms, per up to 100 jobs);
* **batch by tenant**: ``Batch(max=100, by="tenant")``, the jobs spread evenly over
  ``--tenants`` tenants (100).

Figures per variant: jobs/s (from the worker's start to its last job, the worker run with
``burst``, so process start-up is left out), Redis CPU per job (``INFO cpu``, user + sys,
and Redis commands per job from ``INFO commandstats``, both taken after the jobs were
queued), and the worker's CPU per job. Medians of ``--runs`` alternated runs with min-max.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import conveyor
from bench.peers.redis_server import private_redis

ROOT = Path(__file__).resolve().parents[1]
COST = 0.002  # seconds each call of the function takes
VARIANTS = ("single", "batch", "batch by tenant")
QUEUES = {"single": "single", "batch": "batch", "batch by tenant": "tenants"}


def build(url: str) -> conveyor.Conveyor:
    app = conveyor.Conveyor(url, namespace="batchbench")

    @app.task(name="bench.single", queue="single")
    def single(i: int) -> None:
        time.sleep(COST)

    @app.task(name="bench.batch", queue="batch", batch=conveyor.Batch(max=100))
    def batch(items: list[conveyor.BatchItem]) -> None:
        time.sleep(COST)

    @app.task(name="bench.tenants", queue="tenants",
              batch=conveyor.Batch(max=100, by="tenant"))
    def tenants(items: list[conveyor.BatchItem]) -> None:
        time.sleep(COST)

    return app


def serve() -> None:
    """The worker process: drain one queue, then print its time and CPU as JSON."""
    url, queue, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3])
    app = build(url)
    started = time.perf_counter()
    app.worker(queues=[queue], concurrency=concurrency).run(burst=True)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"seconds": time.perf_counter() - started,
                      "cpu": usage.ru_utime + usage.ru_stime}))


def enqueue(app: conveyor.Conveyor, variant: str, jobs: int, tenants: int) -> None:
    name = {"single": "bench.single", "batch": "bench.batch",
            "batch by tenant": "bench.tenants"}[variant]
    task = app.tasks[name]
    if variant != "batch by tenant":
        for start in range(0, jobs, 5000):
            task.enqueue_many(range(start, min(jobs, start + 5000)))
        return
    per_tenant = jobs // tenants
    for t in range(tenants):
        task.options(tenant=f"t{t}").enqueue_many(range(per_tenant))


def redis_cpu(app: conveyor.Conveyor) -> tuple[float, int]:
    cpu = app.redis.info("cpu")
    stats = app.redis.info("commandstats")
    calls = sum(int(v["calls"]) for v in stats.values() if isinstance(v, dict))
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), calls


def run_once(app: conveyor.Conveyor, variant: str, jobs: int, tenants: int,
             concurrency: int) -> dict[str, float]:
    app.redis.flushall()
    enqueue(app, variant, jobs, tenants)
    total = jobs if variant != "batch by tenant" else jobs // tenants * tenants
    cpu_before, calls_before = redis_cpu(app)
    out = subprocess.run(
        [sys.executable, "-c", "import bench.batches as b; b.serve()", app.url,
         QUEUES[variant], str(concurrency)],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=900)
    cpu_after, calls_after = redis_cpu(app)
    worker = json.loads(out.stdout.strip().splitlines()[-1])
    backlog = app.monitor.backlog(QUEUES[variant])
    if backlog.ready or backlog.active or backlog.scheduled or backlog.dead:
        raise RuntimeError(f"{variant}: the worker left jobs unfinished: {backlog}")
    done = total
    return {"jobs_s": done / worker["seconds"],
            "redis_us_job": (cpu_after - cpu_before) / done * 1e6,
            "redis_cmds_job": (calls_after - calls_before - 2) / done,
            "worker_us_job": worker["cpu"] / done * 1e6}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.1f} ({min(values):,.1f}-{max(values):,.1f})"


def table(results: dict[str, dict[str, list[float]]]) -> list[str]:
    lines = ["| variant | jobs/s | Redis CPU per job (µs) | Redis commands per job |"
             " worker CPU per job (µs) |", "|---|---|---|---|---|"]
    for variant, figures in results.items():
        lines.append(f"| {variant} | {spread(figures['jobs_s'])} |"
                     f" {spread(figures['redis_us_job'])} |"
                     f" {spread(figures['redis_cmds_job'])} |"
                     f" {spread(figures['worker_us_job'])} |")
    single = {k: statistics.median(v) for k, v in results["single"].items()}
    for variant in VARIANTS[1:]:
        if variant in results:
            mine = {k: statistics.median(v) for k, v in results[variant].items()}
            lines.append(f"\n{variant} against single: {mine['jobs_s'] / single['jobs_s']:.1f}x"
                         f" jobs/s, {mine['redis_us_job'] / single['redis_us_job']:.2f}x"
                         " Redis CPU per job")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="alternated runs (default 3)")
    parser.add_argument("--jobs", type=int, default=30_000, help="jobs per run")
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    results: dict[str, dict[str, list[float]]] = {}
    with private_redis() as server:
        app = build(server.url)
        for run in range(args.runs):
            for variant in VARIANTS:
                print(f"run {run + 1} of {args.runs}: {variant}", flush=True)
                figures = run_once(app, variant, args.jobs, args.tenants, args.concurrency)
                for key, value in figures.items():
                    results.setdefault(variant, {}).setdefault(key, []).append(value)
        app.close()
    print()
    print(f"{args.jobs:,} jobs, 2 ms per call, worker concurrency {args.concurrency}")
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
