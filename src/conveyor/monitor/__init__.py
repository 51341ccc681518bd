"""Read-only views of what the queues and workers are doing.

Everything here reads Redis and changes nothing: the counters, idle times and metric
buckets are written by the Lua scripts that start and finish jobs, so they cannot drift
from what happened, and the worker registry is written by the workers themselves (its
reader drops the entries of workers that stopped heartbeating, which a killed worker
cannot do itself).
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from .. import sharding
from ..clock import server_now
from ..fleet import published
from ..fleet.published import SupervisorRecord
from ..worker import registry
from ..worker.registry import WorkerInfo
from . import shards as sharded
from .activity import TaskActivity, fold_activity, read_activity
from .advice import Advice, decide
from .flow import FlowState, read_flow
from .lists import (
    JobDetail,
    JobPage,
    ScheduleRow,
    Tenants,
    read_job_detail,
    read_schedules,
    read_shards_jobs,
    read_tenants,
)
from .overview import BucketCache, Overview, QueueOverview, read_overview
from .series import Series, build_series
from .shards import ShardState, read_shard_states
from .stats import (
    Backlog,
    QueueState,
    Stats,
    TaskWindow,
    Timing,
    bucket_starts,
    build,
    read_states,
    read_windows,
)

if TYPE_CHECKING:
    from ..app import Conveyor

RUN_TIME_LOOKBACK = 3600.0  # seconds of history advice falls back on for the run time

__all__ = ["Advice", "Backlog", "JobDetail", "JobPage", "Monitor", "Overview", "QueueOverview",
           "QueueState", "ScheduleRow", "Series", "ShardState", "Stats", "SupervisorRecord",
           "TaskActivity", "Tenants", "Timing", "WorkerInfo"]


class Monitor:
    """Answers operators' questions from Redis; never changes anything."""

    def __init__(self, app: Conveyor) -> None:
        self.app = app
        self._cache: BucketCache | None = None

    def _closed_buckets(self) -> BucketCache:
        limits = self.app.limits
        if self._cache is None or self._cache.width != limits.bucket_seconds:
            self._cache = BucketCache(limits.bucket_seconds, limits.bucket_ttl)
        return self._cache

    def overview(self, spark_window: float = 600, window: float = 60,
                 target_wait: float = 10, shards: bool = False) -> Overview:
        """Every known queue with its backlog, stats over ``window`` seconds, a sparkline
        series over ``spark_window`` and advice; the activity of every task type; the live
        workers. Three round trips (plus the flow read of queues with limits); closed
        metric buckets are kept in memory and not read again.

        :param shards: list each shard of a sharded queue apart (default: a sharded queue
            once, its figures summed over its shards, see :mod:`.shards`)
        """
        return read_overview(self.app, self._closed_buckets(), spark_window, window,
                             target_wait, shards)

    # -- queues and their shards -----------------------------------------------------------

    def queue_names(self) -> list[str]:
        """Every known queue, a sharded one once (under its own name), sorted."""
        return list(sharded.group(self.app.known_queues()))

    def shards_of(self, queue: str) -> list[str]:
        """The shards of ``queue`` that ever held a job, the queue itself first (``[queue]``
        for a queue never sharded, or for a shard's own name)."""
        return self._groups([queue])[queue]

    def _groups(self, queues: list[str] | None, shards: bool = False
                ) -> dict[str, list[str]]:
        """Queue -> its shards, for ``queues`` (default: every known queue); with
        ``shards``, each shard -> itself alone. One read of the index of queues."""
        known = self.app.known_queues()
        if queues is None:
            groups = sharded.group(known)
        else:
            groups = {q: sharded.members(q, known) for q in queues}
        if shards:
            return {s: [s] for members in groups.values() for s in members}
        return groups

    def shard_states(self, queue: str, window: float = 60) -> list[ShardState]:
        """Each shard of ``queue`` that may hold jobs (active, retired, or named by the
        index of queues) with its backlog, jobs running, share of the cap and part of the
        rate, and its throughput and wait p95 over ``window`` seconds."""
        return read_shard_states(self.app, queue, window)

    def tenants(self, queue: str, most: int = 25, top: int = 10) -> Tenants:
        """Ready jobs of ``queue`` per priority level and tenant (the first ``most``
        tenants of each level in turn order) and the ``top`` largest shown."""
        parts = [read_tenants(self.app, s, most, top) for s in self.shards_of(queue)]
        return sharded.merge_tenants(parts, most, top)

    def jobs(self, queue: str, state: str, offset: int = 0, limit: int = 50) -> JobPage:
        """A page of the ``scheduled`` (soonest first), ``active`` or ``dead`` (newest
        first) jobs of ``queue``.

        :raises KeyError: ``state`` is none of those
        """
        return read_shards_jobs(self.app, queue, self.shards_of(queue), state, offset, limit)

    def schedules(self, now: float | None = None) -> list[ScheduleRow]:
        """The app's periodic jobs with their next fire and last fired tick (None until a
        tick has fired: the tick a worker's first start records is not one).

        :param now: the server's clock (epoch s) when the caller has read it already
        """
        return read_schedules(self.app, server_now(self.app.redis) if now is None else now)

    def series(self, queue: str, window: float = 900, points: int = 90) -> Series:
        """Chart points of ``queue`` over the last ``window`` seconds (at most ``points``),
        from the same buckets and histograms as :meth:`stats`."""
        now = server_now(self.app.redis)
        starts = bucket_starts(now, window, self.app.limits.bucket_seconds)
        keys = {s: self.app.keys(s) for s in self.shards_of(queue)}
        read = self._closed_buckets().read(self.app.redis, keys, starts, now)
        buckets = [b or {} for b in sharded.merge_buckets(list(read.values()))]
        return build_series(starts, buckets, self.app.limits.bucket_seconds, points)

    def _queues_of(self, task: str) -> list[str]:
        known = self.app.tasks.get(task)
        return self.shards_of(known.queue) if known else self.app.known_queues()

    def active(self, task: str) -> int:
        """How many jobs of ``task`` are leased to workers now (never negative)."""
        total = 0
        for queue in self._queues_of(task):
            value = self.app.redis.hget(self.app.keys(queue).active, task)
            total += max(0, int(value or 0))
        return total

    def idle_since(self, task: str) -> float | None:
        """When a job of ``task`` last finished (epoch s, server clock); None if never."""
        latest: float | None = None
        for queue in self._queues_of(task):
            value = self.app.redis.hget(self.app.keys(queue).idle, task)
            if value is not None:
                latest = max(latest or 0.0, float(value))
        return latest

    def is_idle(self, task: str, threshold: float | None = None) -> bool:
        """True when no job of ``task`` runs and none finished within ``threshold`` seconds
        (default: the task's ``idle_threshold``). A type never seen is idle."""
        if threshold is None:
            known = self.app.tasks.get(task)
            threshold = known.idle_threshold if known else 300.0
        if self.active(task) > 0:
            return False
        since = self.idle_since(task)
        if since is None:
            return True
        return server_now(self.app.redis) - since >= threshold

    # -- windowed stats --------------------------------------------------------------------

    def backlog(self, queue: str) -> Backlog:
        """Jobs of ``queue`` ready, scheduled (delayed or awaiting retry), active and dead."""
        return self.queue_states([queue])[queue].backlog

    def flow(self, queue: str) -> FlowState:
        """``queue``'s limits, running counts and the ready jobs its limits hold back now,
        per tenant too."""
        members = self.shards_of(queue)
        parts = [read_flow(self.app.redis, self.app.keys(s)) for s in members]
        if len(parts) == 1:
            return parts[0]
        return sharded.merge_flows(queue, parts, sharding.read_layout(self.app, queue))

    def _stat_queues(self, task: str | None, queue: str | None) -> list[str]:
        if queue is not None:
            return [queue]
        known = self.app.tasks.get(task) if task is not None else None
        return [known.queue] if known else self.queue_names()

    def _windows(self, groups: dict[str, list[str]], window: float
                 ) -> tuple[float, float, dict[str, dict[str, TaskWindow]]]:
        """Per queue of ``groups`` (queue -> its shards), its windows summed over its
        shards."""
        now = server_now(self.app.redis)
        width = self.app.limits.bucket_seconds
        starts = bucket_starts(now, window, width)
        keys = {s: self.app.keys(s) for members in groups.values() for s in members}
        by_shard = read_windows(self.app.redis, keys, starts)
        by_queue = {q: sharded.merge_parts(by_shard[s] for s in members)
                    for q, members in groups.items()}
        return now, now - starts[0], by_queue

    def stats(self, task: str | None = None, queue: str | None = None,
              window: float = 300) -> Stats:
        """Counts, throughput, wait and run percentiles over the last ``window`` seconds,
        and the backlog now.

        :param task: one task type (default: all); its queue unless ``queue`` is given
        :param queue: one queue (default: the task's queue, or every known queue)
        :param window: seconds to look back (at most ``limits.bucket_ttl`` is kept)
        """
        queues = self._stat_queues(task, queue)
        now, span, by_queue = self._windows(self._groups(queues), window)
        total = TaskWindow()
        for windows in by_queue.values():
            for name, part in windows.items():
                if task is None or name == task:
                    total.merge(part)
        backlog = Backlog()
        for state in self.queue_states(queues).values():
            backlog = backlog + state.backlog
        return build(task, queue, window, span, now, total, backlog)

    def stats_by_task(self, queue: str | None = None, window: float = 300,
                      shards: bool = False) -> list[Stats]:
        """One :class:`Stats` per (queue, task type) seen in the window, sorted; each
        carries its queue's backlog.

        :param shards: one per (shard, task type) of a sharded queue (default: its shards
            summed)
        """
        groups = self._groups(self._stat_queues(None, queue), shards)
        now, span, by_queue = self._windows(groups, window)
        states = self.queue_states(list(groups), shards=shards)
        out = []
        for q in groups:
            windows = by_queue[q]
            if not windows:
                continue
            backlog = states[q].backlog
            for name in sorted(windows):
                out.append(build(name, q, window, span, now, windows[name], backlog))
        return out

    def activity(self, queue: str | None = None, shards: bool = False) -> list[TaskActivity]:
        """Every task type known to the app or seen by the queues: active now, last finish,
        idle against its threshold. Sorted by queue, then task (one round trip).

        :param shards: rows per shard of a sharded queue (default: its shards summed)
        """
        groups = self._groups(None if queue is None else [queue], shards)
        now = server_now(self.app.redis)
        rows = read_activity(self.app, [s for members in groups.values() for s in members],
                             now)
        return fold_activity(self.app, groups, rows, now)

    def queue_states(self, queues: list[str] | None = None, shards: bool = False
                     ) -> dict[str, QueueState]:
        """Backlog and pause of each of ``queues`` (default: every known queue), in one
        round trip (plus the flow-control read of a queue with limits or a pause).

        :param shards: one entry per shard of a sharded queue (default: one per queue, its
            backlog summed over its shards and paused as the queue itself is)
        """
        groups = self._groups(queues)
        names = [s for members in groups.values() for s in members]
        states = read_states(self.app.redis, {s: self.app.keys(s) for s in names})
        if shards:
            return states
        out = {}
        for q, members in groups.items():
            backlog = Backlog()
            for s in members:
                backlog = backlog + states[s].backlog
            out[q] = QueueState(q, backlog, states[members[0]].paused)
        return out

    def job_detail(self, job_id: str) -> JobDetail:
        """A job's record with its decoded arguments and its workflow (one read).

        :raises JobNotFound: no such job (or its record expired)
        :raises ValueError: not a job id
        """
        return read_job_detail(self.app, job_id)

    # -- capacity and advice ---------------------------------------------------------------

    def workers(self, now: float | None = None) -> list[WorkerInfo]:
        """Live worker processes from the worker registry (empty when none registered),
        oldest heartbeat first; what counts as live is decided by
        :func:`conveyor.worker.registry.live_workers`.

        :param now: the server's clock (epoch s) when the caller has read it already
        """
        return registry.live_workers(self.app,
                                     now=server_now(self.app.redis) if now is None else now)

    def supervisors(self, decisions: int = 10) -> list[SupervisorRecord]:
        """Live worker supervisors as they last published themselves, each with its latest
        ``decisions`` (newest first), oldest heartbeat first."""
        return published.live_supervisors(self.app, decisions=decisions)

    def advice(self, queue: str = "default", target_wait: float = 10,
               deadline: float | dt.datetime | None = None, window: float = 60) -> Advice:
        """How many workers ``queue`` needs to keep waits under ``target_wait`` seconds (and
        drain its pending jobs before ``deadline``), how long it takes to drain now, and why.

        :param queue: the queue to advise on
        :param target_wait: seconds a job should wait at most before it starts
        :param deadline: when every pending job must be done (aware datetime or epoch s)
        :param window: seconds of history the rates are measured over
        """
        if isinstance(deadline, dt.datetime):
            deadline = deadline.timestamp()
        stats = self.stats(queue=queue, window=window)
        run_time = stats.run.mean
        if run_time is None:  # nothing finished lately: the last hour's runs will do
            longer = min(self.app.limits.bucket_ttl, RUN_TIME_LOOKBACK)
            run_time = self.stats(queue=queue, window=longer).run.mean
        live = self.workers()
        return decide(queue, stats, run_time, registry.serving(live, queue), bool(live),
                      target_wait, deadline, flow=self.flow(queue))
