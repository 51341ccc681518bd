"""Expiry: ``python -m bench.expiry``.

On a private redis-server, with one worker process:

* **lateness**: ``--jobs`` jobs enqueued (in bulk) to a paused queue, each with an
  ``expires`` spread evenly over ``--spread`` seconds; the worker serves the queue, so only
  its timer runs. Each job's lateness is the server time it ended ``expired`` less the time
  it had to start by; p50/p99/max, and how many ended otherwise (none should);
* **started late**: the same, but the queue runs and the worker drains it with a cost of
  ``--task-ms`` per job, slower than the jobs arrive, so that many expire while they wait;
  every job that ran must have started by its time (its record's ``started_at``);
* **Redis CPU per job**: ``--cpu-jobs`` jobs drained by the worker (no-op task), with and
  without an ``expires`` an hour away (so that none expires: the cost of carrying one),
  alternated ``--runs`` times; ``used_cpu_sys`` + ``used_cpu_user`` of the server per job,
  medians with min-max, and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import conveyor
from bench.peers.redis_server import private_redis

QUEUE = "bench"
ROOT = Path(__file__).resolve().parents[1]
CHUNK = 10_000


def build(url: str, task_ms: float = 0.0) -> conveyor.Conveyor:
    app = conveyor.Conveyor(url, namespace="expbench")

    @app.task(name="bench.job", queue=QUEUE)
    async def job(i: int) -> None:
        if task_ms:
            import asyncio
            await asyncio.sleep(task_ms / 1000)

    return app


def serve() -> None:
    url, task_ms, concurrency = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    build(url, task_ms).worker(queues=[QUEUE], concurrency=concurrency).run()


def start_worker(url: str, task_ms: float = 0.0, concurrency: int = 64
                 ) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", "import bench.expiry as b; b.serve()", url, str(task_ms),
         str(concurrency)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(worker: subprocess.Popen[bytes]) -> None:
    worker.terminate()
    worker.wait(60)


def enqueue_spread(app: conveyor.Conveyor, jobs: int, spread: float) -> None:
    """``jobs`` jobs whose expiries are spread evenly over ``spread`` seconds from now."""
    task = app.tasks["bench.job"]
    now = time.time()
    for i in range(0, jobs, 1000):  # a call's jobs share their options: 1,000 per time
        at = now + 2.0 + spread * i / jobs  # past the enqueue itself
        task.options(expires=datetime.fromtimestamp(at, UTC)).enqueue_many(
            [(j,) for j in range(i, min(jobs, i + 1000))])


def records(app: conveyor.Conveyor, fields: tuple[str, ...]) -> list[list[bytes | None]]:
    k = app.keys(QUEUE)
    names = [key for key in app.redis.scan_iter(match=k.job_prefix + "*", count=10_000)]
    out: list[list[bytes | None]] = []
    for start in range(0, len(names), CHUNK):
        with app.redis.pipeline(transaction=False) as pipe:
            for name in names[start:start + CHUNK]:
                pipe.hmget(name, *fields)
            out += pipe.execute()
    return out


def lateness(url: str, jobs: int, spread: float, running: bool, task_ms: float
             ) -> dict[str, float]:
    app = build(url)
    app.redis.flushall()
    if not running:
        app.pause(QUEUE)
    worker = start_worker(url, task_ms, concurrency=8)
    try:
        enqueue_spread(app, jobs, spread)
        time.sleep(spread + 4.0)
        if running:  # let the queue drain what started in time
            deadline = time.monotonic() + 120
            while app.monitor.backlog(QUEUE).active and time.monotonic() < deadline:
                time.sleep(0.5)
    finally:
        stop(worker)
    rows = records(app, ("s", "x", "finished_at", "started_at"))
    late, started_late, other, ran, began_after = [], 0, 0, 0, [0.0]
    for state, x, finished, started in rows:
        if state == b"expired" and x and finished:
            late.append(float(finished) * 1000 - float(x))
        elif state == b"succeeded":
            ran += 1
            if started and x and float(started) * 1000 > float(x):
                # Leased before its time (the lease refuses later ones), its function
                # began after it: the worker's own delay between the two.
                started_late += 1
                began_after.append(float(started) * 1000 - float(x))
        else:
            other += 1
    app.close()
    late.sort()
    pick = (lambda q: late[min(len(late) - 1, int(len(late) * q))]) if late else (lambda q: 0)
    return {"expired": len(late), "ran": ran, "other": other, "started_late": started_late,
            "p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": late[-1] if late else 0.0,
            "began_after_max_ms": max(began_after)}


def cpu(app: conveyor.Conveyor) -> float:
    info = app.redis.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def drain_cpu(url: str, jobs: int, with_expiry: bool) -> float:
    """Redis CPU (µs) per job to enqueue and drain ``jobs`` no-op jobs."""
    app = build(url)
    app.redis.flushall()
    app.pause(QUEUE)
    task = app.tasks["bench.job"]
    if with_expiry:
        task = task.options(expires=3600)
    before = cpu(app)
    for start in range(0, jobs, 1000):
        task.enqueue_many([(i,) for i in range(start, min(jobs, start + 1000))])
    worker = start_worker(url)
    try:
        app.resume(QUEUE)
        while app.monitor.backlog(QUEUE).pending:
            time.sleep(0.05)
        spent = cpu(app) - before
    finally:
        stop(worker)
    app.close()
    return spent / jobs * 1e6


def spread_text(values: list[float]) -> str:
    return f"{statistics.median(values):,.2f} ({min(values):,.2f}-{max(values):,.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--spread", type=float, default=60.0)
    parser.add_argument("--task-ms", type=float, default=5.0)
    parser.add_argument("--cpu-jobs", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cpu-only", action="store_true",
                        help="measure only the Redis CPU per job (no lateness runs)")
    args = parser.parse_args()
    with private_redis() as server:
        if args.cpu_only:
            paused = running = None
        else:
            print(f"lateness: {args.jobs:,} jobs expiring over {args.spread:g} s, queue"
                  " paused", flush=True)
            paused = lateness(server.url, args.jobs, args.spread, False, 0.0)
            print(f"started late: {args.jobs // 10:,} jobs, queue running", flush=True)
            running = lateness(server.url, args.jobs // 10, args.spread, True, args.task_ms)
        with_x: list[float] = []
        without: list[float] = []
        for run in range(args.runs):
            print(f"Redis CPU, run {run + 1} of {args.runs}", flush=True)
            without.append(drain_cpu(server.url, args.cpu_jobs, False))
            with_x.append(drain_cpu(server.url, args.cpu_jobs, True))
    ratios = [w / o for w, o in zip(with_x, without, strict=True)]
    print()
    print("| figure | value |")
    print("|---|---|")
    if paused is not None and running is not None:
        print_lateness(paused, running)
    print(f"| Redis CPU per job, no expiry (µs) | {spread_text(without)} |")
    print(f"| Redis CPU per job, with expires (µs) | {spread_text(with_x)} |")
    print(f"| ratio | {spread_text(ratios)} |")


def print_lateness(paused: dict[str, float], running: dict[str, float]) -> None:
    print(f"| paused queue: jobs expired / ended otherwise | {paused['expired']:,} /"
          f" {paused['other'] + paused['ran']:,} |")
    print(f"| expiry lateness p50 / p99 / max (ms) | {paused['p50_ms']:.2f} /"
          f" {paused['p99_ms']:.2f} / {paused['max_ms']:.2f} |")
    print(f"| running queue: ran / expired / function began after the expiry (leased"
          f" before it) | {running['ran']:,} / {running['expired']:,} /"
          f" {running['started_late']:,} (at most {running['began_after_max_ms']:.1f} ms"
          " after) |")
    print(f"| running queue: expiry lateness p99 (ms) | {running['p99_ms']:.2f} |")


if __name__ == "__main__":
    main()
