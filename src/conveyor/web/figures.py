"""The dashboard's figures: stats, series and advice from the monitor, shaped for JSON.

Every figure that cannot be had is ``None``, which the pages show as "n/a".
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from ..clock import server_now
from . import queries, series

if TYPE_CHECKING:
    from ..app import Conveyor

log = logging.getLogger("conveyor.web")
SPARK_WINDOW = 600  # seconds of history in the overview's sparklines
DURATION_FIELDS = ("mean", "p50", "p95", "p99")


def _plain(value: Any) -> Any:
    """Any stats-like object (dataclass, msgspec Struct, namedtuple, dict) as plain data."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple) and not hasattr(value, "_fields"):
        return [_plain(v) for v in value]
    names = getattr(value, "__struct_fields__", None) or getattr(value, "_fields", None)
    if names is None and hasattr(value, "__dataclass_fields__"):
        names = list(value.__dataclass_fields__)
    if names is None:
        names = [n for n in vars(value) if not n.startswith("_")] if hasattr(value, "__dict__") \
            else []
    return {n: _plain(getattr(value, n)) for n in names}


def advice_plain(given: Any) -> dict[str, Any]:
    """An :class:`~conveyor.monitor.Advice` as plain data (infinity as null)."""
    out = dict(_plain(given))
    out.setdefault("reasons", [])
    eta = out.get("eta_seconds")
    if isinstance(eta, float) and math.isinf(eta):  # JSON has no infinity
        out["eta_seconds"], out["never_drains"] = None, True
    return out


def advice(app: Conveyor, queue: str, target_wait: float = 10) -> dict[str, Any] | None:
    """``app.monitor.advice(queue)`` as plain data, or None when it fails."""
    try:
        return advice_plain(app.monitor.advice(queue=queue, target_wait=target_wait))
    except Exception:  # a figure failing must not take the page down
        log.exception("monitor.advice failed")
        return None


def overview(app: Conveyor) -> dict[str, Any]:
    """Every known queue with backlog, throughput, wait p95, sparklines and advice, from
    one :meth:`~conveyor.monitor.Monitor.overview` (three round trips)."""
    seen = app.monitor.overview(SPARK_WINDOW, 60)
    rows: list[dict[str, Any]] = []
    for q in seen.queues:
        b, spark = q.backlog, series.chart(q.spark)
        rows.append({"name": q.name, "ready": b.ready, "scheduled": b.scheduled,
                     "active": b.active, "suspended": b.suspended, "dead": b.dead,
                     "paused": q.paused,
                     "throughput": q.stats.throughput, "wait_p95": q.stats.wait.p95,
                     "advice": advice_plain(q.advice),
                     "spark": {"t": spark["t"], "processed": spark["processed"],
                               "wait_p95": spark["wait_p95"], "read": q.spark_read}})
    return {"time": seen.now, "queues": rows,
            "tasks": queries.activity_rows(seen.tasks, seen.now),
            "totals": {k: sum(r[k] for r in rows) for k in ("ready", "scheduled", "active",
                                                            "suspended", "dead")}
            | {"throughput": sum(r["throughput"] for r in rows)},
            "workers": {"count": len(seen.workers),
                        "capacity": sum(w.concurrency for w in seen.workers)}}


def queue_detail(app: Conveyor, queue: str, window: float) -> dict[str, Any]:
    """One queue: backlog, stats over ``window``, per-priority and per-tenant backlog."""
    stats = app.monitor.stats(queue=queue, window=window)
    shards = queries.shards(app, queue)
    return {"name": queue, "time": stats.now, "window": window,
            "backlog": queries.backlog(app, [queue])[queue], "stats": series.summary(stats),
            "advice": advice(app, queue), "flow": flow(app, queue),
            **queries.tenants(app, queue), **({"shards": shards} if shards else {})}


def flow(app: Conveyor, queue: str, tenants: int = 50) -> dict[str, Any]:
    """The queue's limits and what they hold back (the largest held tenants)."""
    state = app.monitor.flow(queue)
    lim = state.limits
    largest = sorted(state.held_by_tenant.items(), key=lambda i: -i[1])[:tenants]
    return {"limits": {"concurrency": lim.concurrency, "rate": lim.rate,
                       "tenant_concurrency": lim.tenant_concurrency,
                       "tenant_rate": lim.tenant_rate,
                       "tenants": {t: {"concurrency": v.concurrency, "rate": v.rate}
                                   for t, v in list(lim.tenants.items())[:tenants]}},
            "paused": state.paused, "running": state.running, "held": state.held,
            "blocked_by": state.blocked_by,
            "held_tenants": [{"tenant": t, "held": n,
                              "running": state.running_by_tenant.get(t, 0)} for t, n in largest]}


def queue_series(app: Conveyor, queue: str, window: float) -> dict[str, Any]:
    """Chart series of one queue over ``window`` seconds."""
    return series.chart(app.monitor.series(queue, window))


def task_types(app: Conveyor, window: float) -> list[dict[str, Any]]:
    """Every task type the app registers or the buckets mention, with activity and stats
    (one read of the buckets and one of the activity for all of them)."""
    now = server_now(app.redis)
    by_task = {(s.queue, s.task): s for s in app.monitor.stats_by_task(window=window)}
    activity = {(a.queue, a.task): a for a in app.monitor.activity()}
    seen: dict[str, str] = {name: t.queue for name, t in app.tasks.items()}
    for queue, task in by_task:
        seen.setdefault(task or "", queue or "")
    rows = []
    for task, queue in sorted(seen.items()):
        known = app.tasks.get(task)
        threshold = known.idle_threshold if known else 300.0
        stats = by_task.get((queue, task)) or app.monitor.stats(task=task, queue=queue,
                                                                window=window)
        act = activity.get((queue, task))
        since = act.idle_since if act is not None else None
        rows.append({"name": task, "queue": queue, "active": act.active if act else 0,
                     "idle_since": since, "idle_for": None if since is None else now - since,
                     "idle": act.idle if act is not None else True, "threshold": threshold,
                     "registered": known is not None, **series.summary(stats)})
    return rows
