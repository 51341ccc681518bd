"""Windowed statistics read from the metric buckets the Lua scripts write.

A bucket ``m:<start s>`` of a queue holds, per task type, counters (``<task>|succeeded``)
and log histograms of wait and run time (``<task>|w|<bin>``). A window of W seconds is
the buckets whose start lies within W of now, plus the one cut by the window's start, so
it covers between W and W + bucket width; rates divide by the span actually covered.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from ..keys import QueueKeys
from .flow import read_flow
from .histogram import Histogram

COUNTERS = ("enqueued", "started", "succeeded", "failed", "retried", "dead")


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
    (flow control, or a pause) keeps from starting now."""

    ready: int = 0
    scheduled: int = 0
    active: int = 0
    dead: int = 0
    held: int = 0

    @property
    def pending(self) -> int:
        """Jobs still to run or running: ready + scheduled + active (dead excluded)."""
        return self.ready + self.scheduled + self.active

    def __add__(self, other: Backlog) -> Backlog:
        return Backlog(self.ready + other.ready, self.scheduled + other.scheduled,
                       self.active + other.active, self.dead + other.dead,
                       self.held + other.held)


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


def parse_bucket(fields: Mapping[Any, Any], into: dict[str, TaskWindow]) -> None:
    """Add one bucket hash (as HGETALL returns it) into per-task windows."""
    for raw_name, raw_value in fields.items():
        name, value = _text(raw_name), _text(raw_value)
        head, _, last = name.rpartition("|")
        if not head:
            continue
        if last.isdigit():
            task, _, kind = head.rpartition("|")
            if kind in ("w", "r") and task:
                target = into.setdefault(task, TaskWindow())
                (target.wait if kind == "w" else target.run).add_bin(int(last), int(value))
            continue
        target = into.setdefault(head, TaskWindow())
        if last == "wsum":
            target.wait.total += float(value)
        elif last == "rsum":
            target.run.total += float(value)
        else:
            target.counters[last] = target.counters.get(last, 0) + int(float(value))


def queue_buckets(pipe: Any, keys: QueueKeys, starts: Iterable[int]) -> None:
    """Queue the HGETALL of each bucket of one queue on ``pipe`` (keys from ``keys.py``)."""
    for start in starts:
        pipe.hgetall(keys.metrics(start))


def parse_replies(replies: Iterable[Mapping[Any, Any] | None]) -> list[dict[str, TaskWindow]]:
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


def read_buckets(client: redis.Redis, keys: Mapping[str, QueueKeys], starts: list[int]
                 ) -> dict[str, list[dict[str, TaskWindow]]]:
    """The one reader of the metric buckets: per queue, each bucket of ``starts`` parsed
    into per-task windows, oldest first (one pipelined round trip for every queue)."""
    with client.pipeline(transaction=False) as pipe:
        for k in keys.values():
            queue_buckets(pipe, k, starts)
        replies = pipe.execute()
    out, n = {}, len(starts)
    for i, queue in enumerate(keys):
        out[queue] = parse_replies(replies[i * n: (i + 1) * n])
    return out


def merge(buckets: Iterable[dict[str, TaskWindow]], task: str | None = None) -> TaskWindow:
    """One window over ``buckets``, for ``task`` or for every task."""
    total = TaskWindow()
    for bucket in buckets:
        for name, part in bucket.items():
            if task is None or name == task:
                total.merge(part)
    return total


def read_windows(client: redis.Redis, keys: QueueKeys, starts: Iterable[int]
                 ) -> dict[str, TaskWindow]:
    """Per-task sums over the given buckets of one queue (one pipelined round trip)."""
    out: dict[str, TaskWindow] = {}
    for bucket in read_buckets(client, {"": keys}, list(starts))[""]:
        for name, part in bucket.items():
            out.setdefault(name, TaskWindow()).merge(part)
    return out


def read_backlog(client: redis.Redis, keys: QueueKeys) -> Backlog:
    """ready = the ready counter, scheduled = delayed set, active = leases, dead = dead set,
    held = ready jobs a limit holds back (read only when the queue has limits or a pause)."""
    with client.pipeline(transaction=False) as pipe:
        pipe.hget(keys.counts, "ready")
        for zset in (keys.delayed, keys.leases, keys.dead):
            pipe.zcard(zset)
        pipe.exists(keys.limits, keys.paused)
        ready, scheduled, active, dead, limited = pipe.execute()
    held = read_flow(client, keys).held if int(limited) else 0
    return Backlog(max(0, int(ready or 0)), int(scheduled), int(active), int(dead), held)


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
    )
