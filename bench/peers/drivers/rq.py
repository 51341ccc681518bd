"""RQ driver: sync API, ``Queue.enqueue_many`` for bulk, the ``rq`` CLI for workers.

RQ's default ``Worker`` forks a "work horse" per job (isolation over speed);
the ``best`` profile uses RQ's own ``worker-pool`` with ``SimpleWorker`` (no
fork per job), two processes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from datetime import timedelta

import redis
from rq import Queue

from .base import Driver, Profile
from .common import QUEUE, incr, redis_url

# ``incr`` lives in the light ``common`` module: the default Worker imports it
# afresh in every forked work horse, and this module's imports would be paid
# per job.


class RQDriver(Driver):
    name = "rq"
    dist = "rq"
    modes = ("sync", "bulk")
    profiles = {
        "default": Profile(1, "`rq worker` (default Worker: one fork per job)"),
        "best": Profile(1, "`rq worker-pool -n 2 -w rq.worker.SimpleWorker` (no fork per job)"),
    }
    notes = ("bulk = Queue.enqueue_many(Queue.prepare_data(...)), one pipeline",)
    delayed = "sync"
    delayed_api = (
        "queue.enqueue_in(timedelta, incr, due); worker `rq worker --with-scheduler` "
        "(the scheduled registry keeps whole seconds)"
    )
    delayed_profile = "scheduler"

    def __init__(self) -> None:
        self.queue: Queue | None = None

    def setup(self) -> None:
        self.queue = Queue(QUEUE, connection=redis.Redis.from_url(redis_url()))

    def enqueue_one(self, ts: float) -> None:
        assert self.queue is not None
        self.queue.enqueue(incr, ts)

    def enqueue_batch(self, tss: Sequence[float]) -> None:
        assert self.queue is not None
        self.queue.enqueue_many([Queue.prepare_data(incr, (ts,)) for ts in tss])

    def enqueue_delayed(self, due_ts: float, delay_s: float) -> None:
        assert self.queue is not None
        self.queue.enqueue_in(timedelta(seconds=delay_s), incr, due_ts)

    def run_worker(self, profile: str, burst: bool) -> None:
        cli = [sys.executable, "-m", "rq.cli"]
        common = ["--url", redis_url(), "--quiet"]
        if profile == "best":
            argv = [*cli, "worker-pool", *common, "-n", "2", "-w", "rq.worker.SimpleWorker", QUEUE]
        else:
            argv = [*cli, "worker", *common, QUEUE]
            if profile == "scheduler":  # delayed jobs are moved to the queue by it
                argv.insert(-1, "--with-scheduler")
        os.execv(sys.executable, argv)


DRIVER = RQDriver()
