"""Durable waits: ``python -m bench.waits``.

On a private redis-server, with one worker process (``-c 64``):

* **resume latency**: a job suspended at ``ctx.wait_for("go")`` on an idle worker; the time
  from ``job.signal("go")`` returning to the task running again past the wait (the task
  notes ``time.time()`` there; same machine clock), p50/p99 over ``--samples`` jobs, one
  at a time;
* **memory**: ``used_memory`` per job with ``--jobs`` jobs suspended at a wait without a
  timeout, and with a one-hour timeout (its timer in the delayed set), beside the same
  jobs queued (ready); the job's arguments are a few bytes (its payload, ~14 bytes
  here); measured with the worker stopped and the Lua heap collected;
* **idle cost**: Redis commands per second (``INFO stats`` ``total_commands_processed``,
  less the bench's own reads) over ``--idle-seconds`` while ``--idle-jobs`` jobs are
  suspended (with a one-day timeout each: every one has a timer) and the worker waits for
  work, beside the same idle worker with no job at all (its own registry heartbeat and
  hand-over sweep).

Medians of ``--runs`` alternated runs with min-max; the worker's CPU per resumed job beside
the latency. The drain figures of jobs that never wait are the peer benchmark's
(``python -m bench.peers``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import conveyor
from bench.peers.redis_server import private_redis

QUEUE = "bench"
ROOT = Path(__file__).resolve().parents[1]


def build(url: str) -> conveyor.Conveyor:
    app = conveyor.Conveyor(url, namespace="waitbench")

    @app.task(name="bench.approve", queue=QUEUE)
    def approve(i: int, timeout: float | None = None) -> int:
        ctx = conveyor.current_job()
        ctx.wait_for("go", timeout=timeout)
        app.redis.hset("waitbench:resumed", str(i), repr(time.time()))
        return i

    return app


def serve() -> None:
    build(sys.argv[1]).worker(queues=[QUEUE], concurrency=64).run()


def start_worker(url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import bench.waits as b; b.serve()", url],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} took over {timeout} s")
        time.sleep(0.002)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def latency(app: conveyor.Conveyor, worker: subprocess.Popen[bytes], samples: int
            ) -> dict[str, float]:
    approve = app.tasks["bench.approve"]
    took = []
    cpu_before = cpu_seconds(worker.pid)
    for i in range(samples):
        job = approve.enqueue(i)
        wait_for(lambda j=job: app.redis.hget(app.keys(QUEUE).job(j.short_id), "s")
                 == b"suspended", 10, "a suspension")
        sent = time.time()
        job.signal("go")
        wait_for(lambda i=i: app.redis.hexists("waitbench:resumed", str(i)), 10, "a resume")
        took.append(float(app.redis.hget("waitbench:resumed", str(i))) - sent)
    cpu = cpu_seconds(worker.pid) - cpu_before
    took.sort()
    return {"p50_ms": statistics.median(took) * 1000,
            "p99_ms": took[min(len(took) - 1, int(len(took) * 0.99))] * 1000,
            "cpu_ms_per_job": cpu / samples * 1000}


def used_memory(app: conveyor.Conveyor) -> int:
    return int(app.redis.info("memory")["used_memory"])


def memory(app: conveyor.Conveyor, jobs: int, timeout: float | None) -> dict[str, float]:
    """Bytes per job queued, then suspended (a worker runs them to their wait)."""
    approve = app.tasks["bench.approve"]
    app.redis.flushall()
    app.redis.eval("collectgarbage('collect') return 0", 0)
    before = used_memory(app)
    handles = approve.enqueue_many([(i, timeout) for i in range(jobs)])
    queued = (used_memory(app) - before) / jobs
    worker = start_worker(app.url)
    try:
        wait_for(lambda: app.monitor.backlog(QUEUE).suspended == jobs, 600, "the suspensions")
    finally:
        worker.terminate()
        worker.wait(30)
    # Measured with the worker gone (its connections' buffers are no job's) and the Lua
    # heap collected (the garbage of the scripts' runs is no job's either).
    time.sleep(0.5)
    app.redis.eval("collectgarbage('collect') return 0", 0)
    suspended = (used_memory(app) - before) / jobs
    del handles
    return {"queued_b": queued, "suspended_b": suspended}


def idle_cost(app: conveyor.Conveyor, jobs: int, seconds: float) -> dict[str, float]:
    approve = app.tasks["bench.approve"]
    app.redis.flushall()
    for start in range(0, jobs, 10_000):
        approve.enqueue_many([(i, 86_400.0) for i in range(start, min(jobs, start + 10_000))])
    worker = start_worker(app.url)
    try:
        wait_for(lambda: app.monitor.backlog(QUEUE).suspended == jobs, 900, "the suspensions")
        time.sleep(5.0)  # the worker goes idle
        stats = app.redis.info("stats")
        first = int(stats["total_commands_processed"])
        time.sleep(seconds)
        last = int(app.redis.info("stats")["total_commands_processed"])
    finally:
        worker.terminate()
        worker.wait(30)
    own = 1  # the second INFO (the first is counted before it is answered)
    return {"cmd_per_s": max(0, last - first - own) / seconds}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.2f} ({min(values):,.2f}-{max(values):,.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="alternated runs (default 3)")
    parser.add_argument("--samples", type=int, default=200, help="resumes timed per run")
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs suspended for memory")
    parser.add_argument("--idle-jobs", type=int, default=100_000)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    args = parser.parse_args()
    results: dict[str, list[float]] = {}
    with private_redis() as server:
        app = build(server.url)
        for run in range(args.runs):
            print(f"run {run + 1} of {args.runs}: resume latency", flush=True)
            app.redis.flushall()
            worker = start_worker(server.url)
            try:
                for k, v in latency(app, worker, args.samples).items():
                    results.setdefault(k, []).append(v)
            finally:
                worker.terminate()
                worker.wait(30)
            print(f"run {run + 1} of {args.runs}: memory", flush=True)
            for label, timeout in (("no timeout", None), ("1 h timeout", 3600.0)):
                for k, v in memory(app, args.jobs, timeout).items():
                    results.setdefault(f"{k} ({label})", []).append(v)
        print(f"idle cost with no job, then with {args.idle_jobs:,} suspended jobs", flush=True)
        idle_none = idle_cost(app, 0, args.idle_seconds)
        idle = idle_cost(app, args.idle_jobs, args.idle_seconds)
        app.close()
    print()
    print("| figure | median (min-max) |")
    print("|---|---|")
    names = {"p50_ms": "resume latency p50 (ms)", "p99_ms": "resume latency p99 (ms)",
             "cpu_ms_per_job": "worker CPU per suspend + resume (ms)"}
    for key, values in results.items():
        name = names.get(key, key.replace("queued_b", "Redis memory per job, queued (B)")
                         .replace("suspended_b", "Redis memory per job, suspended (B)"))
        print(f"| {name} | {spread(values)} |")
    print(f"| idle Redis commands/s, no job (1 run, {args.idle_seconds:g} s) |"
          f" {idle_none['cmd_per_s']:.2f} |")
    print(f"| idle Redis commands/s, {args.idle_jobs:,} jobs suspended (1 run,"
          f" {args.idle_seconds:g} s) | {idle['cmd_per_s']:.2f} |")


if __name__ == "__main__":
    main()
