"""The overview of every queue in three round trips and at most :data:`BUDGET` commands
per queue, the first poll included, and a cache of closed buckets.

Per queue a poll reads the backlog (4 commands), whether the queue has limits or a pause
(1), its active and idle hashes (2) and its stats window; plus, for all queues, the
server's clock every :data:`CLOCK_SECONDS` (in a round trip of its own) and, every
:data:`INDEX_SECONDS` and at the first poll, one ``ZUNION`` that lists both the known
queues and the worker registry (a new queue shows from the next poll; the hash
of a worker is read once, when it is first listed: the overview uses only its fixed
fields).

A metric bucket stops changing once its span is over (the scripts write the bucket of
the server's clock, read inside the script), so a reader that polls keeps the buckets it
read after they closed. When the cache holds the stats window but its newest
:data:`BY_BUCKETS` buckets, those are read one by one (the steady state: the open bucket,
and once the one that closed since the last poll); otherwise (the first poll, or after a
pause) Redis sums the window in one ``ZUNION``. The sparkline needs its buckets apart:
the ones the cache lacks are read newest first with the commands the budget has left, so
a fresh reader's chart fills in over its first polls while every figure beside it is
exact from the first. A queue with limits or a pause costs the flow-control read on top
(:func:`.flow.read_flow`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import redis

from .. import clock as server_clock
from .. import keys as keyspace
from .. import sharding, untrusted
from ..keys import QueueKeys
from ..worker import registry
from ..worker.registry import WorkerInfo
from . import shards as sharded
from .activity import TaskActivity, finished, queue_activity, running, task_activity
from .advice import Advice, decide
from .flow import FlowState, read_flow
from .series import Series, build_series
from .stats import (
    BACKLOG_COMMANDS,
    Backlog,
    Stats,
    TaskWindow,
    bucket_starts,
    build,
    merge,
    parse_replies,
    parse_window,
    queue_backlog,
    queue_buckets,
    queue_window,
    take_backlog,
    window_commands,
)

if TYPE_CHECKING:
    from ..app import Conveyor

GRACE = 1.0  # seconds after its end a bucket is still read again (the scripts' clock is
# the server's: a bucket read when the server's clock is past its end is final; the
# margin covers the reader's estimate of that clock between two readings)
CLOCK_SECONDS = 10.0  # the server's clock is read again after this long
PER_QUEUE = BACKLOG_COMMANDS + 2  # commands per queue before its metrics (+ activity)
INDEX_SECONDS = 2.0  # the set of known queues and the registry's listing are read again
BUDGET = 10  # after this long, in a poll whose commands stay within this many per queue
BY_BUCKETS = 2  # a window missing at most this many buckets is read bucket by bucket
PRUNE_AT = 50_000  # closed buckets kept before those past their lifetime are dropped


@dataclass(frozen=True, slots=True)
class QueueOverview:
    """One queue now: backlog, last-window stats, sparkline series and advice."""

    name: str
    backlog: Backlog
    paused: bool
    stats: Stats
    spark: Series
    advice: Advice
    flow: FlowState | None
    spark_read: float = 1.0  # share of the sparkline's buckets read so far (a fresh
    # reader's chart fills in over its first polls: see the module docstring)
    shards: tuple[str, ...] = ()  # the shards whose figures are summed here (the queue
    # itself first); just the queue for a queue never sharded


@dataclass(frozen=True, slots=True)
class Overview:
    """Every known queue, the activity of every task type and the live workers."""

    now: float
    queues: list[QueueOverview]
    active: dict[str, dict[str, int]]  # queue -> task -> jobs running
    idle: dict[str, dict[str, float]]  # queue -> task -> last finish (epoch s)
    workers: list[WorkerInfo]  # live now; fields as first read (queues, concurrency fixed)
    tasks: list[TaskActivity] = field(default_factory=list)  # by queue, then task


class BucketCache:
    """Parsed buckets that no script writes any more, by (metrics key), and the indexes
    the overview read last (known queues, the registry's listing); thread-safe."""

    def __init__(self, width: int, ttl: int) -> None:
        self.width, self.ttl = width, ttl
        self.closed: dict[str, tuple[int, dict[str, TaskWindow]]] = {}  # key: start, parts
        self.workers: dict[str, WorkerInfo] = {}  # by id, as first read
        self.queues: set[str] | None = None  # known queues as last read
        self.listing: list[tuple[bytes, float]] = []  # registry: (worker id, beat ms)
        self.index_at: float | None = None  # when both were read (monotonic)
        self.refreshed_last = False  # the last poll spent its spare on the index
        self.server = server_clock.ServerClock()  # the server's clock, counted on locally
        self.synced: float | None = None  # when it was last read (monotonic)
        self.lock = threading.Lock()

    # -- the indexes that span queues -------------------------------------------------

    def index_cost(self, app: Conveyor) -> int:
        """Commands one read of the indexes takes: one ``ZUNION``, or two on a cluster
        (the two keys have no common hash tag)."""
        return 2 if isinstance(app.redis, redis.RedisCluster) else 1

    def queue_index(self, pipe: Any, app: Conveyor) -> None:
        """Queue the read of the known queues and of the registry's listing on ``pipe``.

        One ``ZUNION`` reads both: a queue set's members weigh 0, the workers keep their
        heartbeat (ms, never 0), so each member tells which it is. A queue named exactly
        like a live worker's id (``host:pid:random``) would show as that worker."""
        queues, workers = keyspace.queues_key(app.namespace), keyspace.workers_key(app.namespace)
        if isinstance(app.redis, redis.RedisCluster):
            pipe.smembers(queues).zrange(workers, 0, -1, withscores=True)
        else:
            pipe.zunion({queues: 0, workers: 1}, withscores=True)

    def take_index(self, app: Conveyor, replies: Iterator[Any]) -> None:
        """Keep the indexes from the replies of :meth:`queue_index`."""
        if isinstance(app.redis, redis.RedisCluster):
            names, listing = set(next(replies)), list(next(replies))
        else:
            both = list(next(replies))
            names = {m for m, score in both if not score}
            listing = [(m, score) for m, score in both if score]
        with self.lock:
            self.queues = {untrusted.text(n) or "" for n in names}
            self.listing = listing
            self.index_at = time.monotonic()

    def index_due(self) -> bool:
        return self.index_at is None or time.monotonic() - self.index_at >= INDEX_SECONDS

    def clock(self, app: Conveyor) -> tuple[float, list[str], int]:
        """The server's clock, the known queues (the set as last read, with the app's own
        queues always) and the commands sent. The clock is read (one round trip, which
        also reads the indexes the first time) every :data:`CLOCK_SECONDS`; in between
        it is the last reading plus the time elapsed here, which drifts by microseconds
        (closed buckets are kept only :data:`GRACE` seconds after their end)."""
        first = self.queues is None
        sent = 0
        if first or self.synced is None or time.monotonic() - self.synced >= CLOCK_SECONDS:
            sent = 1 + (self.index_cost(app) if first else 0)
            if isinstance(app.redis, redis.RedisCluster):  # its pipelines refuse keyless TIME
                now = server_clock.server_now(app.redis)
                if first:
                    with cast(Any, app.redis).pipeline(transaction=False) as pipe:
                        self.queue_index(pipe, app)
                        self.take_index(app, iter(pipe.execute()))
            else:
                with app.redis.pipeline(transaction=False) as pipe:
                    server_clock.ask(pipe)
                    if first:
                        self.queue_index(pipe, app)
                    replies = iter(pipe.execute())
                now = server_clock.from_reply(next(replies))
                if first:
                    self.take_index(app, replies)
            self.server.observe(now * 1000)
            self.synced = time.monotonic()
        names = (self.queues or set()) | set(app.queues())
        return self.server.now(), sorted(names), sent

    def listed(self, now: float) -> list[tuple[bytes, float]]:
        """Members of the registry's listing (as last read) that beat lately."""
        cutoff_ms = (now - registry.stale_after()) * 1000
        return [(m, score) for m, score in self.listing if score >= cutoff_ms]

    def unknown(self, now: float) -> list[tuple[bytes, float]]:
        """Listed workers whose record was not read yet, latest heartbeat first."""
        with self.lock:
            new = [(m, s) for m, s in self.listed(now)
                   if (untrusted.text(m) or "") not in self.workers]
        return sorted(new, key=lambda member: -member[1])

    def live(self, now: float, read: list[WorkerInfo]) -> list[WorkerInfo]:
        """Live workers: the listed ones whose record was read (now or before), in the
        listing's order; a worker's record is read once (its fixed fields are what the
        overview uses)."""
        listed = [untrusted.text(m) or "" for m, _ in self.listed(now)]
        with self.lock:
            known = {w: self.workers[w] for w in listed if w in self.workers}
            known.update({w.id: w for w in read if w.id in listed})
            self.workers = dict(known)
        return [known[w] for w in listed if w in known]

    # -- closed buckets ---------------------------------------------------------------

    def missing(self, keys: QueueKeys, starts: list[int]) -> list[int]:
        with self.lock:
            return [s for s in starts if keys.metrics(s) not in self.closed]

    def get(self, keys: QueueKeys, start: int) -> dict[str, TaskWindow] | None:
        with self.lock:
            kept = self.closed.get(keys.metrics(start))
        return kept[1] if kept is not None else None

    def store(self, keys: QueueKeys, start: int, parts: dict[str, TaskWindow],
              now: float) -> None:
        if start + self.width + GRACE > now:
            return  # still open, or closed too recently: read it again next time
        with self.lock:
            self.closed[keys.metrics(start)] = (start, parts)
            if len(self.closed) > PRUNE_AT:  # buckets past their lifetime go
                self.closed = {k: v for k, v in self.closed.items()
                               if v[0] >= now - self.ttl - self.width}
            if len(self.closed) > 2 * PRUNE_AT:  # bound memory whatever is asked
                self.closed.clear()

    def take(self, keys: dict[str, QueueKeys], wanted: dict[str, list[int]], replies: Any,
             now: float) -> dict[tuple[str, int], dict[str, TaskWindow]]:
        """Parse the replies to the reads of ``wanted`` (from ``replies``, in order) and
        keep the closed ones; returns them all by (queue, start)."""
        fresh: dict[tuple[str, int], dict[str, TaskWindow]] = {}
        for q, k in keys.items():
            parsed = parse_replies([next(replies) for _ in wanted[q]])
            for start, parts in zip(wanted[q], parsed, strict=True):
                fresh[(q, start)] = parts
                self.store(k, start, parts, now)
        return fresh

    def assemble(self, keys: dict[str, QueueKeys], starts: list[int],
                 fresh: dict[tuple[str, int], dict[str, TaskWindow]]
                 ) -> dict[str, list[dict[str, TaskWindow] | None]]:
        """Per queue, the bucket of each start: just read, else cached, else None."""
        return {q: [fresh[(q, s)] if (q, s) in fresh else self.get(k, s) for s in starts]
                for q, k in keys.items()}

    def read(self, client: Any, keys: dict[str, QueueKeys], starts: list[int],
             now: float) -> dict[str, list[dict[str, TaskWindow]]]:
        """Per queue, every bucket of ``starts``: cached when closed, else read (one
        pipelined round trip; none when all are cached)."""
        wanted = {q: self.missing(k, starts) for q, k in keys.items()}
        fresh = {}
        if any(wanted.values()):
            with client.pipeline(transaction=False) as pipe:
                for q, k in keys.items():
                    queue_buckets(pipe, k, wanted[q])
                fresh = self.take(keys, wanted, iter(pipe.execute()), now)
        return {q: [b or {} for b in got]
                for q, got in self.assemble(keys, starts, fresh).items()}


@dataclass
class Plan:
    """What one poll reads of the metrics, within the budget."""

    buckets: dict[str, list[int]]  # per queue, buckets read one by one
    windows: dict[str, int]  # per queue, ZUNION commands of its stats window (0: none)
    workers: list[tuple[bytes, float]]  # listed workers whose record is read
    index: bool  # read the known queues and the registry's listing again

    def commands(self) -> int:
        return sum(len(b) for b in self.buckets.values()) + sum(self.windows.values()) \
            + len(self.workers)


def plan_reads(app: Conveyor, cache: BucketCache, keys: dict[str, QueueKeys],
               starts: list[int], recent: list[int], spare: int, now: float) -> Plan:
    """Choose the reads of one poll: each queue's stats window (from the cache and at most
    :data:`BY_BUCKETS` buckets, else one ``ZUNION``), then with the ``spare`` commands
    left, the records of newly listed workers, the indexes when due and the sparkline's
    missing buckets, newest first, one queue after another. While the chart fills, a
    poll that read the indexes leaves the next one's spare to the chart."""
    plan = Plan({}, {}, [], False)
    fill: dict[str, list[int]] = {}
    for q, k in keys.items():
        lacking = cache.missing(k, recent)
        if len(lacking) <= BY_BUCKETS:
            plan.buckets[q], plan.windows[q] = lacking, 0
        else:
            plan.buckets[q], plan.windows[q] = [], window_commands(recent)
        lacking = [s for s in reversed(cache.missing(k, starts)) if s not in plan.buckets[q]]
        closed = [s for s in lacking if s + cache.width + GRACE <= now]  # kept once read
        # Newest first, but a bucket that is kept once read goes before the open ones:
        # those are read again at every poll, so a chart they went first in would never
        # fill in.
        fill[q] = closed[:1] + [s for s in lacking if s not in closed] + closed[1:]
    spare -= plan.commands()
    plan.workers = cache.unknown(now)[:max(0, spare)]
    spare -= len(plan.workers)
    cost = cache.index_cost(app)
    reserve = 1 if cache.refreshed_last and any(fill.values()) else 0
    plan.index = cache.index_due() and spare - reserve >= cost
    cache.refreshed_last = plan.index
    spare -= cost if plan.index else 0
    for depth in range(len(starts)):
        for q in keys:
            if spare <= 0:
                return plan
            if depth < len(fill[q]):
                plan.buckets[q].append(fill[q][depth])
                spare -= 1
    return plan


def read_overview(app: Conveyor, cache: BucketCache, spark_window: float = 600,
                  window: float = 60, target_wait: float = 10,
                  shards: bool = False) -> Overview:
    """Everything the dashboard's overview shows, read in three round trips within
    :data:`BUDGET` commands per queue (see the module docstring for what each costs).

    Each shard is read as a queue; a sharded queue is then shown once, its figures summed
    over its shards (:mod:`.shards`; one more read, of its layout, when it has limits),
    unless ``shards`` asks for each shard apart."""
    now, names, sent = cache.clock(app)
    keys = {q: app.keys(q) for q in names}
    width = app.limits.bucket_seconds
    starts, recent = bucket_starts(now, spark_window, width), bucket_starts(now, window, width)
    plan = plan_reads(app, cache, keys, starts, recent,
                      BUDGET * len(names) - sent - PER_QUEUE * len(names), now)
    with app.redis.pipeline(transaction=False) as pipe:
        for q, k in keys.items():
            queue_backlog(pipe, k)
            queue_activity(pipe, k)
            queue_buckets(pipe, k, plan.buckets[q])
            queue_window(pipe, k, recent if plan.windows[q] else [])
        registry.queue_records(pipe, app, plan.workers)
        if plan.index:  # a new queue or worker shows from the next poll on
            cache.queue_index(pipe, app)
        replies = iter(pipe.execute())
    fixed: dict[str, list[Any]] = {}
    fresh: dict[tuple[str, int], dict[str, TaskWindow]] = {}
    summed: dict[str, dict[str, TaskWindow]] = {}
    for q, k in keys.items():
        fixed[q] = [next(replies) for _ in range(PER_QUEUE)]
        fresh.update(cache.take({q: k}, plan.buckets, replies, now))
        if plan.windows[q]:
            summed[q] = parse_window([next(replies) for _ in range(plan.windows[q])])
    read, _ = registry.take_records(plan.workers, [next(replies) for _ in plan.workers])
    live = cache.live(now, read)
    if plan.index:
        cache.take_index(app, replies)
    buckets = cache.assemble(keys, starts, fresh)
    groups = {q: [q] for q in names} if shards else sharded.group(names)
    rows = []
    for q, members in groups.items():
        part = merge(d for m in members for d in (
            [summed[m]] if m in summed else
            [b or {} for b in buckets[m][len(starts) - len(recent):]]))
        backlog, flow = _backlog(app, q, {m: keys[m] for m in members}, fixed)
        rows.append(_queue(app, q, backlog, flow, now, (now - recent[0], part), starts,
                           sharded.merge_buckets([buckets[m] for m in members]), live,
                           window, target_wait, tuple(members)))
    active = {q: _summed(running(fixed[m][BACKLOG_COMMANDS]) for m in members)
              for q, members in groups.items()}
    idle = {q: _latest(finished(fixed[m][BACKLOG_COMMANDS + 1]) for m in members)
            for q, members in groups.items()}
    tasks = [a for q in groups for a in task_activity(app, q, active[q], idle[q], now)]
    return Overview(now, rows, active, idle, live, tasks)


def _summed(parts: Iterator[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in parts:
        for name, n in part.items():
            out[name] = out.get(name, 0) + n
    return out


def _latest(parts: Iterator[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in parts:
        for name, t in part.items():
            out[name] = max(out.get(name, t), t)
    return out


def _backlog(app: Conveyor, queue: str, keys: dict[str, QueueKeys],
             fixed: dict[str, list[Any]]) -> tuple[Backlog, FlowState | None]:
    """The backlog and flow-control state of a queue from its shards' replies."""
    backlog, flows = Backlog(), []
    for shard, k in keys.items():
        part, flow = take_backlog(app.redis, k, fixed[shard][:BACKLOG_COMMANDS])
        backlog = backlog + part
        flows.append(flow)
    if len(flows) == 1 or all(f is None for f in flows):
        return backlog, flows[0]
    found = [f if f is not None else read_flow(app.redis, k)
             for f, k in zip(flows, keys.values(), strict=True)]
    return backlog, sharded.merge_flows(queue, found, sharding.read_layout(app, queue))


def _queue(app: Conveyor, queue: str, backlog: Backlog, flow: FlowState | None, now: float,
           recent: tuple[float, TaskWindow], starts: list[int],
           buckets: list[dict[str, TaskWindow] | None], live: list[WorkerInfo],
           window: float, target_wait: float, shards: tuple[str, ...]) -> QueueOverview:
    span, part = recent  # the stats window: its span (s) and its sums
    stats = build(None, queue, window, span, now, part, backlog)
    known = [b for b in buckets if b is not None]
    run_time = stats.run.mean
    if run_time is None:  # nothing finished lately: the sparkline's window (as read) will do
        run_time = merge(known).run.mean
    advice = decide(queue, stats, run_time, registry.serving(live, queue), bool(live),
                    target_wait, None, flow=flow)
    spark = build_series(starts, [b or {} for b in buckets], app.limits.bucket_seconds, 60)
    return QueueOverview(queue, backlog, flow is not None and flow.paused, stats, spark,
                         advice, flow, len(known) / len(buckets) if buckets else 1.0, shards)
