"""Bounded lists for operators: ready jobs per priority and tenant, a page of the
scheduled, active or dead jobs, and the periodic jobs with their last and next fire.

Every list is capped (tenants per level, a page of jobs) so it costs the same with ten
tenants or a hundred thousand. Key names come from :mod:`conveyor.keys` only.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import untrusted
from ..clock import server_now
from ..job import JobInfo
from . import shown

if TYPE_CHECKING:
    from ..app import Conveyor

JOB_LISTS = {"scheduled": "delayed", "active": "leases", "suspended": "suspended", "dead": "dead"}


@dataclass(frozen=True, slots=True)
class PriorityLevel:
    """Ready jobs of one priority level: the first tenants in turn order (at most the
    cap asked for) with their ready jobs, largest first; ``tenant_count`` all tenants."""

    priority: int
    tenants: list[tuple[str, int]]
    tenant_count: int

    @property
    def ready(self) -> int:
        return sum(n for _, n in self.tenants)

    @property
    def hidden(self) -> int:
        return max(0, self.tenant_count - len(self.tenants))


@dataclass(frozen=True, slots=True)
class Tenants:
    """Ready jobs of a queue per priority level (highest first) and the largest tenants
    among those shown."""

    levels: list[PriorityLevel]
    top: list[tuple[str, int]]
    #: jobs without a tenant a plain enqueue queued that no fetch has put on their
    #: priority's list yet (``QueueKeys.inbox``); counted ready, not yet in ``levels``
    incoming: int = 0


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of a job list; ``due`` of each job: its run time (scheduled), lease
    deadline (active) or time of death (dead), epoch s."""

    queue: str
    state: str
    total: int
    offset: int
    limit: int
    jobs: list[tuple[JobInfo, float]]


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """A periodic job: its cron, next fire and last fired tick (epoch s; ``last`` is None
    until a tick stores its job, also after a scheduler's first start, which records the
    current tick without firing)."""

    task: str
    queue: str
    cron: str
    next: float | None
    last: float | None


def _text(value: Any) -> str:
    return untrusted.text(value) or ""


def read_tenants(app: Conveyor, queue: str, most: int = 25, top: int = 10) -> Tenants:
    """Two round trips: the levels with their rings, then each shown tenant's length."""
    k = app.keys(queue)
    with app.redis.pipeline(transaction=False) as pipe:
        pipe.zrange(k.priorities, 0, -1, desc=True).llen(k.inbox)
        found, incoming = pipe.execute()
    levels = [_text(p) for p in found]
    with app.redis.pipeline(transaction=False) as pipe:
        for level in levels:
            pipe.llen(k.ring(level)).lrange(k.ring(level), 0, most - 1)
        rings = pipe.execute()
    shown = [(level, list(dict.fromkeys(_text(t) for t in rings[2 * i + 1])),
              int(rings[2 * i])) for i, level in enumerate(levels)]
    with app.redis.pipeline(transaction=False) as pipe:
        for level, names, _ in shown:
            for name in names:
                pipe.llen(k.ready(f"{level}:{name}"))
        lengths = iter(pipe.execute())
    out, largest = [], Counter[str]()
    for level, names, ring_len in shown:
        counted = sorted(((name or "(none)", int(next(lengths))) for name in names),
                         key=lambda pair: -pair[1])
        largest.update(dict(counted))
        out.append(PriorityLevel(untrusted.integer(level), counted, ring_len))
    return Tenants(out, largest.most_common(top), int(incoming))


def read_jobs(app: Conveyor, queue: str, state: str, offset: int = 0,
              limit: int = 50) -> JobPage:
    """Scheduled (soonest first), active or dead (newest first) jobs; two round trips.
    Suspended jobs are in no order (their set has none), each with when it suspended.

    :raises KeyError: ``state`` is not scheduled, active, suspended or dead
    """
    k = app.keys(queue)
    key = getattr(k, JOB_LISTS[state])
    if state == "suspended":
        return _suspended(app, queue, offset, limit)
    with app.redis.pipeline(transaction=False) as pipe:
        pipe.zcard(key).zrange(key, offset, offset + limit - 1, desc=state == "dead",
                               withscores=True)
        total, members = pipe.execute()
    ids = [(_text(m), float(score)) for m, score in members]
    with app.redis.pipeline(transaction=False) as pipe:
        for short, _ in ids:
            pipe.hgetall(k.job(short))
        records = pipe.execute()
    jobs = [(shown.info(app, queue, short, record), score / 1000)
            for (short, score), record in zip(ids, records, strict=True)
            if record]  # a record may expire or go between the two reads
    return JobPage(queue, state, int(total), offset, limit, jobs)


def read_shards_jobs(app: Conveyor, queue: str, shards: list[str], state: str,
                     offset: int = 0, limit: int = 50) -> JobPage:
    """A page of the jobs of a queue spread over ``shards``, in the order of
    :func:`read_jobs` across them all: the first ``offset + limit`` of each shard are read
    (with their times), merged, and the page's records read; a suspended page walks the
    shards one after another.

    :raises KeyError: ``state`` is not scheduled, active, suspended or dead
    """
    name = JOB_LISTS[state]
    if len(shards) == 1:
        return read_jobs(app, shards[0], state, offset, limit)
    if state == "suspended":
        return _suspended_across(app, queue, shards, offset, limit)
    with app.redis.pipeline(transaction=False) as pipe:
        for shard in shards:
            key = getattr(app.keys(shard), name)
            pipe.zcard(key).zrange(key, 0, offset + limit - 1, desc=state == "dead",
                                   withscores=True)
        replies = pipe.execute()
    total = sum(int(n) for n in replies[0::2])
    found = [(shard, _text(m), float(score))
             for shard, members in zip(shards, replies[1::2], strict=True)
             for m, score in members]
    found.sort(key=lambda row: -row[2] if state == "dead" else row[2])
    page = found[offset: offset + limit]
    with app.redis.pipeline(transaction=False) as pipe:
        for shard, short, _ in page:
            pipe.hgetall(app.keys(shard).job(short))
        records = pipe.execute()
    jobs = [(shown.info(app, shard, short, record), score / 1000)
            for (shard, short, score), record in zip(page, records, strict=True) if record]
    return JobPage(queue, state, total, offset, limit, jobs)


def _suspended_across(app: Conveyor, queue: str, shards: list[str], offset: int,
                      limit: int) -> JobPage:
    with app.redis.pipeline(transaction=False) as pipe:
        for shard in shards:
            pipe.scard(app.keys(shard).suspended)
        sizes = [int(n) for n in pipe.execute()]
    jobs: list[tuple[JobInfo, float]] = []
    skip = offset
    for shard, size in zip(shards, sizes, strict=True):
        if skip >= size:
            skip -= size
            continue
        if len(jobs) < limit:
            jobs += _suspended(app, shard, skip, limit - len(jobs)).jobs
        skip = 0
    return JobPage(queue, "suspended", sum(sizes), offset, limit, jobs)


def _suspended(app: Conveyor, queue: str, offset: int, limit: int) -> JobPage:
    """A page of the suspended set: the first ``offset + limit`` members a scan meets
    (O(offset + limit)), each with when it was enqueued (a suspended record keeps no
    start time: it may wait for days, in few bytes)."""
    k = app.keys(queue)
    total = int(app.redis.scard(k.suspended))
    shorts = [_text(m) for m in itertools.islice(
        app.redis.sscan_iter(k.suspended, count=max(100, limit)), offset, offset + limit)]
    with app.redis.pipeline(transaction=False) as pipe:
        for short in shorts:
            pipe.hgetall(k.job(short))
        records = pipe.execute()
    jobs = []
    for short, record in zip(shorts, records, strict=True):
        if record:  # a record may go between the two reads
            info = shown.info(app, queue, short, record)
            jobs.append((info, info.enqueued_at or 0.0))
    return JobPage(queue, "suspended", total, offset, limit, jobs)


def read_schedules(app: Conveyor, now: float) -> list[ScheduleRow]:
    """Periodic jobs with their next fire after ``now`` and last fired tick.

    The last fired tick is kept apart from the scheduler's cursor (the latest tick claimed,
    which a first start sets without firing). Versions before the split kept only the
    cursor, for ticks fired and not alike: a periodic they ran shows no last fire until
    its next tick fires, rather than one that may never have happened."""
    from croniter import croniter

    periodics = list(app.periodics)
    with app.redis.pipeline(transaction=False) as pipe:
        for periodic in periodics:
            pipe.get(app.keys(periodic.task.queue).fired(periodic.name))
        lasts = pipe.execute()
    start = dt.datetime.fromtimestamp(now, dt.UTC)
    rows = []
    for periodic, last in zip(periodics, lasts, strict=True):
        next_after = getattr(periodic, "next_after", None)  # knows six-field (seconds) crons
        try:
            next_fire: float | None = (float(next_after(now)) if next_after is not None else
                                       float(croniter(periodic.cron, start).get_next(float)))
        except (ValueError, KeyError):
            next_fire = None
        value = untrusted.number(last) if last is not None else None
        last_fire = None if value is None else value / 1000 if value > 1e11 else value
        rows.append(ScheduleRow(periodic.task.name, periodic.task.queue, periodic.cron,
                                next_fire, last_fire))
    return rows


@dataclass(frozen=True, slots=True)
class JobDetail:
    """A job's record with its decoded arguments and the workflow it belongs to."""

    info: JobInfo
    args: list[Any] | str  # a str says why the arguments could not be decoded
    kwargs: dict[str, Any]
    workflow: str | None  # the workflow's id, when the job is one of its nodes
    running_for: float | None = None  # seconds since its run started, while a worker holds it


def read_job_detail(app: Conveyor, job_id: str) -> JobDetail:
    """One read of a job's record, arguments included.

    :raises JobNotFound: no such job (or its record expired)
    :raises ValueError: not a job id
    """
    job = app.job(job_id)
    record = app._sender.record(job.queue, job.short_id)  # conveyor.testing.inline's
    if record is None:
        record = app.redis.hgetall(app.keys(job.queue).job(job.short_id))
    if not record:
        job._info(record)  # raises JobNotFound
    info, args, kwargs = shown.of_record(app, job.queue, job.short_id, record)
    workflow = untrusted.text(record.get(b"wf")) or None
    running_for = None
    if info.worker is not None and info.started_at is not None:  # held: read the clock too
        running_for = max(0.0, server_now(app.redis) - info.started_at)
    return JobDetail(info, args, kwargs, workflow, running_for)
