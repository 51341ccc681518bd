"""Redis memory stays flat however many jobs are processed: ``python -m bench.memory``.

Runs jobs through real worker processes against a private redis-server with a short
retention (finished records kept 2 s, metric buckets 30 s, events stream capped at
10,000), and measures memory at checkpoints (default 200,000 and 1,000,000 processed
jobs). At each checkpoint the producer pauses until the queue is drained and the
retention has passed, so every checkpoint measures the same state: what monitoring
keeps (buckets, counters, idle times, the events stream) plus Redis's own baseline.
Prints the figures and whether they stay within ±10 % of the first checkpoint.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import conveyor
from bench.peers.redis_server import private_redis

RETENTION = 2
LIMITS = conveyor.Limits(retention=RETENTION, dead_cap=1000, events_maxlen=10_000,
                         bucket_seconds=10, bucket_ttl=30)
app = conveyor.Conveyor(os.environ.get("CONVEYOR_REDIS_URL"), namespace="membench",
                        limits=LIMITS)


@app.task(name="bench.noop", queue="bench")
async def noop(n: int) -> int:
    return n


def monitoring_bytes(client: object, namespace: str, queue: str) -> dict[str, int]:
    """Bytes held by the monitoring keys of ``queue`` (MEMORY USAGE, summed)."""
    r = client  # a redis.Redis
    k = app.keys(queue)
    buckets = sum(int(r.memory_usage(key) or 0)  # type: ignore[attr-defined]
                  for key in r.scan_iter(match=f"{k.metrics_prefix}*", count=1000))  # type: ignore[attr-defined]
    return {
        "buckets": buckets,
        "events": int(r.memory_usage(k.events) or 0),  # type: ignore[attr-defined]
        "counters": sum(int(r.memory_usage(x) or 0)  # type: ignore[attr-defined]
                        for x in (k.active, k.idle, k.counts)),
    }


def wait_drained(client: object, queue: str) -> None:
    k = app.keys(queue)
    while True:
        ready = int(client.hget(k.counts, "ready") or 0)  # type: ignore[attr-defined]
        if ready == 0 and client.zcard(k.leases) == 0:  # type: ignore[attr-defined]
            return
        time.sleep(0.05)


def settle(client: object) -> None:
    """Wait out the retention, then until expired records are gone from memory."""
    time.sleep(RETENTION + 1)
    prefix = app.keys("bench").job_prefix
    while True:
        left = sum(1 for _ in client.scan_iter(match=f"{prefix}*", count=5000))  # type: ignore[attr-defined]
        if left == 0:
            return
        time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", default="200000,1000000",
                        help="processed-job counts at which memory is measured")
    parser.add_argument("--wave", type=int, default=20_000, help="jobs enqueued per wave")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    args = parser.parse_args()
    checkpoints = [int(x) for x in args.checkpoints.split(",")]
    with private_redis() as server:
        env = dict(os.environ, CONVEYOR_REDIS_URL=server.url)
        root = Path(__file__).resolve().parents[1]
        env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "src"),
                                             env.get("PYTHONPATH", "")])
        exe = str(Path(sys.executable).with_name("conveyor"))
        workers = [subprocess.Popen([exe, "worker", "bench.memory:app", "-c", "64"], env=env,
                                    cwd=root, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
                   for _ in range(args.workers)]
        app.url = server.url
        client = app.redis
        rows = []
        processed, started = 0, time.monotonic()
        try:
            for target in checkpoints:
                while processed < target:
                    n = min(args.wave, target - processed)
                    noop.enqueue_many([(i,) for i in range(n)])
                    wait_drained(client, "bench")
                    processed += n
                    rate = processed / (time.monotonic() - started)
                    print(f"  {processed:>9,} processed ({rate:,.0f} jobs/s)", flush=True)
                settle(client)
                info = client.info("memory")
                mon = monitoring_bytes(client, app.namespace, "bench")
                rows.append((processed, int(info["used_memory"]), int(client.dbsize()), mon))
                print(f"checkpoint {processed:,}: used_memory {info['used_memory']:,} B, "
                      f"keys {client.dbsize()}, monitoring {mon}", flush=True)
        finally:
            for w in workers:
                w.terminate()
            for w in workers:
                w.wait(60)
    report(rows)


def report(rows: list[tuple[int, int, int, dict[str, int]]]) -> None:
    base = rows[0][1]
    print("\nprocessed   used_memory (B)   vs first   keys   monitoring keys (B)")
    flat = True
    for processed, used, keys, mon in rows:
        change = (used - base) / base * 100
        flat = flat and abs(change) <= 10
        print(f"{processed:>9,}   {used:>15,}   {change:+7.2f} %   {keys:>4}   "
              f"{sum(mon.values()):,} {mon}")
    print(f"\nRedis memory {'flat within ±10 %' if flat else 'NOT flat'} across checkpoints.")


if __name__ == "__main__":
    main()
