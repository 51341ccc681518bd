"""Celery driver: Redis transport (kombu), ``delay`` for enqueue, no bulk API.

Celery has no bulk enqueue (a ``group`` still publishes message by message).
Workers are the ``celery worker`` CLI with the default prefork pool.
"""

from __future__ import annotations

import os
import sys

from celery import Celery

from .common import QUEUE, Driver, Profile, record, redis_url

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
            1,
            "`celery worker -c 2 --prefetch-multiplier 16 --without-gossip --without-mingle "
            "--without-heartbeat` (prefork)",
        ),
    }
    notes = ("enqueue = task.delay(); no result backend",)

    def enqueue_one(self, ts: float) -> None:
        incr.delay(ts)

    def run_worker(self, profile: str, burst: bool) -> None:
        argv = [sys.executable, "-m", "celery", "-A", __name__, "worker", "-Q", QUEUE,
                "--loglevel", "WARNING"]  # fmt: skip
        if profile == "best":
            argv += ["-c", "2", "--prefetch-multiplier", "16", "--without-gossip",
                     "--without-mingle", "--without-heartbeat"]  # fmt: skip
        else:
            argv += ["-c", "1"]
        os.execv(sys.executable, argv)


DRIVER = CeleryDriver()
