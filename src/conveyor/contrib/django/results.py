"""Django ``TaskResult``s read from conveyor's job records.

Every field comes from what Redis stores (times from the server's clock, in
milliseconds), so a result built right after the enqueue equals the one ``get_result``
reads back, and ``refresh()`` of an untouched result changes nothing.

Worker ids: a job's record keeps the id of the worker that last leased it (field ``w``),
never a list. So ``worker_ids[-1]`` is the worker that runs (or ran) the latest attempt;
the workers of earlier attempts are not recorded and show as ``""``, one per attempt, so
that ``attempts`` (the length of the list) stays the number of runs started.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ...job import JobInfo, JobState
from ...record import ARGS, HOLDER
from .api import TaskError, TaskResult, TaskResultStatus

__all__ = ["META_PRIORITY", "META_RUN_AFTER", "STATUS", "django_meta", "error_of",
           "make_result", "ordered", "payload", "result_of_record", "task_of_meta", "utc_of",
           "worker_ids"]

# Meta entries each job carries: the Django task's own priority and run_after, which
# conveyor's record keeps only folded (0-9) and in milliseconds.
META_PRIORITY = "django.priority"
META_RUN_AFTER = "django.run_after"

_ACCEPTED = frozenset(f.name for f in dataclasses.fields(TaskResult) if f.init)
STATUS = {
    JobState.SCHEDULED: "READY", JobState.READY: "READY", JobState.RETRYING: "READY",
    JobState.ACTIVE: "RUNNING", JobState.SUCCEEDED: "SUCCESSFUL", JobState.DEAD: "FAILED",
    JobState.CANCELLED: "FAILED",
}


def utc_of(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC)


def django_meta(task: Any) -> dict[str, str]:
    """The meta entries that let a reader rebuild ``task`` exactly."""
    meta = {META_PRIORITY: str(task.priority)}
    if task.run_after is not None:
        meta[META_RUN_AFTER] = task.run_after.isoformat()
    return meta


def task_of_meta(task: Any, backend: str, queue: str, meta: Mapping[str, str]) -> Any:
    """``task`` with the backend, priority, queue and run_after its job was enqueued
    with."""
    changes: dict[str, Any] = {"queue_name": queue, "backend": backend}
    if META_PRIORITY in meta:
        changes["priority"] = int(meta[META_PRIORITY])
    if META_RUN_AFTER in meta:
        changes["run_after"] = datetime.fromisoformat(meta[META_RUN_AFTER])
    return task.using(**changes)


def error_of(text: str | None) -> Any:
    """A Django ``TaskError`` from the error conveyor stored: its first line is
    ``Type: message``, its last the traceback's ``module.Type: message``."""
    text = text or ""
    lines = [line for line in text.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    name = last.split(":", 1)[0].strip() if ":" in last else ""
    if not name or " " in name:
        name = (lines[0].split(":", 1)[0].strip() if lines else "") or "Exception"
    path = name if "." in name else f"builtins.{name}"
    return TaskError(exception_class_path=path, traceback=text)


def make_result(task: Any, job_id: str, args: Any, kwargs: Any, backend: str,
                status: str = "READY", **fields: Any) -> Any:
    """A ``TaskResult``; building it checks that the arguments are what Django accepts
    (JSON values), raising ``TypeError`` or ``ValueError`` otherwise."""
    values: dict[str, Any] = {
        "task": task, "id": job_id, "status": TaskResultStatus[status], "enqueued_at": None,
        "started_at": None, "finished_at": None, "last_attempted_at": None, "args": args,
        "kwargs": kwargs, "backend": backend, "errors": [], "worker_ids": []}
    values.update(fields)
    return TaskResult(**{k: v for k, v in values.items() if k in _ACCEPTED})


def worker_ids(info: JobInfo, record: Mapping[bytes, bytes]) -> list[str]:
    if info.attempts <= 0:
        return []
    latest = record.get(HOLDER.encode(), b"").decode(errors="replace")
    return [""] * (info.attempts - 1) + [latest]


def result_of_record(task: Any, info: JobInfo, record: Mapping[bytes, bytes],
                     arguments: tuple[list[Any], dict[str, Any]], backend: str) -> Any:
    """The result of the job ``info`` describes, ``record`` being its raw hash."""
    status = STATUS[info.state]
    errors = [error_of(info.error or info.state.value)] if status == "FAILED" else []
    enqueued, started, finished = ordered(info.enqueued_at, info.started_at, info.finished_at)
    result = make_result(task, info.id, arguments[0], arguments[1], backend, status,
                         enqueued_at=utc_of(enqueued), started_at=utc_of(started),
                         last_attempted_at=utc_of(started), finished_at=utc_of(finished),
                         errors=errors, worker_ids=worker_ids(info, record))
    if status == "SUCCESSFUL":
        object.__setattr__(result, "_return_value", info.result)
    return result


def ordered(*times: float | None) -> list[float | None]:
    """``times`` (enqueued, started, finished) made never to go back, as Django's results
    promise. The record's enqueue and finish stamps are the server's ``TIME``; the start
    is the worker's reckoning of the server's clock (its offset, taken from fetch replies,
    plus its own monotonic clock), which a short run can put a millisecond past the
    finish."""
    latest: float | None = None
    kept: list[float | None] = []
    for stamp in times:
        if stamp is not None and latest is not None:
            stamp = max(stamp, latest)
        latest = stamp if stamp is not None else latest
        kept.append(stamp)
    return kept


def payload(record: Mapping[bytes, bytes]) -> bytes:
    return record.get(ARGS.encode(), b"")
