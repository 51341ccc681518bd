"""Read-only views of what the queues and workers are doing."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..app import Conveyor


class Monitor:
    """Answers operators' questions from Redis; never changes anything."""

    def __init__(self, app: Conveyor) -> None:
        self.app = app

    def _queues_of(self, task: str) -> list[str]:
        known = self.app.tasks.get(task)
        return [known.queue] if known else self.app.known_queues()

    def active(self, task: str) -> int:
        """How many jobs of ``task`` are leased to workers now (never negative)."""
        total = 0
        for queue in self._queues_of(task):
            value = self.app.redis.hget(self.app.keys(queue).active, task)
            total += max(0, int(value or 0))
        return total

    def idle_since(self, task: str) -> float | None:
        """When a job of ``task`` last finished (epoch s, server clock); None if never."""
        latest: float | None = None
        for queue in self._queues_of(task):
            value = self.app.redis.hget(self.app.keys(queue).idle, task)
            if value is not None:
                latest = max(latest or 0.0, float(value))
        return latest

    def is_idle(self, task: str, threshold: float | None = None) -> bool:
        """True when no job of ``task`` runs and none finished within ``threshold`` seconds
        (default: the task's ``idle_threshold``). A type never seen is idle."""
        if threshold is None:
            known = self.app.tasks.get(task)
            threshold = known.idle_threshold if known else 300.0
        if self.active(task) > 0:
            return False
        since = self.idle_since(task)
        if since is None:
            return True
        return self._server_time() - since >= threshold

    def _server_time(self) -> float:
        sec, usec = self.app.redis.time()
        return sec + usec / 1e6 if sec else time.time()
