"""How long to wait before trying Redis again after consecutive failures."""

from __future__ import annotations

FIRST = 0.05  # seconds after the first failure
LONGEST = 5.0  # never longer: a restarted Redis is picked up within this


def pause_after(failures: int) -> float:
    """Exponential pause after ``failures`` consecutive failures, capped at ``LONGEST``."""
    return float(min(LONGEST, FIRST * 2 ** min(failures, 16)))
