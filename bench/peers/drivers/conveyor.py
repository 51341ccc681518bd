"""conveyor adapter, written against conveyor's pinned public API.

Runs in the repository's own interpreter.  Workers are started through the
Python API (``app.worker(...).run(burst=...)``), one per process the harness
spawns, so the figures do not depend on a supervisor CLI.  ``default`` is one
process at conveyor's default concurrency (32); ``best`` mirrors
``conveyor worker ... -p 2 -c 96``: of 2 or 3 processes at concurrency 64 or
96, the fastest at draining with either task body here, and with the body as an
``async def`` task, which conveyor runs on its event loop (as the asyncio-native
peers run theirs) rather than on threads. The job is the same either way: the two
apps below register the same task name on the same queue, so what is enqueued
does not depend on the profile that runs it. Concurrency 96 stays within the
body's redis-py pool (100 connections per process).
"""

from __future__ import annotations

from collections.abc import Sequence

import conveyor

from .base import Driver, Profile
from .common import QUEUE, arecord, record, redis_url

app = conveyor.Conveyor(redis_url())
async_app = conveyor.Conveyor(redis_url())
"""The "best" profile's worker: the same task name and queue, the body as ``async def``."""


@app.task(name="bench.incr", queue=QUEUE)
def incr(ts: float = 0.0) -> None:
    record(ts)


@async_app.task(name="bench.incr", queue=QUEUE)
async def aincr(ts: float = 0.0) -> None:
    await arecord(ts)


class ConveyorDriver(Driver):
    name = "conveyor"
    dist = "conveyor"
    modes = ("sync", "bulk", "async", "abulk")
    profiles = {
        "default": Profile(1, "1 process, app.worker(queues=['bench'], concurrency=32)"),
        "best": Profile(2, "2 processes x app.worker(concurrency=96) (= -p 2 -c 96),"
                           " the body as an async def task"),
    }
    notes = ("default: sync task, plain redis.Redis per process for the INCR; best: the"
             " same body as an async def task, redis.asyncio.Redis per process",)
    delayed = "sync"
    delayed_api = "incr.options(delay=seconds).enqueue(due)"

    def enqueue_one(self, ts: float) -> None:
        incr.enqueue(ts)

    def enqueue_batch(self, tss: Sequence[float]) -> None:
        incr.enqueue_many([(ts,) for ts in tss])

    def enqueue_delayed(self, due_ts: float, delay_s: float) -> None:
        incr.options(delay=delay_s).enqueue(due_ts)

    async def aenqueue_one(self, ts: float) -> None:
        await incr.aenqueue(ts)

    async def aenqueue_batch(self, tss: Sequence[float]) -> None:
        await incr.aenqueue_many([(ts,) for ts in tss])

    def run_worker(self, profile: str, burst: bool) -> None:
        if profile == "best":
            async_app.worker(queues=[QUEUE], concurrency=96).run(burst=burst)
        else:
            app.worker(queues=[QUEUE], concurrency=32).run(burst=burst)

    def version(self) -> str:
        try:
            return super().version()
        except Exception:  # running from src/ without an install
            return str(getattr(conveyor, "__version__", "working tree"))


DRIVER = ConveyorDriver()
