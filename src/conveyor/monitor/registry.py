"""Reading the worker registry: which workers are alive, what they serve, how busy they are.

Workers publish themselves in ``{namespace}:workers`` (a sorted set of worker ids scored
by their last heartbeat, ms) and ``{namespace}:worker:<id>`` (a hash with ``host, pid,
queues, concurrency, jobs, started_at`` that expires when the worker stops
heartbeating). This module only reads them; a worker missing its hash, or whose last
heartbeat is older than ``stale_after``, is not counted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis

from .. import keys as keyspace

STALE_AFTER = 60.0  # seconds without a heartbeat after which a worker is presumed dead


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One live worker process as it last described itself."""

    id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    jobs: int  # jobs in hand at the last heartbeat
    started_at: float | None
    last_seen: float  # epoch s of the last heartbeat


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


def _queues(raw: str) -> tuple[str, ...]:
    raw = raw.strip()
    if raw.startswith("["):
        try:
            return tuple(str(q) for q in json.loads(raw))
        except ValueError:
            pass
    return tuple(q.strip() for q in raw.split(",") if q.strip())


def _number(raw: str, default: float = 0.0) -> float:
    try:
        return float(raw)
    except ValueError:
        return default


def parse_worker(worker_id: str, last_seen_ms: float, record: Mapping[Any, Any]) -> WorkerInfo:
    get = {_text(k): _text(v) for k, v in record.items()}.get
    started = get("started_at", "")
    return WorkerInfo(
        id=worker_id,
        host=get("host", ""),
        pid=int(_number(get("pid", "0"))),
        queues=_queues(get("queues", "")),
        concurrency=max(1, int(_number(get("concurrency", "1"), 1))),
        jobs=max(0, int(_number(get("jobs", "0")))),
        started_at=_number(started) if started else None,
        last_seen=last_seen_ms / 1000,
    )


def live_workers(client: redis.Redis, namespace: str, now: float,
                 stale_after: float = STALE_AFTER) -> list[WorkerInfo]:
    """Workers that heartbeated within ``stale_after`` seconds of ``now`` (epoch s)."""
    members: list[tuple[bytes, float]] = client.zrangebyscore(  # type: ignore[assignment]
        keyspace.workers_key(namespace), (now - stale_after) * 1000, "+inf", withscores=True)
    if not members:
        return []
    with client.pipeline(transaction=False) as pipe:
        for member, _ in members:
            pipe.hgetall(keyspace.worker_key(namespace, _text(member)))
        records = pipe.execute()
    return [parse_worker(_text(member), score, record)
            for (member, score), record in zip(members, records, strict=True) if record]


def serving(workers: list[WorkerInfo], queue: str) -> list[WorkerInfo]:
    """Workers that serve ``queue`` (a worker that names no queue is not counted)."""
    return [w for w in workers if queue in w.queues]
