"""What each task type of a queue is doing now: jobs running, last finish, idle or not.

The scripts keep two hashes per queue (task -> jobs leased now, task -> last finish);
this module reads them (one pipelined round trip for any number of queues) and decides
idleness in one place for the monitor, the overview, the CLI and the dashboard.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import untrusted
from ..keys import QueueKeys

if TYPE_CHECKING:
    from ..app import Conveyor

DEFAULT_IDLE_THRESHOLD = 300.0  # seconds, for a task type the app does not register


@dataclass(frozen=True, slots=True)
class TaskActivity:
    """One task type of one queue now: jobs running, last finish, and whether it is idle
    (nothing running and nothing finished within ``threshold`` seconds)."""

    task: str
    queue: str
    active: int
    idle_since: float | None
    idle: bool
    threshold: float = DEFAULT_IDLE_THRESHOLD


def queue_activity(pipe: Any, keys: QueueKeys) -> None:
    """Queue the two reads of one queue's activity on ``pipe``."""
    pipe.hgetall(keys.active).hgetall(keys.idle)


def running(raw: dict[Any, Any]) -> dict[str, int]:
    """Jobs running per task type from the active hash (never negative)."""
    return {untrusted.text(n) or "": max(0, untrusted.integer(v)) for n, v in raw.items()}


def finished(raw: dict[Any, Any]) -> dict[str, float]:
    """Last finish per task type from the idle hash (malformed values left out)."""
    return {untrusted.text(n) or "": t for n, v in raw.items()
            if (t := untrusted.number(v)) is not None}


def task_activity(app: Conveyor, queue: str, active: dict[str, int],
                  idle: dict[str, float], now: float) -> list[TaskActivity]:
    """Every task type the app registers on ``queue`` or the hashes mention, by name."""
    names = set(active) | set(idle) | {t.name for t in app.tasks.values() if t.queue == queue}
    out = []
    for name in sorted(names):
        known = app.tasks.get(name)
        threshold = known.idle_threshold if known else DEFAULT_IDLE_THRESHOLD
        since, jobs = idle.get(name), active.get(name, 0)
        out.append(TaskActivity(name, queue, jobs, since,
                                jobs == 0 and (since is None or now - since >= threshold),
                                threshold))
    return out


def read_activity(app: Conveyor, queues: list[str], now: float) -> list[TaskActivity]:
    """Activity of every task type of ``queues``, sorted by queue then task (one round
    trip)."""
    with app.redis.pipeline(transaction=False) as pipe:
        for queue in queues:
            queue_activity(pipe, app.keys(queue))
        replies = iter(pipe.execute())
    out = []
    for queue in queues:
        active, idle = running(next(replies)), finished(next(replies))
        out.extend(task_activity(app, queue, active, idle, now))
    return out


def fold_activity(app: Conveyor, groups: dict[str, list[str]], rows: list[TaskActivity],
                  now: float) -> list[TaskActivity]:
    """Activity rows of shards (``rows``, by shard) as rows of their queues (``groups``:
    queue -> shards): jobs running summed, the latest finish kept."""
    by_shard: dict[str, list[TaskActivity]] = {}
    for row in rows:
        by_shard.setdefault(row.queue, []).append(row)
    out = []
    for queue, members in groups.items():
        active: dict[str, int] = {}
        idle: dict[str, float] = {}
        for shard in members:
            for row in by_shard.get(shard, []):
                active[row.task] = active.get(row.task, 0) + row.active
                if row.idle_since is not None:
                    idle[row.task] = max(idle.get(row.task, row.idle_since), row.idle_since)
        out.extend(task_activity(app, queue, active, idle, now))
    return out
