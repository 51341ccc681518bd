"""Time series from the metric buckets of a queue, for the dashboard's charts.

A bucket is a hash ``<metrics_prefix><start s>`` (``limits.bucket_seconds`` wide) with
fields ``<task>|<counter>``, ``<task>|wsum`` / ``<task>|rsum`` (seconds) and log-scale
histograms ``<task>|w|<bin>`` / ``<task>|r|<bin>``: bin 0 holds durations under 1 µs and
bin i >= 1 holds [GROWTH^(i-1), GROWTH^i) µs. A percentile is reported as the upper edge
of the bin it falls in, so it is never under the true value by more than 10 %.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..app import Conveyor

GROWTH = 1.1
COUNTERS = ("enqueued", "started", "succeeded", "failed", "retried", "dead")
PERCENTILES = (50, 95, 99)


@dataclass
class Tally:
    """Counters and duration histograms of one task (or of all tasks) over some buckets."""

    counts: Counter[str] = field(default_factory=Counter)
    wait_bins: Counter[int] = field(default_factory=Counter)
    run_bins: Counter[int] = field(default_factory=Counter)
    wait_sum: float = 0.0
    run_sum: float = 0.0

    def add(self, other: Tally) -> None:
        self.counts.update(other.counts)
        self.wait_bins.update(other.wait_bins)
        self.run_bins.update(other.run_bins)
        self.wait_sum += other.wait_sum
        self.run_sum += other.run_sum

    def durations(self, which: str) -> dict[str, float | None]:
        """``mean``, ``p50``, ``p95``, ``p99`` of wait (``"wait"``) or run time, seconds."""
        bins = self.wait_bins if which == "wait" else self.run_bins
        total = self.wait_sum if which == "wait" else self.run_sum
        n = sum(bins.values())
        out: dict[str, float | None] = {"mean": total / n if n else None}
        for p in PERCENTILES:
            out[f"p{p}"] = percentile(bins, p)
        return out


def bin_upper_seconds(index: int) -> float:
    """Upper edge of histogram bin ``index`` in seconds."""
    return float(1e-6 * GROWTH**index) if index > 0 else 1e-6


def percentile(bins: Mapping[int, int], p: float) -> float | None:
    """The ``p``-th percentile of a histogram (upper bin edge), None when empty."""
    n = sum(bins.values())
    if n == 0:
        return None
    rank = math.ceil(n * p / 100)
    seen = 0
    for index in sorted(bins):
        seen += bins[index]
        if seen >= rank:
            return bin_upper_seconds(index)
    return bin_upper_seconds(max(bins))


def parse_bucket(record: Mapping[bytes, bytes]) -> dict[str, Tally]:
    """Split one bucket hash into a :class:`Tally` per task name."""
    tallies: dict[str, Tally] = {}
    for raw_field, raw_value in record.items():
        name = raw_field.decode()
        head, _, last = name.rpartition("|")
        if not head:
            continue
        if last.isdigit() and head.endswith(("|w", "|r")):
            task, kind = head[:-2], head[-1]
            tally = tallies.setdefault(task, Tally())
            bins = tally.wait_bins if kind == "w" else tally.run_bins
            bins[int(last)] += int(raw_value)
            continue
        tally = tallies.setdefault(head, Tally())
        if last == "wsum":
            tally.wait_sum += float(raw_value)
        elif last == "rsum":
            tally.run_sum += float(raw_value)
        elif last in COUNTERS:
            tally.counts[last] += int(float(raw_value))
    return tallies


def server_time(app: Conveyor) -> float:
    sec, usec = app.redis.time()
    return float(sec) + float(usec) / 1e6


def read_buckets(
    app: Conveyor, queues: Iterable[str], window: float, now: float | None = None
) -> tuple[list[int], dict[str, list[dict[str, Tally]]]]:
    """Bucket starts covering the last ``window`` seconds and, per queue, the parsed buckets.

    All reads go out in one pipelined round trip.
    """
    width = app.limits.bucket_seconds
    now = server_time(app) if now is None else now
    last = int(now // width) * width
    count = max(1, math.ceil(window / width))
    starts = [last - width * i for i in range(count - 1, -1, -1)]
    names = list(queues)
    with app.redis.pipeline(transaction=False) as pipe:
        for queue in names:
            keys = app.keys(queue)
            for start in starts:
                pipe.hgetall(keys.metrics(start))
        replies = pipe.execute()
    out: dict[str, list[dict[str, Tally]]] = {}
    for i, queue in enumerate(names):
        chunk = replies[i * len(starts) : (i + 1) * len(starts)]
        out[queue] = [parse_bucket(r) for r in chunk]
    return starts, out


def merge(buckets: Sequence[dict[str, Tally]], task: str | None = None) -> Tally:
    """One tally over ``buckets``, for ``task`` or for every task."""
    total = Tally()
    for bucket in buckets:
        for name, tally in bucket.items():
            if task is None or name == task:
                total.add(tally)
    return total


def summary(tally: Tally, seconds: float) -> dict[str, Any]:
    """Counters, throughput (jobs finished for good: succeeded or dead, per second),
    failure rate (failed runs over runs) and durations of a tally."""
    counts = {name: tally.counts.get(name, 0) for name in COUNTERS}
    finished = counts["succeeded"] + counts["dead"]
    runs = counts["succeeded"] + counts["failed"]
    return {
        **counts,
        "throughput": finished / seconds if seconds > 0 else 0.0,
        "failure_rate": counts["failed"] / runs if runs else None,
        "wait": tally.durations("wait"),
        "run": tally.durations("run"),
    }


def series(
    starts: Sequence[int], buckets: Sequence[dict[str, Tally]], width: int, points: int = 90
) -> dict[str, Any]:
    """Chart-ready series: buckets grouped into at most ``points`` steps.

    ``processed`` counts jobs finished for good (succeeded or dead), ``failed`` failed
    runs. Rates are per second; durations are seconds (None where nothing ran).
    """
    group = max(1, math.ceil(len(starts) / points))
    step = width * group
    out: dict[str, Any] = {"step": step, "t": [], "processed": [], "failed": [],
                           "enqueued": []}
    for which in ("wait", "run"):
        for p in PERCENTILES:
            out[f"{which}_p{p}"] = []
    for i in range(0, len(starts), group):
        tally = Tally()
        for bucket in buckets[i : i + group]:
            tally.add(merge([bucket]))
        out["t"].append(starts[i])
        finished = tally.counts["succeeded"] + tally.counts["dead"]
        out["processed"].append(round(finished / step, 3))
        out["failed"].append(round(tally.counts["failed"] / step, 3))
        out["enqueued"].append(round(tally.counts["enqueued"] / step, 3))
        for which in ("wait", "run"):
            figures = tally.durations(which)
            for p in PERCENTILES:
                out[f"{which}_p{p}"].append(figures[f"p{p}"])
    return out
