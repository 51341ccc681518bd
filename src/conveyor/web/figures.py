"""The dashboard's figures: stats and advice from the monitor when it offers them,
otherwise computed here from the metric buckets (see :mod:`.series`).

Every figure that cannot be had is ``None``, which the pages show as "n/a".
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from .. import untrusted
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


def monitor_stats(app: Conveyor, *, task: str | None = None, queue: str | None = None,
                  window: float = 300) -> dict[str, Any] | None:
    """``app.monitor.stats(...)`` as plain data, or None where the monitor has none."""
    stats = getattr(app.monitor, "stats", None)
    if stats is None:
        return None
    try:
        return dict(_plain(stats(task=task, queue=queue, window=window)))
    except Exception:  # a figure failing must not take the page down
        log.exception("monitor.stats failed")
        return None


def advice(app: Conveyor, queue: str, target_wait: float = 10) -> dict[str, Any] | None:
    """``app.monitor.advice(queue)`` as plain data, or None where the monitor has none."""
    advise = getattr(app.monitor, "advice", None)
    if advise is None:
        return None
    try:
        out = dict(_plain(advise(queue=queue, target_wait=target_wait)))
    except Exception:
        log.exception("monitor.advice failed")
        return None
    out.setdefault("reasons", [])
    eta = out.get("eta_seconds")
    if isinstance(eta, float) and math.isinf(eta):  # JSON has no infinity
        out["eta_seconds"], out["never_drains"] = None, True
    return out


def _with_monitor(own: dict[str, Any], theirs: dict[str, Any] | None) -> dict[str, Any]:
    """Prefer the monitor's figures where it gives them; keep ours for the rest."""
    if not theirs:
        return own
    merged = dict(own)
    for name, value in theirs.items():
        if name in ("wait", "run") and isinstance(value, dict):
            merged[name] = {f: value.get(f, own[name].get(f)) for f in DURATION_FIELDS}
        elif name != "backlog" and value is not None:
            merged[name] = value
    return merged


def overview(app: Conveyor) -> dict[str, Any]:
    """Every known queue with backlog, throughput, wait p95, sparklines and advice."""
    names = app.known_queues()
    now = series.server_time(app)
    backlogs = queries.backlog(app, names)
    starts, buckets = series.read_buckets(app, names, SPARK_WINDOW, now)
    width = app.limits.bucket_seconds
    rows = []
    for queue in names:
        recent = buckets[queue][-max(1, 60 // width):]  # the last minute
        own = series.summary(series.merge(recent), len(recent) * width)
        stats = _with_monitor(own, monitor_stats(app, queue=queue, window=60))
        spark = series.series(starts, buckets[queue], width, points=60)
        rows.append({"name": queue, **backlogs[queue], "throughput": stats["throughput"],
                     "wait_p95": stats["wait"]["p95"], "advice": advice(app, queue),
                     "spark": {"t": spark["t"], "processed": spark["processed"],
                               "wait_p95": spark["wait_p95"]}})
    live = queries.workers(app, now)
    return {"time": now, "queues": rows, "tasks": queries.activity(app, names, now),
            "totals": {k: sum(r[k] for r in rows) for k in ("ready", "scheduled", "active",
                                                            "dead")}
            | {"throughput": sum(r["throughput"] for r in rows)},
            "workers": {"count": len(live),
                        "capacity": sum(untrusted.integer(w.get("concurrency")) for w in live)}}


def queue_detail(app: Conveyor, queue: str, window: float) -> dict[str, Any]:
    """One queue: backlog, stats over ``window``, per-priority and per-tenant backlog."""
    now = series.server_time(app)
    _, buckets = series.read_buckets(app, [queue], window, now)
    own = series.summary(series.merge(buckets[queue]), window)
    stats = _with_monitor(own, monitor_stats(app, queue=queue, window=window))
    return {"name": queue, "time": now, "window": window,
            "backlog": queries.backlog(app, [queue])[queue], "stats": stats,
            "advice": advice(app, queue), "flow": flow(app, queue),
            **queries.tenants(app, queue)}


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
    starts, buckets = series.read_buckets(app, [queue], window)
    return series.series(starts, buckets[queue], app.limits.bucket_seconds)


def task_types(app: Conveyor, window: float) -> list[dict[str, Any]]:
    """Every task type the app registers or the buckets mention, with activity and stats."""
    names = app.known_queues()
    now = series.server_time(app)
    _, buckets = series.read_buckets(app, names, window, now)
    seen: dict[str, str] = {name: t.queue for name, t in app.tasks.items()}
    for queue in names:
        for bucket in buckets[queue]:
            for task in bucket:
                seen.setdefault(task, queue)
    rows = []
    for task, queue in sorted(seen.items()):
        known = app.tasks.get(task)
        threshold = known.idle_threshold if known else 300.0
        own = series.summary(series.merge(buckets.get(queue, []), task), window)
        stats = _with_monitor(own, monitor_stats(app, task=task, window=window))
        since = app.monitor.idle_since(task)
        rows.append({"name": task, "queue": queue, "active": app.monitor.active(task),
                     "idle_since": since, "idle_for": None if since is None else now - since,
                     "idle": app.monitor.is_idle(task), "threshold": threshold,
                     "registered": known is not None, **stats})
    return rows
