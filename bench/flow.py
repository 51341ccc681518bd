"""What flow control costs and how exact it is: ``python -m bench.flow [--write]``.

On a private redis-server (no persistence, loopback):

* **drain**: N no-op jobs drained by one in-process worker, with no limits and with limits
  configured that never bind (a queue cap and rate far above what one worker reaches, a
  tenant cap); the ratio is the cost of deciding limits in the claim (goal: >= 0.9x);
* **rate accuracy**: a queue rate of 10, 100 and 1,000 jobs/s over a backlog that lasts
  a few seconds: starts per second after the first second's burst, against the rate, and
  the most starts in any one-second window (at most 2 x rate);
* **claim cost with parked tenants**: 1, 100 and 10,000 tenants at their cap (parked) and
  one tenant with work; the mean time of a fetch that leases one job (goal: flat).

``--write`` puts the figures in ``bench/RESULTS.md`` (a section below the kept mark).
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from pathlib import Path

import conveyor
from bench.peers.redis_server import private_redis
from conveyor.scripts import calls

RESULTS = Path(__file__).with_name("RESULTS.md")
KEPT_MARK = "<!-- kept: the sections below survive a regeneration by bench.peers -->"
SECTION = "## Flow control (`python -m bench.flow`)"


def _app(url: str) -> conveyor.Conveyor:
    return conveyor.Conveyor(url, namespace=f"b{uuid.uuid4().hex[:8]}")


def drain_rate(url: str, n: int, limited: bool) -> float:
    app = _app(url)

    @app.task(name="bench.noop", queue="q")
    async def noop(i: int) -> int:
        return i

    if limited:
        app.queue("q").set_limits(concurrency=10_000, rate=1_000_000, tenant_concurrency=10_000)
    for i in range(0, n, 5000):
        noop.enqueue_many([(j,) for j in range(i, min(n, i + 5000))])
    began = time.perf_counter()
    app.worker(queues=["q"], concurrency=64).run(burst=True)
    took = time.perf_counter() - began
    app.close()
    return n / took


def rate_accuracy(url: str, rate: float, seconds: float = 4.0) -> tuple[float, int]:
    """(starts/s after the first second's burst, most starts in any 1 s window)."""
    app = _app(url)
    starts: list[float] = []

    @app.task(name="bench.stamp", queue="q")
    async def stamp(i: int) -> None:
        starts.append(time.time())

    n = int(rate * (seconds + 1))
    app.queue("q").set_limits(rate=rate)
    stamp.enqueue_many([(i,) for i in range(n)])
    app.worker(queues=["q"], concurrency=64).run(burst=True)
    app.close()
    starts.sort()
    burst = int(max(rate, 1))
    steady = (len(starts) - burst) / max(1e-9, starts[-1] - starts[0])
    most, lo = 0, 0
    for hi, t in enumerate(starts):
        while t - starts[lo] > 1.0:
            lo += 1
        most = max(most, hi - lo + 1)
    return steady, most


def claim_cost(url: str, tenants: int, fetches: int = 500) -> float:
    """Mean seconds per fetch leasing one job, with ``tenants`` tenants parked at their cap."""
    app = _app(url)
    k = app.keys("q")
    app.queue("q").set_limits(tenant_concurrency=1)
    spec = calls.JobSpec(task="t")
    for start in range(0, tenants, 1000):
        with app.redis.pipeline(transaction=False) as pipe:
            for t in range(start, min(tenants, start + 1000)):
                call = calls.enqueue(k, spec._replace(tenant=f"t{t}"),
                                     [(f"a{t}", b"[[]]"), (f"b{t}", b"[[]]")], app.limits)
                app.scripts.queue(call, pipe)
            pipe.execute()
    while app.scripts.run(calls.fetch(k, 1000, app.limits)).jobs:
        pass  # every tenant now runs one job and is parked with one more waiting
    app.queue("q").set_tenant_limits("free", concurrency=1_000_000)
    free = [(f"f{i}", b"[[]]") for i in range(fetches)]
    app.scripts.run(calls.enqueue(k, spec._replace(tenant="free"), free, app.limits))
    app.scripts.run(calls.fetch(k, 1, app.limits))  # parks every tenant again (limits changed)
    times = []
    for _ in range(fetches - 1):
        began = time.perf_counter()
        got = app.scripts.run(calls.fetch(k, 1, app.limits))
        times.append(time.perf_counter() - began)
        assert len(got.jobs) == 1
    app.close()
    return statistics.mean(times)


def measure(n: int) -> list[str]:
    with private_redis() as server:
        url = server.url
        plains, limiteds = [], []
        for _ in range(5):  # interleaved: the machine's load changes between runs
            plains.append(drain_rate(url, n, False))
            limiteds.append(drain_rate(url, n, True))
        plain, limited = statistics.median(plains), statistics.median(limiteds)
        ratios = sorted(b / a for a, b in zip(plains, limiteds, strict=True))
        lines = [
            "| drain, one worker process, concurrency 64 | jobs/s |", "|---|---|",
            f"| no limits | {plain:,.0f} |",
            f"| limits that never bind (queue cap, rate, tenant cap) | {limited:,.0f}"
            f" ({limited / plain:.2f}x; per pair of runs {ratios[0]:.2f}x to"
            f" {ratios[-1]:.2f}x) |", "",
            "| queue rate | starts/s after the burst | most starts in any 1 s |", "|---|---|---|",
        ]
        for rate in (10, 100, 1000):
            steady, most = rate_accuracy(url, rate)
            lines.append(f"| {rate:,}/s | {steady:,.1f} ({steady / rate:.0%}) | {most:,}"
                         f" (bound {2 * rate:,}) |")
        lines += ["", "Starts are timed inside the task, a few ms after the claim the bucket"
                  " governs; when that delay varies, a 1 s window of starts can hold one or two"
                  " more than the claims' bound.",
                  "", "| tenants parked at their cap | fetch of one job (mean) |", "|---|---|"]
        for tenants in (1, 100, 10_000):
            lines.append(f"| {tenants:,} | {claim_cost(url, tenants) * 1e6:,.0f} us |")
        return lines


def write(lines: list[str]) -> None:
    text = RESULTS.read_text() if RESULTS.exists() else ""
    if KEPT_MARK not in text:
        text = text.rstrip("\n") + "\n\n" + KEPT_MARK + "\n"
    head, _, kept = text.partition(KEPT_MARK)
    sections = [s for s in kept.split("\n## ") if s.strip()]
    others = ["## " + s.strip() for s in sections if not ("## " + s).startswith(SECTION)]
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
    ours = "\n".join([SECTION, "", f"Measured {stamp} on this machine (2 cores, shared with"
                      f" other work: 1-min load {load} at the end).", "", *lines])
    RESULTS.write_text(head + KEPT_MARK + "\n\n" + "\n\n".join([*others, ours]) + "\n")


def main() -> None:
    n = 20_000
    lines = measure(n)
    print("\n".join(lines))
    if "--write" in sys.argv:
        write(lines)


if __name__ == "__main__":
    main()
