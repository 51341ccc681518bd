"""BullMQ (Python port) driver: async ``Queue.add`` and ``Queue.addBulk``.

The port has no worker CLI, so the driver runs ``bullmq.Worker`` itself and
closes it on SIGTERM.  BullMQ's default worker concurrency is 1; ``best``
runs two processes with 32 each.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Sequence
from typing import Any

from bullmq import Queue, Worker

from .base import Driver, Profile
from .common import QUEUE, arecord, redis_url


async def process(job: Any, token: str) -> None:
    await arecord(job.data["ts"])


async def _serve(concurrency: int | None) -> None:
    opts: dict[str, Any] = {"connection": redis_url()}
    if concurrency:
        opts["concurrency"] = concurrency
    w = Worker(QUEUE, process, opts)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await w.close()


class BullMQDriver(Driver):
    name = "bullmq"
    dist = "bullmq"
    modes = ("async", "abulk")
    profiles = {
        "default": Profile(1, "1 process, Worker defaults (concurrency 1)"),
        "best": Profile(2, "2 processes, Worker concurrency 32"),
    }
    notes = ("enqueue = await queue.add(); bulk = await queue.addBulk([...])",)
    delayed = "async"
    delayed_api = "await queue.add('incr', {'ts': due}, {'delay': milliseconds})"

    def __init__(self) -> None:
        self.queue: Queue | None = None

    async def asetup(self) -> None:
        self.queue = Queue(QUEUE, {"connection": redis_url()})

    async def ateardown(self) -> None:
        if self.queue is not None:
            await self.queue.close()

    async def aenqueue_one(self, ts: float) -> None:
        assert self.queue is not None
        await self.queue.add("incr", {"ts": ts})

    async def aenqueue_batch(self, tss: Sequence[float]) -> None:
        assert self.queue is not None
        await self.queue.addBulk([{"name": "incr", "data": {"ts": ts}} for ts in tss])

    async def aenqueue_delayed(self, due_ts: float, delay_s: float) -> None:
        assert self.queue is not None
        await self.queue.add("incr", {"ts": due_ts}, {"delay": round(delay_s * 1000)})

    def run_worker(self, profile: str, burst: bool) -> None:
        asyncio.run(_serve(32 if profile == "best" else None))


DRIVER = BullMQDriver()
