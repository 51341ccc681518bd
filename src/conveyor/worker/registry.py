"""The worker registry: which worker processes are alive, where, and what they hold.

Each worker keeps a hash ``{namespace}:worker:<id>`` (host, pid, queues, concurrency, jobs
in hand, started at, processed) that expires a few heartbeats after its last one, and a
member of the sorted set ``{namespace}:workers`` scored by that heartbeat (ms). A worker
that dies simply stops beating: its hash expires and readers prune its zset member, so no
one has to clean up after a SIGKILL. This module writes the registry and is its only
reader (:func:`live_workers`), so what counts as alive is decided in one place.

An idle worker must cost Redis almost nothing, so a beat is one pipelined round trip of
three commands (EXPIRE, ZADD, and a ZREMRANGEBYSCORE that prunes the entries of workers
that were killed and could not remove their own), plus an HSET of the fields that changed
since the last beat.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import socket
from collections.abc import Mapping, Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .. import keys as keyspace
from ..clock import server_now
from .backoff import REDIS_ERRORS

if TYPE_CHECKING:
    import redis.asyncio

    from ..app import Conveyor
    from ..clock import ServerClock

__all__ = ["HEARTBEAT_SECONDS", "WorkerInfo", "keep_registered", "live_workers", "serving",
           "stale_after"]

log = logging.getLogger("conveyor.worker")
HEARTBEAT_SECONDS = 10.0  # idle budget: 2 commands per beat, 0.2 commands/s
PRUNE_EVERY = 6  # beats between two prunings of dead workers' entries (one more command)
TTL_BEATS = 3  # a worker missing this many beats in a row is gone
ERRORS = REDIS_ERRORS
SUPERVISOR_ENV = "CONVEYOR_SUPERVISOR"  # set in supervised children: the parent's id


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One live worker process as it described itself at its last heartbeat."""

    id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    jobs: int  # jobs in hand at the last heartbeat
    started_at: float | None  # epoch s (server clock); None if it did not say
    last_seen: float  # epoch s (server clock) of the last heartbeat
    processed: int = 0
    supervisor: str | None = None  # id of the supervisor that started it, if any

    @classmethod
    def from_hash(cls, worker_id: str, fields: Mapping[Any, Any], beat_ms: float
                  ) -> WorkerInfo:
        """Parse a registry hash leniently: a field missing or malformed gets a default."""
        get = {_text(k): _text(v) for k, v in fields.items()}.get
        started = get("started_at", "")
        return cls(
            id=worker_id, host=get("host", ""), pid=int(_number(get("pid", "0"))),
            queues=_queues(get("queues", "")),
            concurrency=max(1, int(_number(get("concurrency", "1"), 1))),
            jobs=max(0, int(_number(get("jobs", "0")))),
            started_at=_number(started) if started else None, last_seen=beat_ms / 1000,
            processed=max(0, int(_number(get("processed", "0")))),
            supervisor=get("supervisor") or None,
        )


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value or "")


def _number(raw: str, default: float = 0.0) -> float:
    try:
        return float(raw)
    except ValueError:
        return default


def _queues(raw: str) -> tuple[str, ...]:
    raw = raw.strip()
    if raw.startswith("["):  # a JSON list, as some writers of the registry put it
        try:
            return tuple(str(q) for q in json.loads(raw))
        except ValueError:
            pass
    return tuple(q.strip() for q in raw.split(",") if q.strip())


class Registrant(Protocol):
    """What the registry reads of a worker (its public state, never its parts)."""

    @property
    def app(self) -> Conveyor: ...
    @property
    def id(self) -> str: ...
    @property
    def queues(self) -> list[str]: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def held(self) -> Sized: ...
    @property
    def processed(self) -> int: ...
    @property
    def stuck(self) -> int: ...
    @property
    def clock(self) -> ServerClock: ...


def describe(worker: Registrant, started_at: float) -> dict[str, str]:
    """The registry fields of ``worker`` now (all strings, so changes compare simply)."""
    return {
        "host": socket.gethostname(),
        "pid": str(os.getpid()),
        "queues": ",".join(worker.queues),
        "concurrency": str(worker.concurrency),
        "jobs": str(len(worker.held)),
        "processed": str(worker.processed),
        # Slots held by sync runs that overran their timeout: capacity lost until they return.
        "stuck": str(worker.stuck),
        "started_at": f"{started_at:.3f}",
        "supervisor": os.environ.get(SUPERVISOR_ENV, ""),
    }


async def _beat(client: redis.asyncio.Redis, namespace: str, worker_id: str,
                changed: dict[str, str], everything: dict[str, str], now_s: float,
                ttl: int, prune: bool = True) -> None:
    key = keyspace.worker_key(namespace, worker_id)
    members = keyspace.workers_key(namespace)
    async with client.pipeline(transaction=False) as pipe:
        if changed:
            pipe.hset(key, mapping=changed)  # type: ignore[arg-type]
        pipe.expire(key, ttl)
        pipe.zadd(members, {worker_id: int(now_s * 1000)})
        if prune:  # killed workers cannot remove their own entries: the live ones prune them
            pipe.zremrangebyscore(members, "-inf", int((now_s - ttl) * 1000))
        replies = await pipe.execute()
    if not changed and not replies[0]:
        # The hash is gone (expired while Redis was unreachable, or a restart without
        # persistence): write it whole again.
        async with client.pipeline(transaction=False) as pipe:
            pipe.hset(key, mapping=everything)  # type: ignore[arg-type]
            pipe.expire(key, ttl)
            await pipe.execute()


async def keep_registered(worker: Registrant, interval: float = HEARTBEAT_SECONDS) -> None:
    """Keep ``worker`` in the registry until cancelled, then remove it.

    :param worker: the running worker (read only: queues, held jobs, processed count)
    :param interval: seconds between heartbeats
    """
    app = worker.app
    client = app.aredis()
    ttl = max(1, math.ceil(stale_after(interval)))
    started_at = worker.clock.now()
    sent: dict[str, str] = {}
    failures = beats = 0
    try:
        while True:
            fields = describe(worker, started_at)
            changed = {k: v for k, v in fields.items() if sent.get(k) != v}
            try:
                await _beat(client, app.namespace, worker.id, changed, fields,
                            worker.clock.now(), ttl, prune=beats % PRUNE_EVERY == 0)
                beats += 1
                sent = fields
            except ERRORS as exc:
                log.log(logging.WARNING if failures else logging.DEBUG,
                        "worker registry heartbeat failed (%s: %s)", type(exc).__name__, exc)
                failures += 1
                sent = {}
            else:
                if failures:
                    log.info("worker registry heartbeat: Redis answers again",
                             extra={"redis_back": True})
                failures = 0
            await asyncio.sleep(interval)
    finally:
        with contextlib.suppress(*ERRORS):
            async with client.pipeline(transaction=False) as pipe:
                pipe.zrem(keyspace.workers_key(app.namespace), worker.id)
                pipe.delete(keyspace.worker_key(app.namespace, worker.id))
                await pipe.execute()


def stale_after(interval: float = HEARTBEAT_SECONDS) -> float:
    """Seconds without a heartbeat after which a worker counts as gone (the same span its
    hash lives after its last beat)."""
    return interval * TTL_BEATS


def live_workers(app: Conveyor, interval: float = HEARTBEAT_SECONDS,
                 now: float | None = None) -> list[WorkerInfo]:
    """Workers that beat within :func:`stale_after` seconds, oldest beat first.

    The one reader of the registry (the monitor, the dashboard and the CLI all use it).
    Its only write is housekeeping: it drops the entries of workers that stopped beating,
    since a worker killed outright cannot remove its own.

    :param app: the application whose namespace is read
    :param interval: the heartbeat interval the workers use
    :param now: the server's clock (epoch s) when the caller has read it already
    """
    if now is None:
        now = server_now(app.redis)
    with app.redis.pipeline(transaction=False) as pipe:
        queue_members(pipe, app, now, interval)
        # The prune may be refused (a read-only ACL user): the read does not need it.
        members: list[tuple[bytes, float]] = pipe.execute(raise_on_error=False)[1]
    if isinstance(members, Exception):
        raise members
    return read_members(app, members)


def queue_members(pipe: Any, app: Conveyor, now: float,
                  interval: float = HEARTBEAT_SECONDS) -> None:
    """Queue on ``pipe`` the two commands whose second reply :func:`read_members` takes:
    drop the entries of workers that stopped beating, then list those still beating with
    their last beat (for callers that batch this with other reads). The list does not
    depend on the prune, which a read-only user is refused."""
    key = keyspace.workers_key(app.namespace)
    cutoff_ms = int((now - stale_after(interval)) * 1000)
    pipe.zremrangebyscore(key, "-inf", cutoff_ms)
    pipe.zrange(key, f"({cutoff_ms}", "+inf", byscore=True, withscores=True)


def queue_records(pipe: Any, app: Conveyor, members: list[tuple[bytes, float]]) -> None:
    """Queue on ``pipe`` the read of the record of each member (one command each)."""
    for member, _ in members:
        pipe.hgetall(keyspace.worker_key(app.namespace, _text(member)))


def take_records(members: list[tuple[bytes, float]], hashes: list[dict[bytes, bytes]]
                 ) -> tuple[list[WorkerInfo], list[bytes]]:
    """The records read by :func:`queue_records`, and the members whose record is gone."""
    records, gone = [], []
    for (member, score), fields in zip(members, hashes, strict=True):
        if fields:
            records.append(WorkerInfo.from_hash(_text(member), fields, score))
        else:
            gone.append(member)
    return records, gone


def read_members(app: Conveyor, members: list[tuple[bytes, float]]) -> list[WorkerInfo]:
    """The records of the registry members listed by :func:`queue_members` (one round
    trip; none when there are no members)."""
    if not members:
        return []
    with app.redis.pipeline(transaction=False) as pipe:
        queue_records(pipe, app, members)
        records, gone = take_records(members, pipe.execute())
    if gone:  # its hash expired before its zset score fell behind the cutoff
        app.redis.zrem(keyspace.workers_key(app.namespace), *gone)
    return records


def serving(workers: list[WorkerInfo], queue: str) -> list[WorkerInfo]:
    """Workers that serve ``queue`` (a worker that names no queue is not counted)."""
    return [w for w in workers if queue in w.queues]
