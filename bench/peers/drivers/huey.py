"""Huey driver: ``RedisHuey``; calling a task enqueues it; no bulk API.

``Task.map`` is a loop of single enqueues, so it is not counted as bulk.
The consumer defaults to one worker thread.
"""

from __future__ import annotations

import os
import sys

from huey import RedisHuey

from .base import Driver, Profile
from .common import QUEUE, record, redis_url

huey = RedisHuey(QUEUE, url=redis_url())


@huey.task()
def incr(ts: float = 0.0) -> None:
    record(ts)


class HueyDriver(Driver):
    name = "huey"
    dist = "huey"
    modes = ("sync",)
    profiles = {
        "default": Profile(1, "`huey_consumer` (1 worker thread, blocking BRPOP)"),
        "best": Profile(1, "`huey_consumer -k process -w 2`"),
    }
    notes = ("results stored (RedisHuey default)",)
    delayed = "sync"
    delayed_api = "incr.schedule(args=(due,), delay=seconds); consumer's scheduler (1 s tick)"

    def enqueue_one(self, ts: float) -> None:
        incr(ts)

    def enqueue_delayed(self, due_ts: float, delay_s: float) -> None:
        incr.schedule(args=(due_ts,), delay=delay_s)

    def run_worker(self, profile: str, burst: bool) -> None:
        argv = [sys.executable, "-m", "huey.bin.huey_consumer", f"{__name__}.huey", "-q"]
        if profile == "best":
            argv += ["-k", "process", "-w", "2"]
        os.execv(sys.executable, argv)


DRIVER = HueyDriver()
