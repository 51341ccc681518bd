"""The worker registry: which worker processes are alive, where, and what they hold.

Each worker keeps a hash ``{namespace}:worker:<id>`` (host, pid, queues, concurrency, jobs
in hand, started at, processed) that expires a few heartbeats after its last one, and a
member of the sorted set ``{namespace}:workers`` scored by that heartbeat (ms). A worker
that dies simply stops beating: its hash expires and readers prune its zset member, so no
one has to clean up after a SIGKILL.

An idle worker must cost Redis almost nothing, so a beat is one pipelined round trip of
two commands (EXPIRE, ZADD), plus an HSET of the fields that changed since the last beat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis.exceptions

from .. import keys as keyspace

if TYPE_CHECKING:
    import redis.asyncio

    from ..app import Conveyor
    from . import Worker

__all__ = ["HEARTBEAT_SECONDS", "WorkerRecord", "keep_registered", "live_workers"]

log = logging.getLogger("conveyor.worker")
HEARTBEAT_SECONDS = 10.0  # idle budget: 2 commands per beat, 0.2 commands/s
TTL_BEATS = 3  # a worker missing this many beats in a row is gone
ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)
SUPERVISOR_ENV = "CONVEYOR_SUPERVISOR"  # set in supervised children: the parent's id


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """What a live worker says about itself (as of its last heartbeat)."""

    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    jobs: int
    processed: int
    started_at: float
    heartbeat: float  # server epoch seconds of the last beat
    supervisor: str | None

    @classmethod
    def from_hash(cls, worker_id: str, fields: Mapping[bytes, bytes], beat_ms: float
                  ) -> WorkerRecord:
        def text(name: str) -> str:
            return fields.get(name.encode(), b"").decode()

        def number(name: str) -> float:
            try:
                return float(text(name))
            except ValueError:
                return 0.0

        return cls(
            id=worker_id, host=text("host"), pid=int(number("pid")),
            queues=[q for q in text("queues").split(",") if q],
            concurrency=int(number("concurrency")), jobs=int(number("jobs")),
            processed=int(number("processed")), started_at=number("started_at"),
            heartbeat=beat_ms / 1000, supervisor=text("supervisor") or None,
        )


def describe(worker: Worker, started_at: float) -> dict[str, str]:
    """The registry fields of ``worker`` now (all strings, so changes compare simply)."""
    return {
        "host": socket.gethostname(),
        "pid": str(os.getpid()),
        "queues": ",".join(worker.queues),
        "concurrency": str(worker.concurrency),
        "jobs": str(len(worker.held)),
        "processed": str(worker.processed),
        "started_at": f"{started_at:.3f}",
        "supervisor": os.environ.get(SUPERVISOR_ENV, ""),
    }


async def _beat(client: redis.asyncio.Redis, namespace: str, worker_id: str,
                changed: dict[str, str], everything: dict[str, str], now_s: float,
                ttl: int) -> None:
    key = keyspace.worker_key(namespace, worker_id)
    async with client.pipeline(transaction=False) as pipe:
        if changed:
            pipe.hset(key, mapping=changed)  # type: ignore[arg-type]
        pipe.expire(key, ttl)
        pipe.zadd(keyspace.workers_key(namespace), {worker_id: int(now_s * 1000)})
        replies = await pipe.execute()
    if not changed and not replies[0]:
        # The hash is gone (expired while Redis was unreachable, or a restart without
        # persistence): write it whole again.
        async with client.pipeline(transaction=False) as pipe:
            pipe.hset(key, mapping=everything)  # type: ignore[arg-type]
            pipe.expire(key, ttl)
            await pipe.execute()


async def keep_registered(worker: Worker, interval: float = HEARTBEAT_SECONDS) -> None:
    """Keep ``worker`` in the registry until cancelled, then remove it.

    :param worker: the running worker (read only: queues, held jobs, processed count)
    :param interval: seconds between heartbeats
    """
    app = worker.app
    client = app.aredis()
    ttl = max(1, int(interval * TTL_BEATS + 0.999))
    started_at = worker.clock.now()
    sent: dict[str, str] = {}
    try:
        while True:
            fields = describe(worker, started_at)
            changed = {k: v for k, v in fields.items() if sent.get(k) != v}
            try:
                await _beat(client, app.namespace, worker.id, changed, fields,
                            worker.clock.now(), ttl)
                sent = fields
            except ERRORS as exc:
                log.debug("worker registry heartbeat failed (%s)", exc)
                sent = {}
            await asyncio.sleep(interval)
    finally:
        with contextlib.suppress(*ERRORS):
            async with client.pipeline(transaction=False) as pipe:
                pipe.zrem(keyspace.workers_key(app.namespace), worker.id)
                pipe.delete(keyspace.worker_key(app.namespace, worker.id))
                await pipe.execute()


def server_time(app: Conveyor) -> float:
    """The Redis server's clock, epoch seconds."""
    sec, usec = app.redis.time()
    return float(sec) + usec / 1e6 if sec else time.time()


def live_workers(app: Conveyor, interval: float = HEARTBEAT_SECONDS) -> list[WorkerRecord]:
    """Workers that beat within the last few heartbeats, oldest first; prunes the dead.

    :param app: the application whose namespace is read
    :param interval: the heartbeat interval the workers use
    """
    key = keyspace.workers_key(app.namespace)
    cutoff_ms = int((server_time(app) - interval * TTL_BEATS) * 1000)
    with app.redis.pipeline(transaction=False) as pipe:
        pipe.zremrangebyscore(key, "-inf", cutoff_ms)
        pipe.zrange(key, 0, -1, withscores=True)
        members: list[tuple[bytes, float]] = pipe.execute()[1]
    if not members:
        return []
    with app.redis.pipeline(transaction=False) as pipe:
        for member, _ in members:
            pipe.hgetall(keyspace.worker_key(app.namespace, member.decode()))
        hashes: list[dict[bytes, bytes]] = pipe.execute()
    records, gone = [], []
    for (member, score), fields in zip(members, hashes, strict=True):
        if fields:
            records.append(WorkerRecord.from_hash(member.decode(), fields, score))
        else:
            gone.append(member)
    if gone:  # its hash expired before its zset score fell behind the cutoff
        app.redis.zrem(key, *gone)
    return records


def capacity(records: list[WorkerRecord], queue: str | None = None) -> tuple[int, int]:
    """(processes, job slots) of ``records`` serving ``queue`` (any queue when None)."""
    serving = [r for r in records if queue is None or queue in r.queues]
    return len(serving), sum(r.concurrency for r in serving)


def as_dict(record: WorkerRecord) -> dict[str, Any]:
    """A JSON-ready view of ``record``."""
    return {f: getattr(record, f) for f in record.__dataclass_fields__}
