"""Trying Redis again: which errors mean "try later", and how long to wait."""

from __future__ import annotations

import redis.exceptions

CONNECTION_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)
# Everything Redis (or the way to it) can answer with: unreachable, a timeout, and every
# refusal a healthy deployment produces now and then — out of memory, READONLY or
# UNBLOCKED during a failover, LOADING after a restart, BUSY behind a slow script,
# NOSCRIPT after a flush, CLUSTERDOWN or MOVED while a cluster reshapes. A worker's loops
# wait and try again after any of them; none may end a loop.
REDIS_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError)

FIRST = 0.05  # seconds after the first failure
LONGEST = 5.0  # never longer: a restarted Redis is picked up within this


def pause_after(failures: int) -> float:
    """Exponential pause after ``failures`` consecutive failures, capped at ``LONGEST``."""
    return float(min(LONGEST, FIRST * 2 ** min(failures, 16)))
