"""Celery driver: Redis transport (kombu), ``delay`` for enqueue, no bulk API.

Celery has no bulk enqueue (a ``group`` still publishes message by message).
Workers are the ``celery worker`` CLI.  With prefork, the parent process does
all Redis I/O and feeds children over pipes; on 2 cores two ``solo`` workers
(no pool) were measured faster than prefork ``-c 2`` or ``threads -c 8``.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime

from celery import Celery

from .base import Driver, Profile
from .common import QUEUE, record, redis_url

app = Celery("bench", broker=redis_url())
app.conf.update(
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="bench.incr")
def incr(ts: float = 0.0) -> None:
    record(ts)


class CeleryDriver(Driver):
    name = "celery"
    dist = "celery"
    modes = ("sync",)
    profiles = {
        "default": Profile(1, "`celery worker -c 1` (prefork pool, one child)"),
        "best": Profile(
            2,
            "2 x `celery worker --pool solo --prefetch-multiplier 16 --without-gossip "
            "--without-mingle --without-heartbeat` (beat prefork -c 2 and threads -c 8 here)",
        ),
    }
    notes = ("enqueue = task.delay(); no result backend",)
    delayed = "sync"
    delayed_api = "incr.apply_async(args=(due,), eta=due as an aware datetime)"

    def enqueue_one(self, ts: float) -> None:
        incr.delay(ts)

    def enqueue_delayed(self, due_ts: float, delay_s: float) -> None:
        incr.apply_async(args=(due_ts,), eta=datetime.fromtimestamp(due_ts, tz=UTC))

    def run_worker(self, profile: str, burst: bool) -> None:
        argv = [sys.executable, "-m", "celery", "-A", __name__, "worker", "-Q", QUEUE,
                "--loglevel", "WARNING"]  # fmt: skip
        if profile == "best":
            argv += ["--pool", "solo", "--prefetch-multiplier", "16", "--without-gossip",
                     "--without-mingle", "--without-heartbeat"]  # fmt: skip
        else:
            argv += ["-c", "1"]
        os.execv(sys.executable, argv)


DRIVER = CeleryDriver()
