"""The server's clock, as seen from a worker.

Every fetch returns the server's time; the worker keeps the offset from its own monotonic
clock, so it can stamp when a task began and arm timers for due jobs without trusting its
own wall clock (clock skew between machines changes nothing).
"""

from __future__ import annotations

import time


class ServerClock:
    def __init__(self) -> None:
        self._offset: float | None = None  # server epoch seconds - local monotonic seconds

    def observe(self, server_ms: float) -> None:
        """Record the server time carried by a reply that has just arrived."""
        self._offset = server_ms / 1000 - time.monotonic()

    def passed(self, server_ms: float) -> None:
        """Record a time the server's clock has reached by now, from a reply that may have
        waited before it was read: it can only move the estimate forward."""
        if self._offset is None or server_ms / 1000 > self.now():
            self.observe(server_ms)

    def now(self) -> float:
        """Server epoch seconds now (the local wall clock until a reply has been seen)."""
        if self._offset is None:
            return time.time()
        return time.monotonic() + self._offset

    def seconds_until(self, server_ms: float) -> float:
        """Seconds from now until the server's clock reads ``server_ms``."""
        return server_ms / 1000 - self.now()
