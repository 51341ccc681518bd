"""What control over running jobs costs: cancel latency, and the price of progress reports.

Starts a private redis-server (AOF on) and a ``conveyor worker`` process on it, then

* **cancel latency**: N times, enqueues a job (async and sync in turn), waits until it runs
  and then a random 0-1 s, calls ``job.cancel()`` from this process and times until the
  record says ``cancelled``; prints p50, p99 and the worst;
* **progress cost**: runs J sync jobs at once that call ``ctx.progress`` in a tight loop
  for S seconds; prints the calls made, the progress fields Redis wrote per job per second
  (``cmdstat_hset`` of the phase: nothing else writes hashes meanwhile), the script calls,
  the time one ``ctx.progress`` call takes in the task, and Redis CPU time of the phase.

Run: ``python -m bench.running_jobs [N] [J] [S]`` (defaults 100, 200, 3).
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import redis

import conveyor
from bench.peers.redis_server import DURABLE, RedisServer, private_redis


def make_app(url: str | None, namespace: str) -> conveyor.Conveyor:
    bench = conveyor.Conveyor(url, namespace=namespace)

    @bench.task(name="spin_async", queue="bench")
    async def spin_async() -> None:
        while True:
            await asyncio.sleep(0.05)

    @bench.task(name="spin_sync", queue="bench")
    def spin_sync() -> None:
        ctx = conveyor.current_job()
        while not ctx.cancelled:
            time.sleep(0.01)

    @bench.task(name="report", queue="bench", visibility_timeout=60)
    def report(seconds: float, start_at: float) -> dict[str, float]:
        ctx = conveyor.current_job()
        while time.time() < start_at:
            time.sleep(0.005)
        calls, spent, end = 0, 0.0, start_at + seconds
        while time.time() < end:
            began = time.perf_counter()
            ctx.progress(min(1.0, calls / 1e6), note=f"{calls} done")
            spent += time.perf_counter() - began
            calls += 1
            if calls % 50 == 0:
                time.sleep(0.001)  # let the other threads have the GIL now and then
        return {"calls": calls, "per_call_us": spent / max(1, calls) * 1e6}

    return bench


app = make_app(os.environ.get("CONVEYOR_REDIS_URL"),
               os.environ.get("BENCH_NAMESPACE", "bench-running"))


def _wait(condition: object, timeout: float, pause: float = 0.002) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(pause)
    return False


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def cancel_latency(bench: conveyor.Conveyor, n: int) -> list[float]:
    tasks = [bench.tasks["spin_async"], bench.tasks["spin_sync"]]
    rng = random.Random(1)
    took = []
    for i in range(n):
        job = tasks[i % 2].enqueue()
        if not _wait(lambda job=job: job.info().state == "active", 30):
            raise RuntimeError(f"job {job.id} did not start")
        time.sleep(rng.uniform(0.0, 1.0))  # a cancel comes at any moment of a run
        began = time.perf_counter()
        assert job.cancel()
        if not _wait(lambda job=job: job.info().state == "cancelled", 10, 0.001):
            raise RuntimeError(f"job {job.id} was not cancelled within 10 s")
        took.append(time.perf_counter() - began)
    return took


def progress_cost(bench: conveyor.Conveyor, server: redis.Redis, jobs: int,
                  seconds: float) -> None:
    start_at = time.time() + 3.0
    handles = bench.tasks["report"].enqueue_many([(seconds, start_at)] * jobs)
    time.sleep(max(0.0, start_at - time.time()) + 0.3)  # every job reporting by now
    before_stats, before_cpu = server.info("commandstats"), server.info("cpu")
    began = time.perf_counter()
    time.sleep(seconds - 0.6)  # a window inside the reporting phase
    after_stats, after_cpu = server.info("commandstats"), server.info("cpu")
    window = time.perf_counter() - began
    results = [h.result(timeout=60) for h in handles]

    def delta(name: str) -> int:
        return int(after_stats.get(f"cmdstat_{name}", {}).get("calls", 0)) - int(
            before_stats.get(f"cmdstat_{name}", {}).get("calls", 0))

    cpu = sum(after_cpu[k] - before_cpu[k] for k in ("used_cpu_sys", "used_cpu_user"))
    calls = sum(r["calls"] for r in results)
    print(f"progress: {jobs} jobs reporting for {seconds:g} s; measured over {window:.2f} s")
    print(f"  ctx.progress calls in the tasks: {calls:,} "
          f"({calls / jobs / seconds:,.0f} per job per second)")
    print(f"  one ctx.progress call: {statistics.median(r['per_call_us'] for r in results):.1f}"
          " µs (median over jobs of the mean per call)")
    print(f"  progress writes to Redis: {delta('hset') / jobs / window:.2f} per job per second"
          f" ({delta('hset')} HSET in {window:.2f} s)")
    print(f"  script calls (all: progress, heartbeats): {delta('evalsha') / window:.1f} per second")
    print(f"  Redis CPU in the window: {cpu / window * 100:.1f} % of one core")


def main(n: int = 100, jobs: int = 200, seconds: float = 3.0) -> None:
    with private_redis(*DURABLE) as server:
        _measure(server, n, jobs, seconds)


def _measure(server: RedisServer, n: int, jobs: int, seconds: float) -> None:
    namespace = f"bench{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, CONVEYOR_REDIS_URL=server.url, BENCH_NAMESPACE=namespace)
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    log = open(os.devnull, "wb")  # noqa: SIM115 - closed in finally
    worker = subprocess.Popen([sys.executable, "-m", "conveyor", "worker",
                               "bench.running_jobs:app", "-q", "bench", "-c", str(jobs)],
                              env=env, cwd=root, stdout=log, stderr=subprocess.STDOUT)
    bench = make_app(server.url, namespace)
    try:
        took = cancel_latency(bench, n)
        print(f"cancel latency over {n} cancels of running jobs (half async, half sync),"
              " from cancel() to state 'cancelled':")
        print(f"  p50 {_percentile(took, 0.5) * 1000:.0f} ms, p99 "
              f"{_percentile(took, 0.99) * 1000:.0f} ms, worst {max(took) * 1000:.0f} ms,"
              f" mean {statistics.mean(took) * 1000:.0f} ms")
        progress_cost(bench, server.client, jobs, seconds)
    finally:
        worker.terminate()
        worker.wait(30)
        log.close()
        bench.close()


if __name__ == "__main__":
    main(*(float(a) if i == 2 else int(a) for i, a in enumerate(sys.argv[1:])))  # type: ignore[arg-type]
