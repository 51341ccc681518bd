"""What supervisors publish in Redis, and how operators' tools read it back.

A supervisor keeps a hash ``{namespace}:supervisor:<id>`` (children, target, scaling
bounds, the last signals) that expires a few heartbeats after its last one, a member of
``{namespace}:supervisors`` scored by that heartbeat (ms), and a capped list of its latest
decisions (JSON, newest first) that outlives it by a day, so a scale-in or a replaced
process can still be explained after the fact.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis.exceptions

from .. import keys as keyspace
from ..clock import server_now

if TYPE_CHECKING:
    from ..app import Conveyor

__all__ = ["Publisher", "SupervisorRecord", "live_supervisors"]

HEARTBEAT_SECONDS = 15.0
TTL_BEATS = 3
DECISIONS_KEPT = 50
DECISIONS_TTL = 86_400
ERRORS = (redis.exceptions.RedisError, OSError)


class Publisher:
    """Writes one supervisor's state and decisions (failures are the caller's to log).

    :param app: the application
    :param supervisor_id: the supervisor's id
    """

    def __init__(self, app: Conveyor, supervisor_id: str) -> None:
        self.app = app
        self.id = supervisor_id
        self.key = keyspace.supervisor_key(app.namespace, supervisor_id)
        self.decisions_key = keyspace.supervisor_decisions_key(app.namespace, supervisor_id)

    def beat(self, fields: dict[str, str], now: float) -> None:
        """Write the state hash and the heartbeat (3 commands, one round trip)."""
        with self.app.redis.pipeline(transaction=False) as pipe:
            pipe.hset(self.key, mapping=fields)
            pipe.expire(self.key, int(HEARTBEAT_SECONDS * TTL_BEATS))
            pipe.zadd(keyspace.supervisors_key(self.app.namespace), {self.id: int(now * 1000)})
            pipe.execute()

    def decision(self, entry: dict[str, Any]) -> None:
        """Push a decision on the capped list."""
        with self.app.redis.pipeline(transaction=False) as pipe:
            pipe.lpush(self.decisions_key, json.dumps(entry))
            pipe.ltrim(self.decisions_key, 0, DECISIONS_KEPT - 1)
            pipe.expire(self.decisions_key, DECISIONS_TTL)
            pipe.execute()

    def remove(self) -> None:
        """Leave the set of live supervisors (the decisions stay until they expire)."""
        with self.app.redis.pipeline(transaction=False) as pipe:
            pipe.zrem(keyspace.supervisors_key(self.app.namespace), self.id)
            pipe.delete(self.key)
            pipe.execute()


@dataclass(frozen=True, slots=True)
class SupervisorRecord:
    """A live supervisor as it last described itself."""

    id: str
    fields: dict[str, str]
    heartbeat: float  # epoch s
    decisions: list[dict[str, Any]] = field(default_factory=list)


def live_supervisors(app: Conveyor, decisions: int = 5) -> list[SupervisorRecord]:
    """Supervisors that beat recently, with their latest ``decisions``; prunes the dead.

    :param app: the application whose namespace is read
    :param decisions: how many of each one's latest decisions to read
    """
    key = keyspace.supervisors_key(app.namespace)
    now = server_now(app.redis)
    with app.redis.pipeline(transaction=False) as pipe:
        cutoff_ms = int((now - HEARTBEAT_SECONDS * TTL_BEATS) * 1000)
        pipe.zremrangebyscore(key, "-inf", cutoff_ms)
        pipe.zrange(key, f"({cutoff_ms}", "+inf", byscore=True, withscores=True)
        # The prune may be refused (a read-only ACL user): the read does not need it.
        replies = pipe.execute(raise_on_error=False)
    members: list[tuple[bytes, float]] = replies[1]
    if isinstance(members, Exception):
        raise members
    if not members:
        return []
    ns = app.namespace
    with app.redis.pipeline(transaction=False) as pipe:
        for member, _ in members:
            sid = member.decode()
            pipe.hgetall(keyspace.supervisor_key(ns, sid))
            pipe.lrange(keyspace.supervisor_decisions_key(ns, sid), 0, max(0, decisions - 1))
        replies = pipe.execute()
    records = []
    for i, (member, score) in enumerate(members):
        fields, entries = replies[2 * i], replies[2 * i + 1]
        if not fields:
            continue
        records.append(SupervisorRecord(
            id=member.decode(), heartbeat=score / 1000,
            fields={k.decode(): v.decode() for k, v in fields.items()},
            decisions=[json.loads(e) for e in entries] if decisions else []))
    return records
