"""What the dashboard reads from Redis, as plain dicts ready for JSON or a template.

Every function here only reads. Lists are bounded (paging, tenant caps) so a page costs
the same with ten tenants or a hundred thousand.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import untrusted
from ..errors import EncodingError
from ..fleet import published
from ..job import JobInfo
from ..monitor.lists import JOB_LISTS, read_schedules
from ..record import ARGS
from ..worker import registry

if TYPE_CHECKING:
    from ..app import Conveyor

MAX_TENANTS = 25  # tenants shown per priority level
TOP_TENANTS = 10
LISTS = JOB_LISTS


def _text(value: Any) -> str:
    return untrusted.text(value) or ""


def backlog(app: Conveyor, queues: list[str]) -> dict[str, dict[str, Any]]:
    """Ready, scheduled, active and dead jobs and the paused flag of each queue."""
    with app.redis.pipeline(transaction=False) as pipe:
        for queue in queues:
            k = app.keys(queue)
            pipe.hget(k.counts, "ready").zcard(k.delayed).zcard(k.leases).zcard(k.dead)
            pipe.exists(k.paused)
        replies = pipe.execute()
    out = {}
    for i, queue in enumerate(queues):
        ready, scheduled, active, dead, paused = replies[i * 5 : i * 5 + 5]
        out[queue] = {"ready": max(0, int(ready or 0)), "scheduled": int(scheduled),
                      "active": int(active), "dead": int(dead), "paused": bool(paused)}
    return out


def tenants(app: Conveyor, queue: str) -> dict[str, Any]:
    """Ready jobs per priority level and per tenant (capped), and the top tenants."""
    seen = app.monitor.tenants(queue, MAX_TENANTS, TOP_TENANTS)
    priorities = [{"priority": level.priority,
                   "tenants": [{"tenant": t, "ready": n} for t, n in level.tenants],
                   "ready": level.ready, "tenant_count": level.tenant_count,
                   "hidden": level.hidden} for level in seen.levels]
    return {"priorities": priorities,
            "top_tenants": [{"tenant": t, "ready": n} for t, n in seen.top]}


def activity(app: Conveyor, queues: list[str], now: float) -> list[dict[str, Any]]:
    """Per task type: jobs running now, last finish, and whether it is idle."""
    with app.redis.pipeline(transaction=False) as pipe:
        for queue in queues:
            pipe.hgetall(app.keys(queue).active).hgetall(app.keys(queue).idle)
        replies = pipe.execute()
    active = {q: {_text(k): max(0, untrusted.integer(v)) for k, v in replies[2 * i].items()}
              for i, q in enumerate(queues)}
    idle = {q: {_text(k): t for k, v in replies[2 * i + 1].items()
                if (t := untrusted.number(v)) is not None} for i, q in enumerate(queues)}
    return activity_rows(app, queues, active, idle, now)


def activity_rows(app: Conveyor, queues: list[str], active: dict[str, dict[str, int]],
                  idle: dict[str, dict[str, float]], now: float) -> list[dict[str, Any]]:
    """Activity rows from jobs running and last finishes per queue and task type."""
    rows = []
    for queue in queues:
        running_of, idle_of = active.get(queue, {}), idle.get(queue, {})
        names = set(running_of) | set(idle_of)
        names |= {t.name for t in app.tasks.values() if t.queue == queue}
        for name in sorted(names):
            known = app.tasks.get(name)
            threshold = known.idle_threshold if known else 300.0
            since = idle_of.get(name)
            running = running_of.get(name, 0)
            rows.append({"name": name, "queue": queue, "active": running, "idle_since": since,
                         "idle_for": None if since is None else max(0.0, now - since),
                         "threshold": threshold,
                         "idle": running == 0 and (since is None or now - since >= threshold)})
    return rows


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
    job = app.job(job_id)
    info = job.info()
    out = info_dict(info)
    raw, workflow = app.redis.hmget(app.keys(job.queue).job(job.short_id), ARGS, "wf")
    out["workflow"] = workflow.decode(errors="replace") if workflow else None
    try:
        args, kwargs = app.codec.decode_args(raw or b"")
        out["args"], out["kwargs"] = args, kwargs
    except EncodingError as exc:
        out["args"], out["kwargs"] = f"<undecodable arguments: {exc}>", {}
    return out


def workers(app: Conveyor, now: float) -> list[dict[str, Any]]:
    """Live workers of the registry (:func:`~conveyor.worker.registry.live_workers` decides
    which), most recent heartbeat first."""
    rows = []
    for w in sorted(registry.live_workers(app, now=now), key=lambda w: -w.last_seen):
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
    for sup in published.live_supervisors(app, decisions=decisions):
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
            for r in read_schedules(app, now)]


WORKFLOW_GROUPS = ("active", "retrying", "ready", "scheduled", "dead", "cancelled", "succeeded")


def workflow_detail(app: Conveyor, workflow_id: str) -> dict[str, Any]:
    """A workflow with its nodes, and the nodes grouped by state (most urgent first).

    :raises JobNotFound: no such workflow (or its record expired)
    :raises ValueError: not a workflow id
    """
    info = app.workflow_handle(workflow_id).info()
    nodes = []
    for name, job in info.nodes.items():
        row = info_dict(job)
        row["name"], row["after"] = name, list(info.after.get(name, ()))
        nodes.append(row)
    groups = [{"state": s, "nodes": [n for n in nodes if n["state"] == s]}
              for s in WORKFLOW_GROUPS]
    return {"id": info.id, "state": info.state, "counts": info.counts, "nodes": nodes,
            "groups": [g for g in groups if g["nodes"]]}
