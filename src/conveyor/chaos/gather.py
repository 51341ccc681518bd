"""Reading, once the run has settled, what conveyor recorded and what the tasks wrote."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import redis

from ..job import Job
from ..keys import QueueKeys
from ..record import STATE, TASK
from .invariants import FINAL, Counters, JobRecord
from .tasks import LEDGER_KEY, SIGNAL, LedgerEntry, parse_entry

__all__ = ["counters", "job_records", "ledger_entries", "states", "stray_records",
           "successes"]

CHUNK = 2000
# Record fields counting attempts given back for runs that started: a stopping worker's
# hand-back of a running job (release.lua), a snooze, a suspension at a durable wait
# (finish.lua; the last one apart, as it is no lost lease).
REFUNDS = ("interruptions", "snoozes", "suspends")


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _chunks(items: list[Any]) -> Iterator[list[Any]]:
    for i in range(0, len(items), CHUNK):
        yield items[i:i + CHUNK]


def states(client: Any, keys: Callable[[str], QueueKeys], jobs: list[Job]
           ) -> list[str | None]:
    """The state of each job's record, pipelined; ``keys`` names a queue's keys."""
    out: list[str | None] = []
    for part in _chunks(jobs):
        with client.pipeline(transaction=False) as pipe:
            for job in part:
                pipe.hget(keys(job.queue).job(job.short_id), STATE)
            out += [_text(s) for s in pipe.execute()]
    return out


def successes(client: Any, keys: QueueKeys) -> Counter[str]:
    """``succeeded`` events per short id in the queue's stream."""
    seen: Counter[str] = Counter()
    start = "-"
    while True:
        batch = client.xrange(keys.events, min=start, count=CHUNK)
        for _, fields in batch:
            if fields.get(b"state") == b"succeeded":
                seen[_text(fields.get(b"id")) or ""] += 1
        if len(batch) < CHUNK:
            return seen
        start = "(" + _text(batch[-1][0])  # type: ignore[operator]


def job_records(client: Any, keys: Callable[[str], QueueKeys],
                jobs: dict[str, tuple[str, Job]]) -> list[JobRecord]:
    """:param keys: names a queue's keys
    :param jobs: label -> (kind, job) of every job whose enqueue returned"""
    wins = {queue: successes(client, keys(queue))
            for queue in {job.queue for _, job in jobs.values()}}
    items = list(jobs.items())
    out = []
    for part in _chunks(items):
        with client.pipeline(transaction=False) as pipe:
            for _, (_, job) in part:
                pipe.hmget(keys(job.queue).job(job.short_id), STATE, "attempts", "error",
                           "sig:" + SIGNAL, "w:" + SIGNAL, "lost", "lu", *REFUNDS)
            replies = pipe.execute()
        for (label, (kind, job)), (state, attempts, error, left, taken, lost, unstarted,
                                   *refunds) in zip(part, replies, strict=True):
            out.append(JobRecord(label, kind, job.id, _text(state), int(attempts or 0),
                                 _text(error), wins[job.queue][job.short_id],
                                 sum(int(n or 0) for n in refunds), int(refunds[-1] or 0),
                                 left is not None, taken is not None, int(lost or 0),
                                 int(unstarted or 0)))
    return out


def _scan(client: Any, pattern: str) -> list[str]:
    return [_text(k) or "" for k in client.scan_iter(match=pattern, count=1000)]


def stray_records(client: Any, keys: QueueKeys, known: set[str],
                  children: Counter[str] | None = None) -> tuple[list[str], int]:
    """Unfinished records of jobs the run does not know (an enqueue that raised may still
    have stored its jobs), and how many records of any job are dead; ``children`` counts
    the child jobs of durable waits per parent job id."""
    names = _scan(client, keys.job_prefix + "*")
    stray, dead = [], 0
    for part in _chunks(names):
        with client.pipeline(transaction=False) as pipe:
            for name in part:
                pipe.hmget(name, STATE, "pw")
            found = [(_text(s), _text(p)) for s, p in pipe.execute()]
        for name, (state, parent) in zip(part, found, strict=True):
            dead += state == "dead"
            short = name[len(keys.job_prefix):]
            if parent and children is not None:
                children[parent] += 1
            if short not in known and state not in FINAL:
                stray.append(f"{short} {state}")
    return stray, dead


def counters(client: Any, keys: QueueKeys, dead_records: int) -> Counters:
    ready_lists = _scan(client, keys.ready_prefix + "*")
    listed = sum(int(client.llen(name)) for name in ready_lists)
    active = {(_text(k) or ""): int(v) for k, v in client.hgetall(keys.active).items()}
    leased: Counter[str] = Counter()
    tenants: Counter[str] = Counter()
    for short in client.zrange(keys.leases, 0, -1):
        task, tenant = client.hmget(keys.job(_text(short) or ""), TASK, "tenant")
        leased[_text(task) or "?"] += 1
        if tenant:
            tenants[_text(tenant) or ""] += 1
    running = {(_text(k) or ""): int(v) for k, v in client.hgetall(keys.running).items()}
    return Counters(ready_counter=int(client.hget(keys.counts, "ready") or 0),
                    ready_listed=listed, active=active, leased=dict(leased),
                    dead_letters=int(client.zcard(keys.dead)), dead_records=dead_records,
                    running=int(client.hget(keys.counts, "running") or 0),
                    running_tenants=running, leased_tenants=dict(tenants),
                    handed=int(client.hget(keys.counts, "handed") or 0))


def ledger_entries(ledger: redis.Redis) -> list[LedgerEntry]:
    return [parse_entry(raw) for raw in ledger.lrange(LEDGER_KEY, 0, -1)]
