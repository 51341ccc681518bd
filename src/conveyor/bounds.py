"""``Limits``: how much of a queue Redis keeps, set once on :class:`~conveyor.Conveyor`.

Retention of finished records, the dead-letter cap, the events stream's length, metric
buckets and the snooze cap are the bounds that keep Redis memory flat. They are settings
of the app that every script call carries, not part of a call, so they live apart from the
call builders (:mod:`conveyor.scripts.calls`), which take them. (Flow-control limits of a
queue, concurrency and rate, are another thing: :mod:`conveyor.limits`.)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds that keep Redis memory flat; set on :class:`~conveyor.Conveyor`."""

    retention: int = 86_400  # seconds a finished job record and its result are kept
    dead_cap: int = 100_000  # most dead letters kept per queue
    events_maxlen: int = 100_000  # approximate cap of a queue's events stream
    bucket_seconds: int = 10  # width of a metric bucket
    bucket_ttl: int = 86_400  # lifetime of a metric bucket: the longest stats window
    snooze_cap: int = 100  # most snoozes of one job; the next one makes it dead
