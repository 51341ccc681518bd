"""What durable enqueue costs: enqueue latency with and without ``WAIT`` for one replica.

Starts a private primary and replica on loopback (temporary folders, AOF on both), then
times N single enqueues and N/100 bulk enqueues of 100 jobs each way and prints the
figures and the ratios. Run: ``python -m bench.durable [N]``.
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid

import conveyor
from bench.peers.redis_server import DURABLE, private_redis


def _time(calls: int, fn: object) -> list[float]:
    out = []
    for _ in range(calls):
        began = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - began)
    return out


def main(n: int = 2000) -> None:
    with private_redis(*DURABLE) as primary, \
            private_redis(*DURABLE, "--replicaof", "127.0.0.1", str(primary.port)) as replica:
        while replica.info("replication").get("master_link_status") != "up":
            time.sleep(0.05)
        app = conveyor.Conveyor(primary.url, namespace=uuid.uuid4().hex[:8])
        task = app.task(name="bench.noop", queue="q")(lambda n: n)
        task.enqueue(0)
        rows = []
        for label, t in (("plain", task), ("durable", task.options(durable=True))):
            single = _time(n, lambda t=t: t.enqueue(1))
            bulk = _time(max(1, n // 100), lambda t=t: t.enqueue_many([(i,) for i in range(100)]))
            rows.append((label, statistics.median(single), statistics.quantiles(single, n=100)[98],
                         100 / statistics.median(bulk)))
        print(f"{'enqueue':<10}{'p50 single':>14}{'p99 single':>14}{'bulk jobs/s':>14}")
        for label, p50, p99, rate in rows:
            print(f"{label:<10}{p50 * 1e3:>12.3f}ms{p99 * 1e3:>12.3f}ms{rate:>14,.0f}")
        print(f"durable/plain: p50 x{rows[1][1] / rows[0][1]:.2f}, bulk throughput"
              f" x{rows[1][3] / rows[0][3]:.2f}")
        app.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
