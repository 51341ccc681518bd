"""Trying Redis again: which errors mean "unreachable", and how long to wait."""

from __future__ import annotations

import redis.exceptions

CONNECTION_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)

FIRST = 0.05  # seconds after the first failure
LONGEST = 5.0  # never longer: a restarted Redis is picked up within this


def pause_after(failures: int) -> float:
    """Exponential pause after ``failures`` consecutive failures, capped at ``LONGEST``."""
    return float(min(LONGEST, FIRST * 2 ** min(failures, 16)))
