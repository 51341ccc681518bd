"""Trying Redis again: which errors mean "try later", and how long to wait."""

from __future__ import annotations

import time

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


class QueueBackoff:
    """Per-queue back-off for a worker loop that serves several queues: a queue whose
    call failed waits out its own pause (growing with its failures in a row) while the
    loop goes on with the others."""

    def __init__(self) -> None:
        self._failing: dict[str, tuple[int, float]] = {}  # failures in a row, retry at

    def failed(self, queue: str) -> float:
        """Note a failure of ``queue``; returns its pause (seconds)."""
        failures = self._failing.get(queue, (0, 0.0))[0] + 1
        pause = pause_after(failures)
        self._failing[queue] = (failures, time.monotonic() + pause)
        return pause

    def succeeded(self, queue: str) -> bool:
        """Note a success of ``queue``; True if it was failing until now."""
        return self._failing.pop(queue, None) is not None

    def waiting(self, queue: str) -> bool:
        """Whether ``queue`` is still within its pause."""
        failing = self._failing.get(queue)
        return failing is not None and time.monotonic() < failing[1]

    def next_retry(self) -> float | None:
        """Seconds until the earliest failing queue may be tried again (0 if one may be
        now), or None when none is failing."""
        if not self._failing:
            return None
        return max(0.0, min(at for _, at in self._failing.values()) - time.monotonic())
