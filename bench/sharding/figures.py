"""The figures of ``bench.sharding`` from its runs, and the tables it prints."""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections.abc import Callable, Sequence

from .runs import Claim, Drain, Idle

BOUNDS_MS = (0, 50, 200)
TARGET_BOUND_MS = 50
CPU_RATIO_TARGET = 1.15
SPREAD_TARGET = 0.10
INVERSIONS_TARGET = 10.0


def spread(values: Sequence[float], fmt: str = ",.1f") -> str:
    """Median (min-max)."""
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def verdict(met: bool) -> str:
    return "met" if met else "**not met**"


def inversions(claims: Sequence[Claim], bound: float) -> float:
    """Claims per thousand that took a job while a job of higher priority, ready since
    ``bound`` seconds before the claim, started after it.

    Per priority, the jobs sorted by when they were enqueued with the latest start among
    them so far: a claim at ``t`` passed one over when, among the jobs of a higher priority
    enqueued before ``t - bound``, the latest start is after ``t``.
    """
    levels = {}
    for level in sorted({c.priority for c in claims}):
        ready = sorted((c.enqueued, c.started) for c in claims if c.priority == level)
        levels[level] = ([e for e, _ in ready],
                         list(itertools.accumulate((s for _, s in ready), max)))
    passed_over = 0
    for claim in claims:
        for level, (enqueued, latest) in levels.items():
            i = bisect.bisect_left(enqueued, claim.started - bound)
            if level > claim.priority and i and latest[i - 1] > claim.started:
                passed_over += 1
                break
    return 1000 * passed_over / len(claims) if claims else 0.0


def pair_ratios(sharded: Sequence[float], unsharded: Sequence[float]) -> list[float]:
    return [s / u for s, u in zip(sharded, unsharded, strict=True)]


def shard_rows(drains: Sequence[Drain]) -> list[tuple[str, int, float, float]]:
    """(shard, its primary, its part of the jobs, its primary's part of the server CPU)
    for each shard, median over ``drains``."""
    first = drains[0]
    rows = []
    for shard, port in first.port_of.items():
        jobs = statistics.median(d.placed[shard] / d.jobs for d in drains)
        cpu = statistics.median(d.server_cpu[port] / sum(d.server_cpu.values())
                                for d in drains)
        rows.append((shard, port, jobs, cpu))
    return rows


def row(label: str, one: Sequence[float], three: Sequence[float], fmt: str = ".1f",
        aim: str = "") -> str:
    """One figure, unsharded and sharded, with the ratio per pair of runs."""
    return (f"| {label} | {spread(one, fmt)} | {spread(three, fmt)} |"
            f" {spread(pair_ratios(three, one), '.2f')} | {aim} |")


def cost_rows(label: str, drains: dict[int, list[Drain]], target: bool) -> list[str]:
    one, three = drains[1], drains[3]

    def both(figure: Callable[[Drain], float]) -> tuple[list[float], list[float]]:
        return [figure(d) for d in one], [figure(d) for d in three]

    total = both(Drain.us_per_job)
    ratio = statistics.median(pair_ratios(total[1], total[0]))
    aim = f"≤ {CPU_RATIO_TARGET:.2f}: {verdict(ratio <= CPU_RATIO_TARGET)}" if target else ""
    lines = [row(f"{label}: server CPU per job, all servers (µs)", *total, aim=aim)]
    if len(one[0].server_cpu) > 1:
        lines.append(row(f"{label}: server CPU per job, busiest primary (µs)",
                         *both(Drain.busiest_us)))
    lines += [row(f"{label}: Redis commands per job", *both(lambda d: d.per_job()), ".2f"),
              row(f"{label}: script calls per job", *both(lambda d: d.per_job("evalsha")),
                  ".3f"),
              row(f"{label}: drain, 2 worker processes (jobs/s)",
                  *both(lambda d: d.drain_rate), ",.0f"),
              row(f"{label}: worker CPU per job (µs)",
                  *both(lambda d: d.worker_cpu / d.jobs * 1e6)),
              row(f"{label}: enqueue_many (jobs/s)", *both(lambda d: d.enqueue_rate), ",.0f")]
    return lines


def cost_table(plain: dict[int, list[Drain]], tenants: dict[int, list[Drain]],
               alone: dict[int, list[Drain]], tenant_count: int) -> list[str]:
    return ["| figure | 1 shard | 3 shards | 3 / 1, per pair | target |",
            "|---|---|---|---|---|",
            *cost_rows("no tenant", plain, target=True),
            *cost_rows(f"{tenant_count:,} tenants", tenants, target=False),
            *cost_rows("one plain server, no tenant", alone, target=False)]


def spread_table(plain: Sequence[Drain], tenants: Sequence[Drain], tenant_count: int
                 ) -> list[str]:
    lines = [f"| shard | primary | jobs, no tenant | server CPU, no tenant |"
             f" jobs, {tenant_count:,} tenants | server CPU, {tenant_count:,} tenants |",
             "|---|---|---|---|---|---|"]
    worst = 0.0
    rows = zip(shard_rows(plain), shard_rows(tenants), strict=True)
    for (shard, port, jobs, cpu), (_, _, t_jobs, t_cpu) in rows:
        even = 1 / len(plain[0].port_of)
        cells = []
        for share in (jobs, cpu, t_jobs, t_cpu):
            worst = max(worst, abs(share / even - 1))
            cells.append(f"{share:.1%} ({share / even - 1:+.1%})")
        lines.append(f"| {shard} | :{port} | " + " | ".join(cells) + " |")
    lines.append(f"\nEven share {1 / len(plain[0].port_of):.1%}; in brackets each part's"
                 f" deviation from it. Largest: {worst:.1%} (target ≤ {SPREAD_TARGET:.0%}:"
                 f" {verdict(worst <= SPREAD_TARGET)}).")
    return lines


def ceiling_table(plain: dict[int, list[Drain]], tenants: dict[int, list[Drain]],
                  tenant_count: int) -> list[str]:
    lines = ["| primaries (1 core each) | busiest primary's CPU per job, no tenant (µs) |"
             " ceiling, no tenant (jobs/s) | ceiling, "
             f"{tenant_count:,} tenants (jobs/s) | measured here, no tenant (jobs/s) |",
             "|---|---|---|---|---|"]

    def busiest(drains: list[Drain], scale: float) -> float:
        return statistics.median(d.busiest_us() for d in drains) * scale

    # 6 primaries: the 3-shard cost per job spread over twice as many, as unevenly as over 3
    # (the per-job cost of 6 shards, with more empty fetches, is not measured).
    for primaries, shards, scale, label in ((1, 1, 1.0, "1"), (3, 3, 1.0, "3"),
                                            (6, 3, 0.5, "6 (projected)")):
        per_job = busiest(plain[shards], scale)
        t_job = busiest(tenants[shards], scale)
        measured = (f"{statistics.median(d.drain_rate for d in plain[shards]):,.0f}"
                    if primaries < 6 else "n/a")
        lines.append(f"| {label} | {per_job:.1f} | {1e6 / per_job:,.0f} | {1e6 / t_job:,.0f} |"
                     f" {measured} |")
    return lines


def priority_table(mixes: dict[int, list[list[Claim]]]) -> list[str]:
    lines = ["| bound | 1 shard, inversions per 1,000 claims | 3 shards | target |",
             "|---|---|---|---|"]
    for bound in BOUNDS_MS:
        one = [inversions(c, bound / 1000) for c in mixes[1]]
        three = [inversions(c, bound / 1000) for c in mixes[3]]
        aim = (f"≤ {INVERSIONS_TARGET:g}: {verdict(statistics.median(three) <= INVERSIONS_TARGET)}"
               if bound == TARGET_BOUND_MS else "")
        lines.append(f"| {bound} ms | {spread(one, '.1f')} | {spread(three, '.1f')} | {aim} |")
    return lines


def idle_table(idle: dict[int, Idle], seconds: float) -> list[str]:
    return ["| one idle worker, empty queue | 1 shard | 3 shards |", "|---|---|---|",
            f"| Redis commands/s, all primaries | {idle[1].commands_per_s:.1f} |"
            f" {idle[3].commands_per_s:.1f} |",
            f"| server CPU, all primaries (ms/s) | {idle[1].cpu_ms_per_s:.2f} |"
            f" {idle[3].cpu_ms_per_s:.2f} |",
            f"\n(over {seconds:g} s, the primaries' own idle burn taken off)"]
