"""Windowed statistics read from the metric buckets the Lua scripts write.

A bucket ``mz:<start s>`` of a queue is a sorted set whose scores are the values: per
task type, counters (``<task>|succeeded``), sums of durations (``<task>|wsum``) and log
histograms of wait and run time (``<task>|w|<bin>``). Redis sums a window of buckets in
one ``ZUNION``, so a window costs one command per queue however long it is; a chart, which
needs the buckets apart, reads them one by one. A window of W seconds is
the buckets whose start lies within W of now, plus the one cut by the window's start, so
it covers between W and W + bucket width; rates divide by the span actually covered.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from .. import untrusted
from ..keys import QueueKeys
from .flow import FlowState, read_flow
from .histogram import Histogram

COUNTERS = ("enqueued", "started", "succeeded", "failed", "retried", "dead", "expired")
WINDOW_KEYS = 1000  # buckets summed by one ZUNION (a day of 10 s buckets takes nine)


@dataclass(frozen=True, slots=True)
class Timing:
    """Summary of a duration over a window, in seconds; ``None`` when nothing was observed."""

    count: int = 0
    mean: float | None = None
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None

    @classmethod
    def of(cls, histogram: Histogram) -> Timing:
        return cls(histogram.count, histogram.mean, histogram.quantile(0.50),
                   histogram.quantile(0.95), histogram.quantile(0.99))


@dataclass(frozen=True, slots=True)
class Backlog:
    """Jobs of a queue by where they are now; ``held`` counts the ready jobs that a limit
    (flow control, or a pause) keeps from starting now; ``suspended`` the jobs at a
    durable wait (``ctx.sleep``, ``wait_for``, ``child``), which hold no slot."""

    ready: int = 0
    scheduled: int = 0
    active: int = 0
    dead: int = 0
    held: int = 0
    suspended: int = 0

    @property
    def pending(self) -> int:
        """Jobs still to run or running: ready + scheduled + active + suspended (dead
        excluded)."""
        return self.ready + self.scheduled + self.active + self.suspended

    def __add__(self, other: Backlog) -> Backlog:
        return Backlog(self.ready + other.ready, self.scheduled + other.scheduled,
                       self.active + other.active, self.dead + other.dead,
                       self.held + other.held, self.suspended + other.suspended)


@dataclass(frozen=True, slots=True)
class Stats:
    """What happened over the last ``window`` seconds, and the backlog now.

    Counters count events in the window: ``started`` runs begun, ``failed`` runs that
    raised or were lost (each is then ``retried`` or goes ``dead``). ``throughput`` is jobs
    finished for good (succeeded or dead) per second; ``arrival_rate`` is jobs enqueued
    per second. ``wait`` and ``run`` summarise runs finished in the window.
    """

    task: str | None
    queue: str | None
    window: float
    span: float  # seconds the buckets read actually cover (window <= span < window + bucket)
    enqueued: int
    started: int
    succeeded: int
    failed: int
    retried: int
    dead: int
    throughput: float
    arrival_rate: float
    wait: Timing
    run: Timing
    backlog: Backlog
    now: float  # server time the stats were read at (epoch s)
    expired: int = 0  # jobs that expired: not started by ``expires``, or past ``deadline``


@dataclass
class TaskWindow:
    """Counters and histograms of one task type summed over buckets (mutable, internal)."""

    counters: dict[str, int] = field(default_factory=dict)
    wait: Histogram = field(default_factory=Histogram)
    run: Histogram = field(default_factory=Histogram)

    def merge(self, other: TaskWindow) -> None:
        for name, n in other.counters.items():
            self.counters[name] = self.counters.get(name, 0) + n
        self.wait.merge(other.wait)
        self.run.merge(other.run)


def bucket_starts(now: float, window: float, bucket_seconds: int) -> list[int]:
    """Start times of the buckets a window ending at ``now`` touches, oldest first."""
    last = math.floor(now / bucket_seconds) * bucket_seconds
    first = math.floor((now - window) / bucket_seconds) * bucket_seconds
    return list(range(first, last + 1, bucket_seconds))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


Reply = Mapping[Any, Any] | Iterable[tuple[Any, Any]]  # a bucket or window as read


def fields_of(reply: Reply | None) -> Iterator[tuple[str, float]]:
    """(member, value) pairs of a bucket or a window as redis-py returns them: the
    ``(member, score)`` pairs of ``ZRANGE``/``ZUNION ... WITHSCORES`` (or a mapping)."""
    if not reply:
        return
    pairs = reply.items() if isinstance(reply, Mapping) else reply
    for raw_name, raw_value in pairs:
        yield _text(raw_name), float(_text(raw_value))


def parse_bucket(fields: Reply, into: dict[str, TaskWindow]) -> None:
    """Add one bucket (or the sum of several) into per-task windows.

    :raises ValueError: a value is not a number
    """
    for name, value in fields_of(fields):
        head, _, last = name.rpartition("|")
        if not head or not math.isfinite(value):
            continue
        if last.isdigit():
            task, _, kind = head.rpartition("|")
            if kind in ("w", "r") and task:
                target = into.setdefault(task, TaskWindow())
                (target.wait if kind == "w" else target.run).add_bin(int(last), int(value))
            continue
        target = into.setdefault(head, TaskWindow())
        if last == "wsum":
            target.wait.total += value
        elif last == "rsum":
            target.run.total += value
        else:
            target.counters[last] = target.counters.get(last, 0) + int(value)


def queue_buckets(pipe: Any, keys: QueueKeys, starts: Iterable[int]) -> None:
    """Queue the read of each bucket of one queue on ``pipe``, one command per bucket
    (keys from ``keys.py``)."""
    for start in starts:
        pipe.zrange(keys.metrics(start), 0, -1, withscores=True)


def window_commands(starts: Sequence[int]) -> int:
    """Commands :func:`queue_window` sends for a window of ``starts``."""
    return math.ceil(len(starts) / WINDOW_KEYS)


def queue_window(pipe: Any, keys: QueueKeys, starts: Sequence[int]) -> int:
    """Queue the sum of the buckets of ``starts`` of one queue on ``pipe``: one ``ZUNION``
    per :data:`WINDOW_KEYS` buckets, however many buckets the window holds. Returns the
    number of replies to hand to :func:`parse_window`."""
    names = [keys.metrics(s) for s in starts]
    for i in range(0, len(names), WINDOW_KEYS):
        pipe.zunion(names[i: i + WINDOW_KEYS], withscores=True)
    return window_commands(starts)


def parse_window(replies: Iterable[Reply | None]) -> dict[str, TaskWindow]:
    """Per-task windows from the replies of :func:`queue_window` (a damaged window reads
    as empty, never as a crash)."""
    out: dict[str, TaskWindow] = {}
    try:
        for reply in replies:
            parse_bucket(reply or [], out)
    except ValueError:
        return {}
    return out


def parse_replies(replies: Iterable[Reply | None]) -> list[dict[str, TaskWindow]]:
    """Per-task windows of each bucket, in the order read (an empty dict for none)."""
    out: list[dict[str, TaskWindow]] = []
    for reply in replies:
        parts: dict[str, TaskWindow] = {}
        if reply:
            try:
                parse_bucket(reply, parts)
            except ValueError:  # a damaged bucket reads as empty, never as a crash
                parts = {}
        out.append(parts)
    return out


def read_windows(client: redis.Redis, keys: Mapping[str, QueueKeys], starts: Sequence[int]
                 ) -> dict[str, dict[str, TaskWindow]]:
    """The one reader of windows of metric buckets: per queue, per-task sums over the
    buckets of ``starts``, summed by Redis (``ZUNION``): one pipelined round trip and one
    command per queue (per :data:`WINDOW_KEYS` buckets) whatever the window's length."""
    with client.pipeline(transaction=False) as pipe:
        sent = {q: queue_window(pipe, k, starts) for q, k in keys.items()}
        replies = iter(pipe.execute())
    return {q: parse_window([next(replies) for _ in range(n)]) for q, n in sent.items()}


def merge(buckets: Iterable[dict[str, TaskWindow]], task: str | None = None) -> TaskWindow:
    """One window over ``buckets``, for ``task`` or for every task."""
    total = TaskWindow()
    for bucket in buckets:
        for name, part in bucket.items():
            if task is None or name == task:
                total.merge(part)
    return total


BACKLOG_COMMANDS = 5  # commands :func:`queue_backlog` sends


@dataclass(frozen=True, slots=True)
class QueueState:
    """A queue now: its backlog and whether it is paused."""

    queue: str
    backlog: Backlog
    paused: bool


def queue_backlog(pipe: Any, keys: QueueKeys) -> None:
    """Queue the reads of one queue's backlog on ``pipe``: ready and suspended = their
    counters, scheduled = delayed set (less the suspended jobs' timers in it),
    active = leases, dead = dead set, and whether it has limits or a pause
    (:data:`BACKLOG_COMMANDS` commands)."""
    pipe.hmget(keys.counts, "ready", "suspended", "suspended_timed")
    pipe.zcard(keys.delayed).zcard(keys.leases).zcard(keys.dead)
    pipe.exists(keys.limits, keys.paused)


def take_backlog(client: Any, keys: QueueKeys, replies: list[Any]
                 ) -> tuple[Backlog, FlowState | None]:
    """The backlog from the replies of :func:`queue_backlog`, with ``held`` (the ready
    jobs a limit holds back) from the flow-control state, read only when the queue has
    limits or a pause (then returned too)."""
    (ready, suspended, timed), delayed, active, dead, limited = replies
    flow = read_flow(client, keys) if int(limited) else None
    scheduled = max(0, int(delayed) - max(0, untrusted.integer(timed)))
    return Backlog(max(0, untrusted.integer(ready)), scheduled, int(active), int(dead),
                   flow.held if flow is not None else 0,
                   max(0, untrusted.integer(suspended))), flow


def read_states(client: redis.Redis, keys: Mapping[str, QueueKeys]) -> dict[str, QueueState]:
    """Backlog and pause of each queue (one pipelined round trip, plus the flow-control
    read of each queue that has limits or a pause)."""
    with client.pipeline(transaction=False) as pipe:
        for k in keys.values():
            queue_backlog(pipe, k)
        replies = pipe.execute()
    out = {}
    for i, (queue, k) in enumerate(keys.items()):
        part = replies[i * BACKLOG_COMMANDS: (i + 1) * BACKLOG_COMMANDS]
        backlog, flow = take_backlog(client, k, part)
        out[queue] = QueueState(queue, backlog, flow is not None and flow.paused)
    return out


def build(task: str | None, queue: str | None, window: float, span: float, now: float,
          part: TaskWindow, backlog: Backlog) -> Stats:
    """Turn summed counters and histograms into a :class:`Stats`."""
    c = part.counters
    span = max(span, 1e-9)
    return Stats(
        task=task, queue=queue, window=window, span=span,
        enqueued=c.get("enqueued", 0), started=c.get("started", 0),
        succeeded=c.get("succeeded", 0), failed=c.get("failed", 0),
        retried=c.get("retried", 0), dead=c.get("dead", 0),
        throughput=(c.get("succeeded", 0) + c.get("dead", 0)) / span,
        arrival_rate=c.get("enqueued", 0) / span,
        wait=Timing.of(part.wait), run=Timing.of(part.run), backlog=backlog, now=now,
        expired=c.get("expired", 0),
    )
