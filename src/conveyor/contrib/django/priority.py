"""Django's task priorities (-100 to 100, default 0) folded onto conveyor's ten (0 to 9,
default 5).

The folding is monotonic: a larger Django priority never maps to a smaller conveyor one,
so of two jobs ready at once the one with the larger Django priority never runs after the
other, unless both fold onto the same conveyor priority; those run in the order they
were enqueued. :data:`TABLE` is the whole mapping, as ``docs/django.md`` shows it.
"""

from __future__ import annotations

import math

__all__ = ["TABLE", "to_conveyor_priority"]


def to_conveyor_priority(priority: int) -> int:
    """Django's -100..100 (default 0) onto conveyor's 0..9 (default 5), order kept: 0 is
    5, the positive quarters 6 to 9, the negative fifths 4 down to 0."""
    if priority == 0:
        return 5
    if priority > 0:
        return min(9, 5 + math.ceil(min(priority, 100) * 4 / 100))
    return max(0, 5 - math.ceil(min(-priority, 100) * 5 / 100))


def _table() -> tuple[tuple[int, int, int], ...]:
    """(lowest Django priority, highest Django priority, conveyor priority), by rising
    conveyor priority."""
    spans: dict[int, list[int]] = {}
    for priority in range(-100, 101):
        spans.setdefault(to_conveyor_priority(priority), []).append(priority)
    return tuple((min(s), max(s), level) for level, s in sorted(spans.items()))


TABLE = _table()
