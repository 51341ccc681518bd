"""taskiq driver: ``RedisStreamBroker`` (acknowledged streams), async ``kiq``.

The broker creates its consumer group at ``startup()`` with id ``$``, so it
must exist before jobs are sent (FLUSHALL drops it): every enqueue session
calls ``startup()`` first, as a taskiq client is meant to.  The ``taskiq
worker`` CLI defaults to 2 processes; "1 process, defaults" pins
``--workers 1``.
"""

from __future__ import annotations

import os
import sys

from taskiq_redis import RedisStreamBroker

from .base import Driver, Profile
from .common import QUEUE, arecord, redis_url

broker = RedisStreamBroker(url=redis_url(), queue_name=QUEUE)


@broker.task(task_name="incr")
async def incr(ts: float = 0.0) -> None:
    await arecord(ts)


class TaskiqDriver(Driver):
    name = "taskiq"
    dist = "taskiq"
    modes = ("async",)
    profiles = {
        "default": Profile(1, "`taskiq worker --workers 1` (max-async-tasks 100)"),
        "best": Profile(1, "`taskiq worker --workers 2`"),
    }
    notes = ("enqueue = await task.kiq(ts); taskiq-redis RedisStreamBroker",)
    delayed_api = (
        "only through a separate `taskiq scheduler` process and a schedule source "
        "(schedule_by_time; whole seconds, sources re-read once a minute by default)"
    )

    async def asetup(self) -> None:
        await broker.startup()

    async def ateardown(self) -> None:
        await broker.shutdown()

    async def aenqueue_one(self, ts: float) -> None:
        await incr.kiq(ts)

    def run_worker(self, profile: str, burst: bool) -> None:
        workers = "2" if profile == "best" else "1"
        argv = [sys.executable, "-m", "taskiq", "worker", f"{__name__}:broker",
                "--workers", workers, "--log-level", "WARNING"]  # fmt: skip
        os.execv(sys.executable, argv)


DRIVER = TaskiqDriver()
