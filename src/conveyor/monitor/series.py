"""Time series of a queue from its metric buckets (the dashboard's charts).

Buckets are read with :func:`.stats.queue_buckets` and :func:`.stats.parse_replies`
(in :mod:`.overview`) and percentiles computed by
:class:`.histogram.Histogram`, like every other figure the monitor gives, so a chart's
point and ``Monitor.stats`` over the same buckets agree to the digit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from .stats import TaskWindow, merge

PERCENTILES = (50, 95, 99)


@dataclass(frozen=True, slots=True)
class Series:
    """Chart points of one queue, ``step`` seconds apart, oldest first.

    ``processed`` counts jobs finished for good (succeeded or dead) per second, ``failed``
    failed runs per second, ``enqueued`` jobs enqueued per second; ``wait`` and ``run``
    map ``"p50"``, ``"p95"``, ``"p99"`` to durations in seconds (None where nothing ran).
    """

    step: int
    t: list[int] = field(default_factory=list)
    processed: list[float] = field(default_factory=list)
    failed: list[float] = field(default_factory=list)
    enqueued: list[float] = field(default_factory=list)
    wait: dict[str, list[float | None]] = field(default_factory=dict)
    run: dict[str, list[float | None]] = field(default_factory=dict)


def build_series(starts: Sequence[int], buckets: Sequence[dict[str, TaskWindow]], width: int,
                 points: int = 90) -> Series:
    """Group ``buckets`` (one per start) into at most ``points`` steps."""
    group = max(1, math.ceil(len(starts) / points))
    step = width * group
    out = Series(step, wait={f"p{p}": [] for p in PERCENTILES},
                 run={f"p{p}": [] for p in PERCENTILES})
    for i in range(0, len(starts), group):
        part = merge(buckets[i: i + group])
        c = part.counters
        out.t.append(starts[i])
        out.processed.append(round((c.get("succeeded", 0) + c.get("dead", 0)) / step, 3))
        out.failed.append(round(c.get("failed", 0) / step, 3))
        out.enqueued.append(round(c.get("enqueued", 0) / step, 3))
        for p in PERCENTILES:
            out.wait[f"p{p}"].append(part.wait.quantile(p / 100))
            out.run[f"p{p}"].append(part.run.quantile(p / 100))
    return out
