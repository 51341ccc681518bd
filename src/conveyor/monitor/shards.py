"""A sharded queue seen as one queue: which shards make it up, and its figures summed.

Each shard of a queue (``emails``, ``emails~1``, ...; see :mod:`conveyor.sharding`) is a
queue of its own on the server, with its own counters, metric buckets and limits. The
monitor lists a sharded queue once, under its own name, with:

* counts (ready, scheduled, active, suspended, dead, held, running) summed over its shards;
* counters (enqueued, succeeded, failed, ...) and so throughput summed;
* wait and run percentiles read from the shards' histograms merged bin by bin (the bins
  are the same on every shard), so they are those of all the queue's jobs, not an average
  of the shards' percentiles;
* the whole queue's cap and rate (from its layout) as its limits, and what a limit holds
  back summed over the shards (each shard holds back what its share or its part of the
  rate leaves waiting).

Which shards a queue has is read from the index of queues: a shard is listed there once a
job was stored on it, so a shard that never held a job shows nowhere (it has no figure to
show). A name that is itself a shard's (``emails~1``) stands for that shard alone: that is
how every reader gives a shard's own figures.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import redis

from .. import untrusted
from ..clock import server_now
from ..keys import queues_key
from ..sharding import Layout, base_queue, is_shard, read_layout, served_from
from .flow import FlowState, read_flow
from .lists import PriorityLevel, Tenants
from .stats import Backlog, TaskWindow, bucket_starts, build, merge, read_states, read_windows

if TYPE_CHECKING:
    from ..app import Conveyor


def number(name: str) -> int:
    """A shard's number (0: the queue itself; a name that is no shard's sorts last)."""
    if not is_shard(name):
        return 0
    tail = name.rpartition("~")[2]
    return int(tail) if tail.isdigit() else 1 << 30


def group(names: Iterable[str]) -> dict[str, list[str]]:
    """Queue -> its shards among ``names``, the queue itself first (listed even when only
    its shards are), then by number; queues sorted by name."""
    out: dict[str, list[str]] = {}
    for name in names:
        out.setdefault(base_queue(name), []).append(name)
    return {queue: sorted(set(members) | {queue}, key=lambda n: (number(n), n))
            for queue, members in sorted(out.items())}


def members(queue: str, names: Iterable[str]) -> list[str]:
    """The shards of ``queue`` among ``names`` (a shard's own name: itself alone)."""
    if is_shard(queue):
        return [queue]
    return group(n for n in names if base_queue(n) == queue).get(queue, [queue])


def merge_parts(parts: Iterable[dict[str, TaskWindow]]) -> dict[str, TaskWindow]:
    """Per-task windows of several shards summed (histograms merged bin by bin)."""
    out: dict[str, TaskWindow] = {}
    for part in parts:
        for task, window in part.items():
            out.setdefault(task, TaskWindow()).merge(window)
    return out


def merge_buckets(per_shard: Sequence[Sequence[dict[str, TaskWindow] | None]]
                  ) -> list[dict[str, TaskWindow] | None]:
    """The buckets of several shards (one list per shard, the same starts) summed start by
    start; a start is None (not read yet) when any shard's bucket of it is."""
    out: list[dict[str, TaskWindow] | None] = []
    for at_start in zip(*per_shard, strict=True):
        if any(b is None for b in at_start):
            out.append(None)
        else:
            out.append(merge_parts(b for b in at_start if b is not None))
    return out


def _summed(maps: Iterable[dict[str, int]]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for m in maps:
        total.update(m)
    return dict(sorted(total.items()))


def merge_flows(queue: str, parts: Sequence[FlowState], layout: Layout) -> FlowState:
    """One flow-control state for a queue from its shards' (the queue itself first).

    Its limits are the whole queue's (tenant limits are the same on every shard); paused
    is the queue's own switch, as :meth:`conveyor.limits.Queue.is_paused` reads it;
    ``blocked_by`` is the reason every shard with ready jobs gives (the cap when the whole
    queue runs as many as it allows), else None."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    limits = replace(first.limits, concurrency=layout.concurrency, rate=layout.rate)
    running = sum(p.running for p in parts)
    if first.paused:
        blocked: str | None = "paused"
    elif limits.concurrency is not None and running >= limits.concurrency:
        blocked = "concurrency"
    else:
        reasons = {p.blocked_by for p in parts if p.ready} or {p.blocked_by for p in parts}
        blocked = reasons.pop() if len(reasons) == 1 else None
    return FlowState(
        queue=queue, limits=limits, paused=first.paused, running=running,
        running_by_tenant=_summed(p.running_by_tenant for p in parts),
        ready=sum(p.ready for p in parts), held=sum(p.held for p in parts),
        held_by_tenant=_summed(p.held_by_tenant for p in parts), blocked_by=blocked)


def merge_tenants(parts: Sequence[Tenants], most: int, top: int) -> Tenants:
    """Ready jobs per priority level and tenant of several shards: a tenant lives on one
    shard, but jobs without a tenant (``(none)``) may be on each, and are summed."""
    if len(parts) == 1:
        return parts[0]
    counts: dict[int, Counter[str]] = {}
    rings: Counter[int] = Counter()
    for part in parts:
        for level in part.levels:
            counts.setdefault(level.priority, Counter()).update(dict(level.tenants))
            rings[level.priority] += level.tenant_count
    levels, largest = [], Counter[str]()
    for priority in sorted(counts, reverse=True):
        shown = counts[priority].most_common(most)
        largest.update(dict(shown))
        # a name on several shards' rings (jobs without a tenant) is one tenant
        repeated = sum(1 for part in parts for level in part.levels
                       if level.priority == priority for name, _ in level.tenants) - \
            len(counts[priority])
        levels.append(PriorityLevel(priority, shown, rings[priority] - repeated))
    return Tenants(levels, largest.most_common(top), sum(p.incoming for p in parts))


@dataclass(frozen=True, slots=True)
class ShardState:
    """One shard of a queue now, and over the window asked for.

    :ivar share: its share of the queue's cap now (None: the queue has no cap)
    :ivar rate: its part of the queue's rate (jobs per second; None: no rate)
    :ivar retired: a smaller count stopped sending jobs to it (it is served until empty)
    :ivar node: the Cluster primary that holds it (``host:port``; None off a Cluster)
    """

    name: str
    backlog: Backlog
    paused: bool
    running: int
    share: int | None
    rate: float | None
    retired: bool
    throughput: float
    wait_p95: float | None
    node: str | None = None


def node_of(app: Conveyor, shard: str) -> str | None:
    """The Cluster primary that holds ``shard`` (None off a Cluster)."""
    if not isinstance(app.redis, redis.RedisCluster):
        return None
    try:
        cluster: Any = app.redis  # redis-py leaves get_node_from_key untyped
        return str(cluster.get_node_from_key(app.keys(shard).limits).name)
    except (redis.RedisError, KeyError, IndexError):
        return None


def read_shard_states(app: Conveyor, queue: str, window: float) -> list[ShardState]:
    """Every shard of ``queue`` that may hold jobs (as workers serve them), each with its
    figures (a shard's name: the shards of its queue)."""
    queue = base_queue(queue)
    known = [untrusted.text(n) or "" for n in app.redis.smembers(queues_key(app.namespace))]
    layout = read_layout(app, queue)
    served = served_from(layout, known)
    keys = {s: app.keys(s) for s in served}
    states = read_states(app.redis, keys)
    now = server_now(app.redis)
    starts = bucket_starts(now, window, app.limits.bucket_seconds)
    windows = read_windows(app.redis, keys, starts)
    out = []
    for shard in served:
        flow = read_flow(app.redis, keys[shard])
        stats = build(None, shard, window, now - starts[0], now,
                      merge([windows[shard]]), states[shard].backlog)
        out.append(ShardState(
            shard, states[shard].backlog, states[shard].paused, flow.running,
            flow.limits.concurrency if layout.concurrency is not None else None,
            flow.limits.rate, shard in layout.retired, stats.throughput, stats.wait.p95,
            node_of(app, shard)))
    return out
