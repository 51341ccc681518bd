"""Workflow cost: ``python -m bench.workflows``.

For fan-out/fan-in workflows of 10, 1,000 and 10,000 nodes (one root, N-2 batches after
it, one completion node after all batches) on a private redis-server: the time
``enqueue()`` takes (median of a few runs, each on a flushed server), the Redis memory the
stored workflow costs (``used_memory`` after minus before, and per node), and the time a
worker process takes to run it through to its completion node (noop tasks), and how many
of its keys (job records, workflow record, waiting hashes, hand-over list) are left once
the retention (2 s here) has passed: none should be.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import conveyor
from bench.peers.redis_server import private_redis

RETENTION = 2
SIZES = (10, 1_000, 10_000)


def build(url: str) -> tuple[conveyor.Conveyor, conveyor.Task, conveyor.Task]:  # type: ignore[type-arg]
    app = conveyor.Conveyor(url, namespace="wfbench",
                            limits=conveyor.Limits(retention=RETENTION))

    @app.task(name="bench.part", queue="bench")
    async def part(n: int) -> int:
        return n

    @app.task(name="bench.done", queue="bench")
    async def done() -> str:
        return "done"

    return app, part, done


def workflow(app: conveyor.Conveyor, part: conveyor.Task, done: conveyor.Task,  # type: ignore[type-arg]
             nodes: int) -> conveyor.Workflow:
    wf = app.workflow()
    root = wf.add(part, -1, name="root")
    parts = [wf.add(part, i, after=[root]) for i in range(nodes - 2)]
    wf.add(done, name="done", after=parts)
    return wf


def used_memory(client: object) -> int:
    return int(client.info("memory")["used_memory"])  # type: ignore[attr-defined]


def measure(url: str, nodes: int, runs: int) -> dict[str, float]:
    app, part, done = build(url)
    client = app.redis
    times, costs = [], []
    for _ in range(runs):
        client.flushall()
        wf = workflow(app, part, done, nodes)
        before = used_memory(client)
        began = time.perf_counter()
        wf.enqueue()
        times.append(time.perf_counter() - began)
        costs.append(used_memory(client) - before)
    client.flushall()
    handle = workflow(app, part, done, nodes).enqueue()
    began = time.perf_counter()
    worker = subprocess.Popen(
        [sys.executable, "-c", "import bench.workflows as b; b.serve()", url],
        cwd=Path(__file__).resolve().parents[1], stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        handle.result(timeout=600)
        ran = time.perf_counter() - began
        time.sleep(RETENTION + 12)  # records expire; a sweep settles the last hand-overs
        k = app.keys("bench")
        left = sum(1 for _ in client.scan_iter(match=k.job_prefix + "*", count=1000))
        left += sum(1 for _ in client.scan_iter(match=k.workflow_prefix + "*", count=1000))
    finally:
        worker.terminate()
        worker.wait(30)
    app.close()
    return {"enqueue_s": statistics.median(times), "bytes": statistics.median(costs),
            "run_s": ran, "keys_left": left}


def serve() -> None:
    app, _, _ = build(sys.argv[1])
    app.worker(queues=["bench"], concurrency=64).run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"{'nodes':>7} {'enqueue':>10} {'memory':>11} {'per node':>9} {'run':>9}"
          f" {'keys left after retention':>26}")
    with private_redis() as server:
        for nodes in SIZES:
            m = measure(server.url, nodes, args.runs)
            print(f"{nodes:>7} {m['enqueue_s'] * 1000:>8.1f}ms {m['bytes'] / 1e6:>9.2f}MB"
                  f" {m['bytes'] / nodes:>8.0f}B {m['run_s']:>8.2f}s"
                  f" {m['keys_left']:>26.0f}")


if __name__ == "__main__":
    main()
