"""SAQ driver: async only (``Queue.enqueue``), no bulk API.

``Queue.map`` enqueues many jobs but waits for their results, so it is not a
bulk *enqueue*.  Workers are the ``saq`` CLI (default concurrency 10);
``best`` uses its ``--workers 2`` with concurrency 32.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from saq import Queue

from .base import Driver, Profile
from .common import QUEUE, arecord, redis_url


async def incr(ctx: dict[str, Any], *, ts: float = 0.0) -> None:
    await arecord(ts)


queue = Queue.from_url(redis_url(), name=QUEUE)
settings = {"queue": queue, "functions": [incr]}
best_settings = {**settings, "concurrency": 32}


class SaqDriver(Driver):
    name = "saq"
    dist = "saq"
    modes = ("async",)
    profiles = {
        "default": Profile(1, "`saq settings` (1 process, concurrency 10)"),
        "best": Profile(1, "`saq best_settings --workers 2` (concurrency 32)"),
    }
    notes = ("enqueue = await queue.enqueue('incr', ts=ts)",)

    def __init__(self) -> None:
        self.queue: Queue | None = None

    async def asetup(self) -> None:
        self.queue = Queue.from_url(redis_url(), name=QUEUE)
        await self.queue.connect()

    async def ateardown(self) -> None:
        if self.queue is not None:
            await self.queue.disconnect()

    async def aenqueue_one(self, ts: float) -> None:
        assert self.queue is not None
        await self.queue.enqueue("incr", ts=ts)

    def run_worker(self, profile: str, burst: bool) -> None:
        argv = [sys.executable, "-m", "saq", "--quiet"]
        if profile == "best":
            argv += [f"{__name__}.best_settings", "--workers", "2"]
        else:
            argv += [f"{__name__}.settings"]
        os.execv(sys.executable, argv)


DRIVER = SaqDriver()
