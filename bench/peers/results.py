"""Result containers and the list of table rows (metrics)."""

from __future__ import annotations

import statistics
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
    Metric("lat_p50", "enqueue-to-start latency p50", "ms", False),
    Metric("lat_p99", "enqueue-to-start latency p99", "ms", False),
    Metric("ret_p50", "start after enqueue returns p50", "ms", False),
    Metric("ret_p99", "start after enqueue returns p99", "ms", False),
    Metric("late_p50", "delayed job lateness p50", "ms", False),
    Metric("late_p99", "delayed job lateness p99", "ms", False),
    Metric("late_early", "delayed jobs started before due", "jobs, all runs", False, True),
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
    """A measured figure, or why there is none.

    ``partial`` marks a drain that hit its time cap: the rate is what the
    peer managed until then, shown with a trailing ``*``.
    """

    number: float | None = None
    reason: str = ""
    partial: bool = False

    @classmethod
    def median(cls, samples: list[float], partial: bool = False) -> Value:
        return cls(statistics.median(samples), partial=partial) if samples else cls()


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
