"""streaq driver: async ``task.enqueue`` and pipelined ``Worker.enqueue_many``.

streaq talks to Redis through coredis; redis-py is there only for the shared
task body.  Workers are the ``streaq run`` CLI (concurrency 16 by default).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from streaq import Worker

from .base import Driver, Profile
from .common import QUEUE, arecord, redis_url


def _make_worker(**options: Any) -> Worker[Any]:
    """A worker with the ``incr`` task; one per profile (``include`` would re-home tasks)."""
    w: Worker[Any] = Worker(redis_url=redis_url(), queue_name=QUEUE, **options)

    @w.task(name="incr", silent=True)  # silent: no per-job log line, as for the other peers
    async def incr(ts: float = 0.0) -> None:
        await arecord(ts)

    return w


worker = _make_worker()
best_worker = _make_worker(concurrency=32)
incr = worker.registry["incr"]


class StreaqDriver(Driver):
    name = "streaq"
    dist = "streaq"
    modes = ("async", "abulk")
    profiles = {
        "default": Profile(1, "`streaq run module:worker` (concurrency 16)"),
        "best": Profile(1, "`streaq run module:best_worker --workers 2` (concurrency 32)"),
    }
    notes = ("bulk = await worker.enqueue_many([...]), one pipeline",)
    delayed = "async"
    delayed_api = "await incr.enqueue(due).start(delay=timedelta)"

    def __init__(self) -> None:
        self.stack = contextlib.AsyncExitStack()

    async def asetup(self) -> None:
        await self.stack.enter_async_context(worker)

    async def ateardown(self) -> None:
        await self.stack.aclose()

    async def aenqueue_one(self, ts: float) -> None:
        await incr.enqueue(ts)

    async def aenqueue_batch(self, tss: Sequence[float]) -> None:
        await worker.enqueue_many([incr.enqueue(ts) for ts in tss])

    async def aenqueue_delayed(self, due_ts: float, delay_s: float) -> None:
        await incr.enqueue(due_ts).start(delay=timedelta(seconds=delay_s))

    def run_worker(self, profile: str, burst: bool) -> None:
        target = "best_worker" if profile == "best" else "worker"
        argv = [sys.executable, "-m", "streaq", "run", f"{__name__}:{target}"]
        if profile == "best":
            argv += ["--workers", "2"]
        os.execv(sys.executable, argv)


DRIVER = StreaqDriver()
