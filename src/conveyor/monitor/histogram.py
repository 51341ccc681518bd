"""Log-scale histograms of durations, as the Lua scripts write them into metric buckets.

A duration lands in bin 0 when it is under 1 µs, else in bin ``i >= 1`` holding
``[GROWTH**(i-1), GROWTH**i)`` µs (see ``scripts/include/metrics.lua``). Each bin is 10 %
wide, so any percentile read back lies in the same bin as the exact one: within 10 %.
Bins from many buckets, tasks and queues merge by adding counts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

GROWTH = 1.1  # keep in step with HISTOGRAM_GROWTH in scripts/include/metrics.lua
MICRO = 1e-6


def bin_of(seconds: float) -> int:
    """The bin a duration falls in (the same arithmetic as the Lua side)."""
    us = seconds / MICRO
    if us < 1:
        return 0
    return math.floor(math.log(us) / math.log(GROWTH)) + 1


def bin_bounds(index: int) -> tuple[float, float]:
    """Lower and upper edge of a bin, in seconds."""
    if index <= 0:
        return 0.0, MICRO
    return GROWTH ** (index - 1) * MICRO, GROWTH**index * MICRO


@dataclass
class Histogram:
    """Counts per bin, plus the exact sum of the observed durations (for the mean)."""

    bins: dict[int, int] = field(default_factory=dict)
    total: float = 0.0

    @property
    def count(self) -> int:
        return sum(self.bins.values())

    def add_bin(self, index: int, n: int) -> None:
        if n:
            self.bins[index] = self.bins.get(index, 0) + n

    def observe(self, seconds: float) -> None:
        """Record one duration (used by tests and by readers that compute locally)."""
        self.add_bin(bin_of(max(0.0, seconds)), 1)
        self.total += max(0.0, seconds)

    def merge(self, other: Histogram) -> None:
        for index, n in other.bins.items():
            self.add_bin(index, n)
        self.total += other.total

    @property
    def mean(self) -> float | None:
        """The exact mean. The total is rounded to the microsecond the scripts write
        durations in, so a sum that Redis added up (``ZUNION``) and one added here in
        another order give the same mean to the digit."""
        n = self.count
        return round(self.total, 6) / n if n else None

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (0 < q <= 1) by nearest rank, interpolated inside its bin.

        :param q: fraction, e.g. 0.95 for p95
        """
        n = self.count
        if n == 0:
            return None
        rank = max(1, math.ceil(q * n))
        seen = 0
        for index in sorted(self.bins):
            in_bin = self.bins[index]
            if seen + in_bin >= rank:
                low, high = bin_bounds(index)
                # Spread the bin's observations evenly on the log scale between its edges.
                position = (rank - seen - 0.5) / in_bin
                if low == 0.0:
                    return high * position
                return float(low * (high / low) ** position)
            seen += in_bin
        return bin_bounds(max(self.bins))[1]  # pragma: no cover - rank <= n always lands

    def cumulative(self, edges: Iterable[float]) -> list[int]:
        """Counts of observations at or under each edge (seconds), for Prometheus ``le``.

        A bin counts under an edge when its upper bound is at or under the edge, so the
        counts may lag by at most one bin (10 %)."""
        ordered = sorted(self.bins.items())
        out = []
        for edge in edges:
            out.append(sum(n for i, n in ordered if bin_bounds(i)[1] <= edge * (1 + 1e-9)))
        return out
