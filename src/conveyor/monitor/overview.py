"""The overview of every queue in three round trips, and a cache of closed buckets.

A metric bucket stops changing once its span is over (the scripts write the bucket of
the server's clock, read inside the script), so a reader that polls keeps the buckets it
read after they closed and reads again only the open one (and, once, the one that closed
since the last poll). One overview then costs, per queue: the backlog (4 commands),
whether it has limits or a pause (1), its active and idle hashes (2) and one or two
buckets; plus the clock. The set of known queues and the worker registry's listing are
read again every few seconds, in a poll that stays within :data:`BUDGET` commands per
queue (a new queue shows from the next poll; the hash of a worker is read once, when it
is first listed: the overview uses only its fixed fields). A queue with limits or a
pause costs the flow-control read on top (:func:`.flow.read_flow`), and the first read
after start reads every bucket of the window once.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from .. import clock as server_clock
from .. import keys as keyspace
from .. import untrusted
from ..keys import QueueKeys
from ..worker import registry
from ..worker.registry import WorkerInfo
from .advice import Advice, decide
from .flow import FlowState, read_flow
from .series import Series, build_series
from .stats import (
    Backlog,
    Stats,
    TaskWindow,
    bucket_starts,
    build,
    merge,
    parse_replies,
    queue_buckets,
)

if TYPE_CHECKING:
    from ..app import Conveyor

GRACE = 0.0  # seconds after its end a bucket is still read again (the scripts' clock is
# the server's: a bucket read when the server's clock is past its end is final)
PER_QUEUE = 7  # commands per queue before its buckets
QUEUES_SECONDS = 5.0  # the set of known queues is read again after this long ...
LISTING_SECONDS = 2.0  # ... and the registry's listing after this long, in a poll whose
BUDGET = 10  # commands stay within this many per queue (else at the next poll)
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


@dataclass(frozen=True, slots=True)
class Overview:
    """Every known queue, the activity of every task type and the live workers."""

    now: float
    queues: list[QueueOverview]
    active: dict[str, dict[str, int]]  # queue -> task -> jobs running
    idle: dict[str, dict[str, float]]  # queue -> task -> last finish (epoch s)
    workers: list[WorkerInfo]  # live now; fields as first read (queues, concurrency fixed)


class BucketCache:
    """Parsed buckets that no script writes any more, by (metrics key); thread-safe."""

    def __init__(self, width: int, ttl: int) -> None:
        self.width, self.ttl = width, ttl
        self.closed: dict[str, tuple[int, dict[str, TaskWindow]]] = {}  # key: start, parts
        self.workers: dict[str, WorkerInfo] = {}  # by id, as first read
        self.queues: tuple[float, set[str]] | None = None  # (read at, monotonic), names
        self.listing: tuple[float, list[tuple[bytes, float]]] | None = None  # registry
        self.lock = threading.Lock()

    def clock(self, app: Conveyor) -> tuple[float, list[str]]:
        """The server's clock and the known queues: the set as last read (read now only
        the first time), with the app's own queues always. One round trip (two the first
        time on a cluster)."""
        if isinstance(app.redis, redis.RedisCluster):  # its pipelines refuse keyless TIME
            replies: list[Any] = [server_clock.server_now(app.redis)]
            if self.queues is None:
                replies.append(app.redis.smembers(keyspace.queues_key(app.namespace)))
        else:
            with app.redis.pipeline(transaction=False) as pipe:
                server_clock.ask(pipe)
                if self.queues is None:
                    pipe.smembers(keyspace.queues_key(app.namespace))
                replies = pipe.execute()
            replies[0] = server_clock.from_reply(replies[0])
        if self.queues is None:
            self.set_queues(replies[1])
        names = self.queues[1] if self.queues is not None else set()
        return replies[0], sorted(names | set(app.queues()))

    def set_queues(self, raw: Any) -> None:
        self.queues = (time.monotonic(), {untrusted.text(n) or "" for n in raw})

    def lateness(self, kept: tuple[float, Any] | None, seconds: float) -> float:
        """How many periods past due a read is (> 1: due; infinite: never read)."""
        return float("inf") if kept is None else (time.monotonic() - kept[0]) / seconds

    def refreshes(self, spare: int) -> tuple[bool, bool]:
        """Whether to read the registry's listing and the queue set in this poll: when
        due and ``spare`` commands allow, the later one first (the listing always when it
        was never read)."""
        late_listing = self.lateness(self.listing, LISTING_SECONDS)
        late_queues = self.lateness(self.queues, QUEUES_SECONDS)
        listing = math.isinf(late_listing)
        spare -= int(listing)
        order = sorted([(late_listing, "listing"), (late_queues, "queues")], reverse=True)
        chosen = {"listing"} if listing else set()
        for late, name in order:
            if late > 1 and spare >= 1 and name not in chosen:
                chosen.add(name)
                spare -= 1
        return "listing" in chosen, "queues" in chosen

    def live(self, app: Conveyor, members: list[tuple[bytes, float]]) -> list[WorkerInfo]:
        """Live workers from the registry's listing: known ones from memory, new ones read
        (one round trip when there are new ones; the listing's housekeeping is left to
        :func:`~conveyor.worker.registry.live_workers`)."""
        listed = {untrusted.text(m) or "": score for m, score in members}
        with self.lock:
            known = {w: self.workers[w] for w in listed if w in self.workers}
        new = [(m, score) for m, score in members if (untrusted.text(m) or "") not in known]
        for info in registry.read_members(app, new):
            known[info.id] = info
        with self.lock:
            self.workers = dict(known)
        return [known[w] for w in listed if w in known]

    def missing(self, keys: QueueKeys, starts: list[int]) -> list[int]:
        with self.lock:
            return [s for s in starts if keys.metrics(s) not in self.closed]

    def get(self, keys: QueueKeys, start: int) -> dict[str, TaskWindow]:
        with self.lock:
            kept = self.closed.get(keys.metrics(start))
        return kept[1] if kept is not None else {}

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
                 ) -> dict[str, list[dict[str, TaskWindow]]]:
        """Per queue, the bucket of each start: just read, else cached."""
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
        return self.assemble(keys, starts, fresh)


def read_overview(app: Conveyor, cache: BucketCache, spark_window: float = 600,
                  window: float = 60, target_wait: float = 10) -> Overview:
    """Everything the dashboard's overview shows, read in three round trips (see the
    module docstring for what each costs)."""
    now, names = cache.clock(app)
    keys = {q: app.keys(q) for q in names}
    starts = bucket_starts(now, spark_window, app.limits.bucket_seconds)
    wanted = {q: cache.missing(k, starts) for q, k in keys.items()}
    spare = (BUDGET - PER_QUEUE) * len(names) - 1 - sum(len(w) for w in wanted.values())
    listing, queues = cache.refreshes(spare)
    with app.redis.pipeline(transaction=False) as pipe:
        for q, k in keys.items():
            pipe.hget(k.counts, "ready").zcard(k.delayed).zcard(k.leases).zcard(k.dead)
            pipe.exists(k.limits, k.paused).hgetall(k.active).hgetall(k.idle)
            queue_buckets(pipe, k, wanted[q])
        if listing:
            pipe.zrange(keyspace.workers_key(app.namespace), 0, -1, withscores=True)
        if queues:  # seen from the next poll on
            pipe.smembers(keyspace.queues_key(app.namespace))
        replies = iter(pipe.execute())
    fixed: dict[str, list[Any]] = {}
    fresh: dict[tuple[str, int], dict[str, TaskWindow]] = {}
    for q, k in keys.items():
        fixed[q] = [next(replies) for _ in range(PER_QUEUE)]
        fresh.update(cache.take({q: k}, wanted, replies, now))
    if listing:
        cache.listing = (time.monotonic(), list(next(replies)))
    if queues:
        cache.set_queues(next(replies))
    cutoff_ms = (now - registry.stale_after()) * 1000
    members = [(m, score) for m, score in (cache.listing or (0.0, []))[1] if score >= cutoff_ms]
    live = cache.live(app, members)
    buckets = cache.assemble(keys, starts, fresh)
    rows = [_queue(app, q, keys[q], now, fixed[q], starts, buckets[q], live, window,
                   target_wait) for q in names]
    return Overview(now, rows,
                    {q: _counts(fixed[q][5]) for q in names},
                    {q: _times(fixed[q][6]) for q in names}, live)


def _counts(raw: dict[Any, Any]) -> dict[str, int]:
    return {untrusted.text(n) or "": max(0, untrusted.integer(v)) for n, v in raw.items()}


def _times(raw: dict[Any, Any]) -> dict[str, float]:
    return {untrusted.text(n) or "": t for n, v in raw.items()
            if (t := untrusted.number(v)) is not None}


def _queue(app: Conveyor, queue: str, keys: QueueKeys, now: float, fixed: list[Any],
           starts: list[int], buckets: list[dict[str, TaskWindow]], live: list[WorkerInfo],
           window: float, target_wait: float) -> QueueOverview:
    ready, scheduled, active, dead, limited = fixed[:5]
    flow = read_flow(app.redis, keys) if int(limited) else None
    backlog = Backlog(max(0, untrusted.integer(ready)), int(scheduled), int(active),
                      int(dead), flow.held if flow is not None else 0)
    width = app.limits.bucket_seconds
    recent = bucket_starts(now, window, width)
    first = len(starts) - len(recent)
    stats = build(None, queue, window, now - recent[0], now, merge(buckets[first:]), backlog)
    run_time = stats.run.mean
    if run_time is None:  # nothing finished lately: the sparkline's window will do
        run_time = merge(buckets).run.mean
    advice = decide(queue, stats, run_time, registry.serving(live, queue), bool(live),
                    target_wait, None, flow=flow)
    return QueueOverview(queue, backlog, flow is not None and flow.paused, stats,
                         build_series(starts, buckets, width, points=60), advice, flow)
