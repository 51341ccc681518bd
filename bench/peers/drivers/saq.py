"""SAQ driver: async only (``Queue.enqueue``), no bulk API.

``Queue.map`` enqueues many jobs but waits for their results, so it is not a
bulk *enqueue*.  Workers are the ``saq`` CLI (default concurrency 10);
``best`` uses its ``--workers 2`` with concurrency 32.
"""

from __future__ import annotations

import math
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
    delayed = "async"
    delayed_api = (
        "await queue.enqueue('incr', scheduled=epoch seconds); `scheduled` is a whole "
        "second, so each due time is rounded up to the next second"
    )

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

    async def aenqueue_delayed(self, due_ts: float, delay_s: float) -> float:
        assert self.queue is not None
        scheduled = math.ceil(due_ts)  # the API takes int epoch seconds
        await self.queue.enqueue("incr", scheduled=scheduled, ts=float(scheduled))
        return float(scheduled)

    def run_worker(self, profile: str, burst: bool) -> None:
        argv = [sys.executable, "-m", "saq", "--quiet"]
        if profile == "best":
            argv += [f"{__name__}.best_settings", "--workers", "2"]
        else:
            argv += [f"{__name__}.settings"]
        os.execv(sys.executable, argv)


DRIVER = SaqDriver()
