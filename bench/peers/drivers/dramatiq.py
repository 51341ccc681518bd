"""Dramatiq driver: ``RedisBroker``, ``actor.send`` for enqueue, no bulk API.

The ``dramatiq`` CLI defaults to one process per CPU with 8 threads each;
"1 process, defaults" pins ``-p 1`` and leaves the threads at 8.
"""

from __future__ import annotations

import os
import sys

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from .base import Driver, Profile
from .common import QUEUE, record, redis_url

broker = RedisBroker(url=redis_url())
dramatiq.set_broker(broker)


@dramatiq.actor(actor_name="incr", queue_name=QUEUE)
def incr(ts: float = 0.0) -> None:
    record(ts)


class DramatiqDriver(Driver):
    name = "dramatiq"
    dist = "dramatiq"
    modes = ("sync",)
    profiles = {
        "default": Profile(1, "`dramatiq -p 1` (8 threads, default middleware)"),
        "best": Profile(1, "`dramatiq -p 2 -t 16`"),
    }
    notes = ("enqueue = actor.send(); group() sends one message at a time, so no bulk",)
    delayed = "sync"
    delayed_api = "incr.send_with_options(args=(due,), delay=milliseconds)"

    def enqueue_one(self, ts: float) -> None:
        incr.send(ts)

    def enqueue_delayed(self, due_ts: float, delay_s: float) -> None:
        incr.send_with_options(args=(due_ts,), delay=round(delay_s * 1000))

    def run_worker(self, profile: str, burst: bool) -> None:
        argv = [sys.executable, "-m", "dramatiq", __name__, "-Q", QUEUE]
        argv += ["-p", "2", "-t", "16"] if profile == "best" else ["-p", "1"]
        os.execv(sys.executable, argv)


DRIVER = DramatiqDriver()
