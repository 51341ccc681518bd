"""The dashboard's shapes of the monitor's figures: plain dicts for JSON and templates.

Nothing here reads Redis or computes a percentile: the figures come from
:class:`~conveyor.monitor.Monitor` (one reader of the metric buckets, one histogram), so
the dashboard shows to the digit what ``conveyor stats`` and the exporter report.
"""

from __future__ import annotations

from typing import Any

from ..monitor import Series, Stats, Timing
from ..monitor.series import PERCENTILES
from ..monitor.stats import COUNTERS


def timing(value: Timing) -> dict[str, float | None]:
    """``mean``, ``p50``, ``p95``, ``p99`` of a duration, seconds."""
    return {"mean": value.mean, "p50": value.p50, "p95": value.p95, "p99": value.p99}


def summary(stats: Stats) -> dict[str, Any]:
    """Counters, throughput (jobs finished for good per second), failure rate (failed
    runs over runs) and durations of a :class:`~conveyor.monitor.Stats`."""
    counts = {name: getattr(stats, name) for name in COUNTERS}
    runs = stats.succeeded + stats.failed
    return {**counts, "span": stats.span, "throughput": stats.throughput,
            "arrival_rate": stats.arrival_rate,
            "failure_rate": stats.failed / runs if runs else None,
            "wait": timing(stats.wait), "run": timing(stats.run)}


def chart(points: Series) -> dict[str, Any]:
    """A :class:`~conveyor.monitor.Series` as chart columns (``wait_p95`` and so on)."""
    out: dict[str, Any] = {"step": points.step, "t": points.t, "processed": points.processed,
                           "failed": points.failed, "enqueued": points.enqueued}
    for p in PERCENTILES:
        out[f"wait_p{p}"] = points.wait[f"p{p}"]
        out[f"run_p{p}"] = points.run[f"p{p}"]
    return out
