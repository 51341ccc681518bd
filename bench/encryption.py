"""Encrypted tasks: ``python -m bench.encryption``.

* **seal / open**: client CPU to seal and to open one job's 1 KB arguments
  (AES-256-GCM, :class:`conveyor.Encryption`), timed over ``--ops`` operations, the
  median of 5 repeats with min-max (target: seal + open <= 10 µs);
* **drain**: ``--jobs`` jobs carrying 1 KB of arguments, stored while the queue is
  paused, then drained by one worker process (a no-op async task, concurrency 64), with
  ``encrypt=True`` and without, alternated ``--runs`` times on a private redis-server.
  Jobs per second from the resume to the empty queue, and the worker process's CPU
  (user + system) per job; medians with min-max, and the ratio on / off (target >= 0.9).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
import timeit
from pathlib import Path

import conveyor
from bench.peers.redis_server import private_redis

QUEUE = "bench"
ROOT = Path(__file__).resolve().parents[1]
KEY = bytes(range(32))
PAYLOAD = "x" * 1000  # one job's argument: with the JSON framing, about 1 KB


def build(url: str, encrypt: bool) -> conveyor.Conveyor:
    app = conveyor.Conveyor(url, namespace="encbench", encryption=conveyor.Encryption(
        keys={"k1": KEY}, current="k1"))

    @app.task(name="bench.job", queue=QUEUE, encrypt=encrypt)
    async def job(data: str) -> None:
        return None

    return app


def serve() -> None:
    build(sys.argv[1], sys.argv[2] == "1").worker(queues=[QUEUE], concurrency=64).run()


def seal_open(ops: int) -> tuple[list[float], list[float]]:
    """µs per seal and per open of a 1 KB payload, 5 repeats each."""
    enc = conveyor.Encryption(keys={"k1": KEY}, current="k1")
    plain = conveyor.Codec().encode_args("bench.job", (PAYLOAD,), {})
    sealed = enc.seal(plain, "bench~AAAAAAAAAAAAAAAA", "bench.job", "args")
    seal = timeit.repeat(lambda: enc.seal(plain, "bench~AAAAAAAAAAAAAAAA", "bench.job", "args"),
                         number=ops, repeat=5)
    opened = timeit.repeat(lambda: enc.open(sealed, "bench.job", "args",
                                            "bench~AAAAAAAAAAAAAAAA"), number=ops, repeat=5)
    return [t / ops * 1e6 for t in seal], [t / ops * 1e6 for t in opened]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def drain(url: str, jobs: int, encrypt: bool) -> tuple[float, float]:
    """(jobs per second, worker CPU µs per job) of one drain."""
    app = build(url, encrypt)
    app.redis.flushall()
    app.pause(QUEUE)
    task = app.tasks["bench.job"]
    for start in range(0, jobs, 1000):
        task.enqueue_many([(PAYLOAD,)] * min(1000, jobs - start))
    cpu_before = children_cpu()
    worker = subprocess.Popen(
        [sys.executable, "-c", "import bench.encryption as b; b.serve()", url,
         "1" if encrypt else "0"], cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, env=os.environ | {"PYTHONPATH": str(ROOT / "src")})
    try:
        deadline = time.monotonic() + 30
        while not app.monitor.workers() and time.monotonic() < deadline:
            time.sleep(0.05)
        began = time.perf_counter()
        app.resume(QUEUE)
        while app.monitor.backlog(QUEUE).pending:
            time.sleep(0.01)
        took = time.perf_counter() - began
    finally:
        worker.terminate()
        worker.wait(60)
    app.close()
    return jobs / took, (children_cpu() - cpu_before) / jobs * 1e6


def spread(values: list[float], fmt: str = ",.2f") -> str:
    return (f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-"
            f"{max(values):{fmt}})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=100_000)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    seal, opened = seal_open(args.ops)
    both = [s + o for s, o in zip(seal, opened, strict=True)]
    rates: dict[bool, list[float]] = {False: [], True: []}
    cpus: dict[bool, list[float]] = {False: [], True: []}
    with private_redis() as server:
        for run in range(args.runs):
            for encrypt in (False, True):  # alternated, so drift hits both alike
                print(f"drain run {run + 1} of {args.runs}, encrypt={encrypt}", flush=True)
                rate, cpu = drain(server.url, args.jobs, encrypt)
                rates[encrypt].append(rate)
                cpus[encrypt].append(cpu)
    ratios = [on / off for on, off in zip(rates[True], rates[False], strict=True)]
    cpu_ratios = [on / off for on, off in zip(cpus[True], cpus[False], strict=True)]
    print()
    print("| figure | median (min-max) |")
    print("|---|---|")
    print(f"| seal 1 KB (µs) | {spread(seal)} |")
    print(f"| open 1 KB (µs) | {spread(opened)} |")
    print(f"| seal + open (µs; target <= 10) | {spread(both)} |")
    print(f"| drain, plain (jobs/s) | {spread(rates[False], ',.0f')} |")
    print(f"| drain, encrypt=True (jobs/s) | {spread(rates[True], ',.0f')} |")
    print(f"| drain ratio on / off (target >= 0.9) | {spread(ratios)} |")
    print(f"| worker CPU per job, plain (µs) | {spread(cpus[False], ',.1f')} |")
    print(f"| worker CPU per job, encrypt=True (µs) | {spread(cpus[True], ',.1f')} |")
    print(f"| worker CPU ratio on / off | {spread(cpu_ratios)} |")


if __name__ == "__main__":
    main()
