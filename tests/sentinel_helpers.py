"""A real Sentinel set for tests: a primary, a replica and three sentinels on free ports.

The processes are managed by :class:`conveyor.chaos.sentinel.SentinelSet`, the same set
``conveyor chaos`` runs its failovers on; this wraps it with a temporary folder and the
short down-after period tests want.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from conveyor.chaos import sentinel
from helpers import REDIS_SERVER, wait_until

SERVICE = sentinel.SERVICE


class SentinelSet(sentinel.SentinelSet):
    """Primary + replica + three sentinels in a folder of their own."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="conveyor-sentinel-"))
        super().__init__(REDIS_SERVER, self.dir, down_after_ms=1000, failover_timeout_ms=5000)

    def failover(self, pause_writes: bool = True) -> str:
        """A failover (coordinated unless ``pause_writes`` is false), once the replica can
        be promoted."""
        done: list[str] = []

        def attempt() -> bool:
            detail = super(SentinelSet, self).failover(pause_writes)
            if detail is not None:
                done.append(detail)
            return bool(done)

        wait_until(attempt, 30, 0.1, "a failover")
        return done[0]

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
