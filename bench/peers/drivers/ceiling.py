"""Ceiling: plain redis-py doing the reliable-queue pattern, no framework.

Enqueue is ``LPUSH`` (one call per job, or pipelined in batches of 100);
consume is ``BLMOVE`` to a per-worker processing list, run the task body,
then ``LREM`` the payload.  The ``best`` profile pipelines 100 ``LMOVE``s and
then the matching ``INCR``/``LREM``s, which is as fast as this pattern gets
without Lua.  It bounds what any Redis-list queue can reach on this machine.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import uuid
from collections.abc import Sequence

import redis

from .base import Driver, Profile
from .common import COUNTER_KEY, FREE_BODY, QUEUE, bump, record, redis_url

QUEUE_KEY = f"ceiling:{QUEUE}"
PIPELINE = 100
IDLE_BLOCK_S = 1.0


def _payload(ts: float) -> str:
    return json.dumps({"id": uuid.uuid4().hex, "task": "incr", "args": [ts]})


class _Stop(Exception):
    pass


def _raise_stop(*_: object) -> None:
    raise _Stop


class CeilingDriver(Driver):
    name = "ceiling"
    dist = "redis"
    modes = ("sync", "bulk")
    profiles = {
        "default": Profile(1, "1 process, one job per BLMOVE + INCR + LREM"),
        "best": Profile(2, "2 processes, LMOVE/INCR/LREM pipelined x100"),
    }
    notes = ("bulk = LPUSH pipelined x100",)
    delayed_api = "plain lists: the pattern has no delayed jobs"

    def __init__(self) -> None:
        self.r: redis.Redis | None = None

    def setup(self) -> None:
        self.r = redis.Redis.from_url(redis_url())

    def enqueue_one(self, ts: float) -> None:
        assert self.r is not None
        self.r.lpush(QUEUE_KEY, _payload(ts))

    def enqueue_batch(self, tss: Sequence[float]) -> None:
        assert self.r is not None
        pipe = self.r.pipeline(transaction=False)
        for ts in tss:
            pipe.lpush(QUEUE_KEY, _payload(ts))
        pipe.execute()

    def run_worker(self, profile: str, burst: bool) -> None:
        r = redis.Redis.from_url(redis_url())
        processing = f"ceiling:processing:{os.getpid()}"
        signal.signal(signal.SIGTERM, _raise_stop)
        try:
            while True:
                if profile == "best" and self._consume_batch(r, processing):
                    continue
                self._consume_one(r, processing)
        except _Stop:
            sys.exit(0)

    @staticmethod
    def _consume_one(r: redis.Redis, processing: str) -> None:
        raw = r.blmove(QUEUE_KEY, processing, IDLE_BLOCK_S, "RIGHT", "LEFT")
        if raw is None:
            return
        record(json.loads(raw)["args"][0])
        r.lrem(processing, 1, raw)

    @staticmethod
    def _consume_batch(r: redis.Redis, processing: str) -> bool:
        """Move up to 100 jobs at once; False when the queue was empty."""
        pipe = r.pipeline(transaction=False)
        for _ in range(PIPELINE):
            pipe.lmove(QUEUE_KEY, processing, "RIGHT", "LEFT")
        raws = [raw for raw in pipe.execute() if raw is not None]
        if not raws:
            return False
        pipe = r.pipeline(transaction=False)
        for raw in raws:
            ts = json.loads(raw)["args"][0]
            if ts:
                record(ts)  # latency probes keep their own timing
            elif FREE_BODY:
                bump()
            else:
                pipe.incr(COUNTER_KEY)
            pipe.lrem(processing, 1, raw)
        pipe.execute()
        return True


DRIVER = CeilingDriver()
