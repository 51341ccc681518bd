"""An application for supervisor tests (``conveyor worker apps.supervised:app -p N``).

Its tasks write a ledger on their own connection (a count per job label, and the pid that
ran it), so a test can tell a job run twice from one run once, and which child ran it.
Redis and the namespace come from ``$CONVEYOR_REDIS_URL`` and ``$SUPERVISED_NAMESPACE``.
"""

from __future__ import annotations

import os
import threading
import time

import redis

import conveyor

QUEUE = "supervised"
NAMESPACE = os.environ.get("SUPERVISED_NAMESPACE", "supervised")
IDLE_THRESHOLD = 1.0  # short, so the autoscaler scales in soon after a burst
STUCK_TIMEOUT = 0.5

_ledger: redis.Redis | None = None
_ledger_lock = threading.Lock()


def counts_key(namespace: str = NAMESPACE) -> str:
    return f"{namespace}:ledger:counts"  # hash: label -> runs started


def runs_key(namespace: str = NAMESPACE) -> str:
    return f"{namespace}:ledger:runs"  # list: "<label> <pid>"


def note(label: str) -> None:
    global _ledger
    # One client for the process, made under a lock: two first jobs on two threads that
    # each made one would leave one client to the garbage collector, which closes its
    # connections, one of them in use by the other job (its ledger write then failed).
    with _ledger_lock:
        if _ledger is None:
            _ledger = redis.Redis.from_url(app.url)
        ledger = _ledger
    with ledger.pipeline(transaction=False) as pipe:
        pipe.hincrby(counts_key(), label, 1)
        pipe.rpush(runs_key(), f"{label} {os.getpid()}")
        pipe.execute()


def build(url: str | None, namespace: str) -> conveyor.Conveyor:
    """The app with its tasks registered (a test enqueues through one built on its own
    namespace; the worker processes import :data:`app`)."""
    application = conveyor.Conveyor(url, namespace=namespace)
    task = application.task
    task(name="supervised.work", queue=QUEUE, idle_threshold=IDLE_THRESHOLD, retries=5,
         visibility_timeout=5)(work)
    task(name="supervised.stuck", queue=QUEUE, timeout=STUCK_TIMEOUT, retries=1,
         visibility_timeout=5, idle_threshold=IDLE_THRESHOLD)(stuck)
    return application


def work(label: str, seconds: float) -> str:
    """Note the run, then take ``seconds`` (a sync task: it holds a thread)."""
    note(label)
    time.sleep(seconds)
    return label


def stuck(label: str) -> None:
    """Never returns in time: a thread that no timeout can interrupt."""
    note(label)
    time.sleep(300)


app = build(None, NAMESPACE)
