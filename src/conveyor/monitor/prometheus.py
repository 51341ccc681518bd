"""Prometheus metrics read from Redis at each scrape (``conveyor metrics --port``).

One exporter reports for every worker: it reads the queues' backlog, the active and idle
hashes, the worker registry and the metric buckets the Lua scripts write. Counters and
histograms must only grow, while buckets expire; so the exporter keeps running totals in
its own memory and adds, at each scrape, what each recent bucket gained since it was last
seen. On start it counts every bucket still kept (up to ``limits.bucket_ttl`` of
history): the closed ones summed in Redis (one ``ZUNION`` per thousand buckets, as the
monitor reads a window), only the newest few, which scripts may still write to, read one
by one and remembered. A restarted exporter is a counter reset, which ``rate()`` handles.

A sharded queue is reported under its own name, each figure summed over its shards (the
running totals are kept per shard and added up at each scrape, so they only grow as
theirs do); ``shards=True`` reports each shard apart, under the shard's name.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ..clock import server_now
from ..sharding import base_queue
from .stats import (
    COUNTERS,
    TaskWindow,
    bucket_starts,
    fields_of,
    parse_bucket,
    parse_window,
    queue_buckets,
    queue_window,
)

if TYPE_CHECKING:
    from ..app import Conveyor

OPEN_BUCKETS = 3
"""The newest buckets of a window that a script may still write to (the open one, the one
before it, one spare): read one by one, so that later scrapes add only what they gained."""
# Upper bounds (s) of the exported wait and run histograms; the log bins fold into these.
EDGES = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
         60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


class RedisCollector(Collector):
    """A collector for ``prometheus_client`` registries; thread-safe across scrapes.

    :param app: the application whose queues are reported
    :param queues: queues to report (default: every known queue at each scrape)
    :param advice: also export ``conveyor_queue_workers_needed`` from the scaling advice
    :param shards: report each shard of a sharded queue apart (default: summed)
    """

    def __init__(self, app: Conveyor, queues: list[str] | None = None,
                 advice: bool = True, shards: bool = False) -> None:
        self.app = app
        self.queues = queues
        self.with_advice = advice
        self.by_shard = shards
        self.seen: dict[str, dict[int, dict[str, float]]] = {}
        # Per queue: buckets older than this start were counted as one sum at the first
        # scrape; reading one of them again would count it twice.
        self.counted_before: dict[str, int] = {}
        self.totals: dict[tuple[str, str], TaskWindow] = {}
        self.last_now: float | None = None
        self.lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            queues = self.queues or self.app.monitor.queue_names()
            now = server_now(self.app.redis)
            for shard in [s for q in queues for s in self.app.monitor.shards_of(q)]:
                self._accumulate(shard, now)
            self.last_now = now
            yield from self._gauges(queues, now)
            yield from self._counters()
            yield from self._histograms()

    # -- running totals from buckets ------------------------------------------------------

    def _accumulate(self, queue: str, now: float) -> None:
        width, ttl = self.app.limits.bucket_seconds, self.app.limits.bucket_ttl
        keys = self.app.keys(queue)
        seen = self.seen.get(queue)
        closed: list[int] = []
        if seen is None:  # first scrape of this queue: all the history Redis keeps
            seen = self.seen[queue] = {}
            starts = bucket_starts(now, ttl, width)
            closed, starts = starts[:-OPEN_BUCKETS], starts[-OPEN_BUCKETS:]
            self.counted_before[queue] = starts[0]
        else:
            assert self.last_now is not None
            window = min(ttl, now - self.last_now + 2 * width)
            floor = self.counted_before[queue]
            starts = [s for s in bucket_starts(now, window, width) if s >= floor]
        with self.app.redis.pipeline(transaction=False) as pipe:
            summed = queue_window(pipe, keys, closed)  # no command for no bucket
            queue_buckets(pipe, keys, starts)
            replies = pipe.execute()
        gained: dict[str, float] = {}
        for start, reply in zip(starts, replies[summed:], strict=True):
            try:
                fields = dict(fields_of(reply))
            except ValueError:  # a damaged bucket reads as empty, never as a crash
                fields = {}
            before = seen.get(start, {})
            for name, value in fields.items():
                delta = value - before.get(name, 0.0)
                if delta > 0:
                    gained[name] = gained.get(name, 0.0) + delta
            seen[start] = fields
        for start in [s for s in seen if starts and s < starts[0]]:
            del seen[start]  # no script writes to a bucket that old any more
        parts = parse_window(replies[:summed])  # the closed buckets' sum, at the first scrape
        parse_bucket({k: _number(v) for k, v in gained.items()}, parts)
        for task, part in parts.items():
            self.totals.setdefault((queue, task), TaskWindow()).merge(part)

    # -- families --------------------------------------------------------------------------

    def _gauges(self, queues: list[str], now: float) -> Iterator[Metric]:
        backlog = GaugeMetricFamily("conveyor_queue_jobs", "Jobs of a queue by state now",
                                    labels=["queue", "state"])
        active = GaugeMetricFamily("conveyor_task_active", "Jobs of a task type running now",
                                   labels=["queue", "task"])
        idle = GaugeMetricFamily("conveyor_task_idle_seconds",
                                 "Seconds since a job of the task type last finished",
                                 labels=["queue", "task"])
        held = GaugeMetricFamily("conveyor_queue_held",
                                 "Ready jobs of a queue that a limit (or a pause) holds back now",
                                 labels=["queue"])
        needed = GaugeMetricFamily("conveyor_queue_workers_needed",
                                   "Worker processes the scaling advice asks for",
                                   labels=["queue"])
        states = self.app.monitor.queue_states(queues, shards=self.by_shard)
        for queue, found in states.items():
            b = found.backlog
            for state in ("ready", "scheduled", "active", "dead", "suspended"):
                backlog.add_metric([queue, state], getattr(b, state))
            held.add_metric([queue], b.held)
        if self.with_advice:  # workers serve a queue, all its shards: advice is per queue
            for queue in queues:
                needed.add_metric([queue], self.app.monitor.advice(queue).workers_needed)
        for row in self.app.monitor.activity(shards=self.by_shard):
            if row.queue in states:
                active.add_metric([row.queue, row.task], row.active)
                if row.idle_since is not None:
                    idle.add_metric([row.queue, row.task], max(0.0, now - row.idle_since))
        workers = GaugeMetricFamily("conveyor_workers", "Live worker processes (registry)")
        workers.add_metric([], len(self.app.monitor.workers()))
        yield from (backlog, held, active, idle, workers)
        if self.with_advice:
            yield needed

    def _reported(self) -> dict[tuple[str, str], TaskWindow]:
        """The running totals by (queue, task): a sharded queue's summed over its shards
        (unless each shard is reported apart)."""
        if self.by_shard:
            return dict(sorted(self.totals.items()))
        out: dict[tuple[str, str], TaskWindow] = {}
        for (shard, task), part in self.totals.items():
            out.setdefault((base_queue(shard), task), TaskWindow()).merge(part)
        return dict(sorted(out.items()))

    def _counters(self) -> Iterator[Metric]:
        reported = self._reported()
        for name in COUNTERS:
            family = CounterMetricFamily(f"conveyor_jobs_{name}", f"Jobs {name}",
                                         labels=["queue", "task"])
            for (queue, task), part in reported.items():
                family.add_metric([queue, task], part.counters.get(name, 0))
            yield family

    def _histograms(self) -> Iterator[Metric]:
        reported = self._reported()
        for kind in ("wait", "run"):
            family = HistogramMetricFamily(
                f"conveyor_job_{kind}_seconds",
                "Seconds jobs waited before they started" if kind == "wait"
                else "Seconds jobs ran", labels=["queue", "task"])
            for (queue, task), part in reported.items():
                hist = part.wait if kind == "wait" else part.run
                counts = hist.cumulative(EDGES)
                buckets = [(_le(e), float(c)) for e, c in zip(EDGES, counts, strict=True)]
                buckets.append(("+Inf", float(hist.count)))
                family.add_metric([queue, task], buckets, sum_value=hist.total)
            yield family


def _le(edge: float) -> str:
    return repr(edge)


def _number(value: float) -> Any:
    """Counters and bins are integers; sums stay floats (as parse_bucket expects text)."""
    return str(int(value)) if value == int(value) else repr(value)


def serve(app: Conveyor, port: int, addr: str = "0.0.0.0",
          queues: list[str] | None = None, shards: bool = False) -> Any:
    """Start the HTTP exporter in a background thread; returns (server, thread)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    registry.register(RedisCollector(app, queues, shards=shards))
    return start_http_server(port, addr, registry=registry)
