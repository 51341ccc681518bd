"""Result containers and the list of table rows (metrics).

A figure holds one sample per round (see cli.py: every round runs every peer once,
in turn); the table shows the median over the rounds and the min-max beside it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Metric:
    """One table row."""

    key: str
    label: str
    unit: str
    higher_is_better: bool
    integer: bool = False
    """Shown without decimals (a count)."""


METRICS: tuple[Metric, ...] = (
    Metric("enq_sync", "enqueue 1-by-1, sync API", "jobs/s", True),
    Metric("enq_async", "enqueue 1-by-1, async API", "jobs/s", True),
    Metric("enq_bulk", "enqueue bulk (x100), sync API", "jobs/s", True),
    Metric("enq_abulk", "enqueue bulk (x100), async API", "jobs/s", True),
    Metric("drain_default", "drain, 1 process, defaults", "jobs/s", True),
    Metric("drain_best", "drain, best for 2 cores", "jobs/s", True),
    Metric("drain_best_free", "drain, nearly free body, best for 2 cores", "jobs/s", True),
    Metric("cpu_enq", "Redis CPU per job: single enqueue (sync API, else async)", "µs", False),
    Metric("cpu_drain", "Redis CPU per job: drain, best for 2 cores", "µs", False),
    Metric("cpu_total", "Redis CPU per job: single enqueue plus drain", "µs", False),
    Metric("cpu_drain_free", "Redis CPU per job: drain, nearly free body", "µs", False),
    Metric("wcpu_default", "worker CPU per job: drain, 1 process, defaults", "µs", False),
    Metric("wcpu_best", "worker CPU per job: drain, best for 2 cores", "µs", False),
    Metric(
        "wcpu_best_free",
        "worker CPU per job: drain, nearly free body, best for 2 cores",
        "µs",
        False,
    ),
    Metric("lat_p50", "enqueue-to-start latency p50", "ms", False),
    Metric("lat_p99", "enqueue-to-start latency p99", "ms", False),
    Metric("ret_p50", "start after enqueue returns p50", "ms", False),
    Metric("ret_p99", "start after enqueue returns p99", "ms", False),
    Metric("late_p50", "delayed job lateness p50", "ms", False),
    Metric("late_p99", "delayed job lateness p99", "ms", False),
    Metric("late_early", "delayed jobs started before due", "jobs per round", False, True),
    Metric("idle_cmds", "idle worker: Redis commands", "cmd/s", False),
    Metric("idle_cpu", "idle worker: CPU", "% core", False),
    Metric("mem_per_job", "Redis memory per queued job, {mem_jobs} queued", "bytes", False),
    Metric(
        "mem_per_job_large", "Redis memory per queued job, {mem_jobs_large} queued", "bytes", False
    ),
)
"""Labels may name a workload size as ``{field}`` of the run's options (see report.py)."""

MODE_METRIC = {"sync": "enq_sync", "async": "enq_async", "bulk": "enq_bulk", "abulk": "enq_abulk"}


@dataclass
class Value:
    """A measured figure (one sample per round it was measured in), or why there is none.

    ``partial`` marks a drain that hit its time cap: the rate is what the
    peer managed until then, shown with a trailing ``*``.
    """

    samples: list[float] = field(default_factory=list)
    reason: str = ""
    partial: bool = False

    @classmethod
    def of(cls, *samples: float) -> Value:
        return cls(list(samples))

    @property
    def number(self) -> float | None:
        """The median over the rounds, ``None`` when no round measured it."""
        return statistics.median(self.samples) if self.samples else None

    @property
    def spread(self) -> tuple[float, float] | None:
        """(min, max) over the rounds, ``None`` with fewer than two samples."""
        return (min(self.samples), max(self.samples)) if len(self.samples) > 1 else None


@dataclass
class PeerResult:
    """Everything measured for one column."""

    name: str
    title: str
    version: str = ""
    status: str = "ok"
    """``ok`` or the reason the whole column is n/a."""
    config: list[str] = field(default_factory=list)
    values: dict[str, Value] = field(default_factory=dict)

    def value(self, key: str) -> Value:
        return self.values.get(key, Value(reason="n/a"))

    def record(self, key: str, sample: float, partial: bool = False) -> None:
        """Add this round's *sample* of *key*; one partial round marks the figure partial."""
        value = self.values.setdefault(key, Value())
        value.samples.append(sample)
        value.partial = value.partial or partial

    def fail(self, key: str, reason: str) -> None:
        """Say why *key* has no sample this round; the first reason stays, and samples
        from other rounds still make the figure."""
        value = self.values.setdefault(key, Value())
        value.reason = value.reason or reason


def best_peer(metric: Metric, results: Sequence[PeerResult]) -> tuple[float, str] | None:
    """The best median among the peers in *results* (not conveyor, not the ceiling, and
    not a drain cut by its cap), with the peer's title ("A, B" on a tie of two)."""
    scored = [
        (v.number, p.title)
        for p in results
        if p.name not in ("conveyor", "ceiling") and p.status == "ok"
        if (v := p.value(metric.key)).number is not None and not v.partial
    ]
    if not scored:
        return None
    if metric.higher_is_better:
        best = max(n for n, _ in scored)
    else:  # closest to zero: a negative lateness (started early) is no better than late
        best = min((n for n, _ in scored), key=abs)
    tied = [title for n, title in scored if n == best]
    return best, ", ".join(tied) if len(tied) <= 2 else f"{len(tied)} peers"


def column(results: Sequence[PeerResult], name: str) -> PeerResult | None:
    """The measured column called *name*, if it is in the run and not n/a."""
    return next((r for r in results if r.name == name and r.status == "ok"), None)


METRIC = {m.key: m for m in METRICS}
