"""The task body and the names every driver shares.

Deliberately light (stdlib + redis-py, ``redis.asyncio`` only on first use):
RQ's default worker imports the task module afresh in every forked work
horse, so anything imported here is paid per job there.

The task body is tiny -- one ``INCR`` on :data:`COUNTER_KEY` -- so the
benchmark measures queue overhead, and the harness counts completions from
Redis itself instead of trusting a peer's own bookkeeping.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis

COUNTER_KEY = "bench:done"
"""Every executed task increments this key once."""
LATENCY_KEY = "bench:latency"
"""Latency probes push ``started - enqueued`` (seconds) here."""
QUEUE = "bench"
"""Queue name used by every peer that has named queues."""


def redis_url() -> str:
    """The private benchmark server, passed by the harness."""
    return os.environ["BENCH_REDIS_URL"]


# --------------------------------------------------------------------------- task body

_sync_client: redis.Redis | None = None
_async_clients: dict[int, Any] = {}


def _latency_pipeline(pipe: Any, started: float, ts: float) -> None:
    # RPUSH before INCR: once the counter says "done", the sample is there.
    pipe.rpush(LATENCY_KEY, started - ts)
    pipe.incr(COUNTER_KEY)


def record(ts: float = 0.0) -> None:
    """Synchronous task body: INCR the counter; log latency if ``ts`` is set."""
    global _sync_client
    started = time.time()
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
