"""What durable enqueue costs: enqueue latency with and without ``WAIT`` for one replica.

Starts a private primary and replica on loopback (temporary folders, AOF on both), then
times N single enqueues and N/100 bulk enqueues of 100 jobs each way and prints the
figures and the ratios. Run: ``python -m bench.durable [N]``.
"""

from __future__ import annotations

import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import redis

import conveyor


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server(*extra: str) -> tuple[subprocess.Popen[bytes], int, str]:
    port, folder = _port(), tempfile.mkdtemp(prefix="conveyor-bench-")
    process = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", "--port", str(port), "--dir", folder,
         "--appendonly", "yes", "--appendfsync", "always", "--save", "", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.exceptions.ConnectionError:
            time.sleep(0.05)
    return process, port, folder


def _time(calls: int, fn: object) -> list[float]:
    out = []
    for _ in range(calls):
        began = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - began)
    return out


def main(n: int = 2000) -> None:
    primary, pport, pdir = _server()
    replica, rport, rdir = _server("--replicaof", "127.0.0.1", str(pport))
    try:
        link = redis.Redis(port=rport)
        while link.info("replication").get("master_link_status") != "up":
            time.sleep(0.05)
        app = conveyor.Conveyor(f"redis://127.0.0.1:{pport}/0", namespace=uuid.uuid4().hex[:8])
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
    finally:
        for process, folder in ((replica, rdir), (primary, pdir)):
            process.kill()
            process.wait()
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
