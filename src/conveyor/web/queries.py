"""What the dashboard shows, as plain dicts ready for JSON or a template.

Every figure comes from :class:`~conveyor.monitor.Monitor`, which does the reading; this
module only shapes it. Lists are bounded (paging, tenant caps) so a page costs the same
with ten tenants or a hundred thousand.
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING, Any

from ..job import JobInfo
from ..monitor import TaskActivity
from ..monitor.lists import JOB_LISTS
from ..monitor.shown import result_hidden
from ..sharding import is_shard

if TYPE_CHECKING:
    from ..app import Conveyor

MAX_TENANTS = 25  # tenants shown per priority level
TOP_TENANTS = 10
LISTS = JOB_LISTS


def backlog(app: Conveyor, queues: list[str]) -> dict[str, dict[str, Any]]:
    """Ready, scheduled, active, suspended and dead jobs and the paused flag of each
    queue."""
    return {q: {"ready": s.backlog.ready, "scheduled": s.backlog.scheduled,
                "active": s.backlog.active, "suspended": s.backlog.suspended,
                "dead": s.backlog.dead, "paused": s.paused}
            for q, s in app.monitor.queue_states(queues).items()}


def shards(app: Conveyor, queue: str) -> list[dict[str, Any]]:
    """Each shard of a sharded queue with its figures (empty for a queue on one shard, and
    for a shard's own name)."""
    if is_shard(queue) or len(app.queue(queue).served()) < 2:
        return []
    return [{"name": s.name, "state": "retired" if s.retired else "active",
             "ready": s.backlog.ready, "scheduled": s.backlog.scheduled,
             "active": s.backlog.active, "dead": s.backlog.dead, "running": s.running,
             "share": s.share, "rate": s.rate, "throughput": s.throughput,
             "wait_p95": s.wait_p95, "node": s.node}
            for s in app.monitor.shard_states(queue)]


def tenants(app: Conveyor, queue: str) -> dict[str, Any]:
    """Ready jobs per priority level and per tenant (capped), and the top tenants."""
    seen = app.monitor.tenants(queue, MAX_TENANTS, TOP_TENANTS)
    priorities = [{"priority": level.priority,
                   "tenants": [{"tenant": t, "ready": n} for t, n in level.tenants],
                   "ready": level.ready, "tenant_count": level.tenant_count,
                   "hidden": level.hidden} for level in seen.levels]
    return {"priorities": priorities, "incoming": seen.incoming,
            "top_tenants": [{"tenant": t, "ready": n} for t, n in seen.top]}


def activity_rows(tasks: list[TaskActivity], now: float) -> list[dict[str, Any]]:
    """Activity rows (jobs running, last finish, idle or not) of the monitor's figures."""
    return [{"name": a.task, "queue": a.queue, "active": a.active, "idle_since": a.idle_since,
             "idle_for": None if a.idle_since is None else max(0.0, now - a.idle_since),
             "threshold": a.threshold, "idle": a.idle} for a in tasks]


def info_dict(info: JobInfo) -> dict[str, Any]:
    """A job record as JSON-ready values (the result is kept as decoded)."""
    out = {name: getattr(info, name) for name in info.__dataclass_fields__}
    out["state"] = info.state.value
    return out


def list_jobs(app: Conveyor, queue: str, state: str, offset: int = 0,
              limit: int = 50) -> dict[str, Any]:
    """One page of the scheduled (soonest first), active or dead (newest first) jobs.

    :raises KeyError: ``state`` is not scheduled, active or dead
    """
    page = app.monitor.jobs(queue, state, offset, limit)
    jobs = []
    for info, due in page.jobs:
        row = info_dict(info)
        row["due"] = due  # run time, lease deadline or death, epoch s
        jobs.append(row)
    return {"queue": queue, "state": state, "total": page.total, "offset": offset,
            "limit": limit, "jobs": jobs}


def job_detail(app: Conveyor, job_id: str) -> dict[str, Any]:
    """A job's record with its decoded arguments.

    :raises JobNotFound: no such job (or its record expired)
    :raises ValueError: not a job id
    """
    detail = app.monitor.job_detail(job_id)
    out = info_dict(detail.info)
    out["workflow"], out["args"], out["kwargs"] = detail.workflow, detail.args, detail.kwargs
    out["waiting_signal"] = _signal_name(detail.info.waiting_for)
    out["running_for"] = detail.running_for
    return out


def _signal_name(waiting_for: str | None) -> str | None:
    """The name of the signal a job waits for (``JobInfo.waiting_for`` is
    ``"signal 'name' ..."``), to fill the dashboard's signal form in."""
    found = re.match(r"signal ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")", waiting_for or "")
    if found is None:
        return None
    try:
        name = ast.literal_eval(found.group(1))
    except (ValueError, SyntaxError):
        return None
    return name if isinstance(name, str) else None


def workers(app: Conveyor, now: float) -> list[dict[str, Any]]:
    """Live workers of the registry (:func:`~conveyor.worker.registry.live_workers` decides
    which), most recent heartbeat first."""
    rows = []
    for w in sorted(app.monitor.workers(now), key=lambda w: -w.last_seen):
        fields = {"host": w.host, "pid": str(w.pid), "queues": ",".join(w.queues),
                  "concurrency": str(w.concurrency), "jobs": str(w.jobs),
                  "processed": str(w.processed)}
        if w.started_at is not None:
            fields["started_at"] = f"{w.started_at:.3f}"
        if w.supervisor:
            fields["supervisor"] = w.supervisor
        rows.append({"id": w.id, "last_seen": w.last_seen,
                     "age": max(0.0, now - w.last_seen), "host": w.host, "pid": w.pid,
                     "queues": ", ".join(w.queues), "concurrency": w.concurrency,
                     "jobs": w.jobs, "processed": w.processed, "started_at": w.started_at,
                     "supervisor": w.supervisor, "fields": fields})
    return rows


def _figure(raw: str | None) -> float | None:
    """A published number, None when absent or not a number."""
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


def _decision(entry: dict[str, Any]) -> dict[str, Any]:
    """One published decision with its fields checked: time, kind, from -> to, text."""
    def count(name: str) -> int | None:
        value = entry.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    at = entry.get("at")
    return {"at": float(at) if isinstance(at, int | float) else None,
            "kind": str(entry.get("kind", "")), "from": count("before"), "to": count("after"),
            "text": str(entry.get("text", ""))}


def supervisors(app: Conveyor, now: float, decisions: int = 10) -> list[dict[str, Any]]:
    """Live supervisors as they last published themselves, with their latest decisions
    (newest first), oldest heartbeat first."""
    rows = []
    for sup in app.monitor.supervisors(decisions):
        f = sup.fields
        row: dict[str, Any] = {
            "id": sup.id, "last_seen": sup.heartbeat, "age": max(0.0, now - sup.heartbeat),
            "host": f.get("host", ""), "pid": f.get("pid", ""),
            "queues": ", ".join(q for q in f.get("queues", "").split(",") if q),
            "fields": f,
            "decisions": [_decision(d) for d in sup.decisions if isinstance(d, dict)],
        }
        for name in ("concurrency", "children", "active", "target", "min", "max",
                     "target_wait", "ready", "rate", "p95_wait", "processed", "started_at"):
            row[name] = _figure(f.get(name))
        rows.append(row)
    return rows


def schedules(app: Conveyor, now: float) -> list[dict[str, Any]]:
    """Periodic jobs with their cron, next fire (UTC) and last fired tick when recorded."""
    return [{"task": r.task, "queue": r.queue, "cron": r.cron, "next": r.next, "last": r.last}
            for r in app.monitor.schedules(now)]


WORKFLOW_GROUPS = ("active", "retrying", "ready", "scheduled", "dead", "cancelled", "succeeded")


def workflow_detail(app: Conveyor, workflow_id: str) -> dict[str, Any]:
    """A workflow with its nodes, and the nodes grouped by state (most urgent first).

    :raises JobNotFound: no such workflow (or its record expired)
    :raises ValueError: not a workflow id
    """
    info = app.workflow_handle(workflow_id).info()
    nodes = []
    for name, job in info.nodes.items():
        row = info_dict(result_hidden(app, job))  # an encrypted node's shows [encrypted]
        row["name"], row["after"] = name, list(info.after.get(name, ()))
        nodes.append(row)
    groups = [{"state": s, "nodes": [n for n in nodes if n["state"] == s]}
              for s in WORKFLOW_GROUPS]
    return {"id": info.id, "state": info.state, "counts": info.counts, "nodes": nodes,
            "groups": [g for g in groups if g["nodes"]]}
