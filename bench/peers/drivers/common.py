"""The task body and the names every driver shares.

Deliberately light (stdlib + redis-py, ``redis.asyncio`` only on first use):
RQ's default worker imports the task module afresh in every forked work
horse, so anything imported here is paid per job there.

The task body is tiny -- one ``INCR`` on :data:`COUNTER_KEY` -- so the
benchmark measures queue overhead, and the harness counts completions from
Redis itself instead of trusting a peer's own bookkeeping.

With ``BENCH_BODY=free`` in the worker's environment the body is nearly free:
it bumps a process-local counter, and a daemon thread adds what accumulated to
:data:`COUNTER_KEY` every :data:`FLUSH_INTERVAL_S` (one ``INCRBY``), so the
harness still counts completions while the queue, not the body, is what costs.
Latency probes (``ts`` set) always take the full path: they need their sample.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from typing import Any

import redis

COUNTER_KEY = "bench:done"
"""Every executed task increments this key once."""
LATENCY_KEY = "bench:latency"
"""Latency probes push ``"<enqueued> <started - enqueued>"`` (epoch s, seconds) here."""
CALLS_KEY = "bench:latency:calls"
"""The driver pushes ``"<enqueued> <seconds the enqueue call took>"`` per probe here."""
QUEUE = "bench"
"""Queue name used by every peer that has named queues."""
BODY_ENV = "BENCH_BODY"
"""``free`` selects the nearly free body (see the module docstring)."""
FREE_BODY = os.environ.get(BODY_ENV) == "free"
FLUSH_INTERVAL_S = 0.005


def redis_url() -> str:
    """The private benchmark server, passed by the harness."""
    return os.environ["BENCH_REDIS_URL"]


def note_calls(calls: list[str]) -> None:
    """Record how long each latency probe's enqueue call took (see :data:`CALLS_KEY`)."""
    client = redis.Redis.from_url(redis_url())
    try:
        client.rpush(CALLS_KEY, *calls)
    finally:
        client.close()


# --------------------------------------------------------------------------- task body

_sync_client: redis.Redis | None = None
_async_clients: dict[int, Any] = {}


def _latency_pipeline(pipe: Any, started: float, ts: float) -> None:
    # RPUSH before INCR: once the counter says "done", the sample is there. The probe's
    # enqueue time names it, so the harness can match the driver's call duration to it.
    pipe.rpush(LATENCY_KEY, f"{ts!r} {started - ts!r}")
    pipe.incr(COUNTER_KEY)


def record(ts: float = 0.0) -> None:
    """Synchronous task body: INCR the counter; log latency if ``ts`` is set."""
    global _sync_client
    started = time.time()
    if FREE_BODY and not ts:
        bump()
        return
    if _sync_client is None:  # created lazily so it is per process (fork-safe)
        _sync_client = redis.Redis.from_url(redis_url())
    if not ts:
        _sync_client.incr(COUNTER_KEY)
        return
    pipe = _sync_client.pipeline(transaction=False)
    _latency_pipeline(pipe, started, ts)
    pipe.execute()


async def arecord(ts: float = 0.0) -> None:
    """Async task body for async-first peers (a blocking call would stall their loop)."""
    import asyncio

    started = time.time()
    if FREE_BODY and not ts:
        bump()
        return
    loop_id = id(asyncio.get_running_loop())
    client = _async_clients.get(loop_id)
    if client is None:
        import redis.asyncio

        client = _async_clients[loop_id] = redis.asyncio.Redis.from_url(redis_url())
    if not ts:
        await client.incr(COUNTER_KEY)
        return
    pipe = client.pipeline(transaction=False)
    _latency_pipeline(pipe, started, ts)
    await pipe.execute()


def incr(ts: float = 0.0) -> None:
    """Plain sync task for peers that import the callable by dotted path (RQ)."""
    record(ts)


# --------------------------------------------------------------------------- nearly free body


class _LocalCounter:
    """Completions counted in this process, flushed to Redis by a daemon thread.

    The thread is started by the first :meth:`bump` in each process (a forked
    worker has none of its parent's threads) and the pending count is reset in
    a forked child, so nothing is counted twice.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending = 0
        self.owner = 0
        """pid that runs the flusher thread; 0 = none yet."""
        self.flusher: threading.Thread | None = None
        self.stopping = threading.Event()

    def bump(self) -> None:
        with self.lock:
            self.pending += 1
            if self.owner == os.getpid():
                return
            self.owner = os.getpid()
        # Connect here, not in the thread: a fork while the thread finished redis-py's
        # lazy imports would hand the child a half-imported module (and a held lock).
        client = redis.Redis.from_url(redis_url())
        client.ping()
        self.flusher = threading.Thread(
            target=self._flush_forever, args=(client,), name="bench-flush", daemon=True
        )
        self.flusher.start()

    def reset_in_child(self) -> None:
        self.lock = threading.Lock()
        self.pending = 0
        self.owner = 0
        self.flusher = None
        self.stopping = threading.Event()

    def flush_now(self) -> None:
        """At exit: a burst worker that ends must not take its last completions along.
        The flusher is stopped first: a daemon thread is killed at interpreter exit, and
        one killed between taking the count and sending it would lose what it took."""
        self.stopping.set()
        if self.flusher is not None and self.owner == os.getpid():
            self.flusher.join(5.0)
        n = self._take()
        if n:
            redis.Redis.from_url(redis_url()).incrby(COUNTER_KEY, n)

    def _take(self) -> int:
        with self.lock:
            n, self.pending = self.pending, 0
        return n

    def _flush_forever(self, client: redis.Redis) -> None:
        while not self.stopping.wait(FLUSH_INTERVAL_S):
            n = self._take()
            if not n:
                continue
            try:
                client.incrby(COUNTER_KEY, n)
            except redis.RedisError:  # keep the count for the next flush
                with self.lock:
                    self.pending += n


_local = _LocalCounter()
os.register_at_fork(after_in_child=_local.reset_in_child)
atexit.register(_local.flush_now)


def bump() -> None:
    """The nearly free body: count one completion in this process."""
    _local.bump()
