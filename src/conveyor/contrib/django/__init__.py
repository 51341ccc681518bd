"""A Django Tasks backend: ``django.tasks``' ``@task(...).enqueue(...)`` through conveyor.

settings.py::

    INSTALLED_APPS = [..., "conveyor.contrib.django"]     # for `manage.py conveyor_worker`
    TASKS = {"default": {
        "BACKEND": "conveyor.contrib.django.ConveyorBackend",
        "QUEUES": ["default", "emails"],                   # optional; default ["default"]
        "OPTIONS": {"url": "redis://127.0.0.1:6379/0"},
    }}

then ``python manage.py conveyor_worker [-q QUEUE ...] [-c N]`` runs the jobs.

Django 6 ships ``django.tasks`` (Python 3.12 and later); on older Djangos the
``django-tasks`` package provides the same API, and this backend uses whichever is there.

How Django's task settings map onto conveyor:

- ``priority`` (-100 to 100, default 0) onto conveyor's 0-9 (default 5): 0 is 5, positive
  priorities 6-9, negative ones 0-4, order kept;
- ``run_after`` onto ``at=``; ``queue_name`` onto the conveyor queue;
- a result's id is the conveyor job id, so ``get_result`` (and ``conveyor job ID``) work
  from any process; states map as scheduled/ready/retrying -> READY, active -> RUNNING,
  succeeded -> SUCCESSFUL, dead/cancelled -> FAILED;
- each Django task is a conveyor task named by its module path, so the dashboard, stats
  and dead letters show it by name;
- an enqueue goes through :mod:`conveyor.producer` like a conveyor task's, enqueue hooks
  included: ``conveyor.contrib.otel.instrument(task.get_backend().app)`` traces it.

``OPTIONS``: ``url``, ``namespace`` (default ``"conveyor"``), ``retries`` (runs after a
failed first one before FAILED; default 0, as Django expects), ``backoff`` (base seconds
of the retry delay, default 1.0), ``timeout``,
``visibility_timeout``, and ``enqueue_on_commit`` (default ``False``): when true, an
enqueue inside ``transaction.atomic()`` is stored only once the transaction commits (and
never if it rolls back); the result returned at once already has the job's id.
"""

from __future__ import annotations

import contextvars
import dataclasses
import importlib
import math
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from functools import partial
from typing import Any

from django.db import close_old_connections, transaction
from django.utils.module_loading import import_string

from ... import producer
from ...app import Conveyor
from ...errors import JobNotFound
from ...hooks import Attempt, Hook
from ...job import JobInfo, JobState
from ...record import ARGS
from ...task import Task


def _api() -> tuple[Any, Any, Any]:
    """(tasks module, backends.base module, exceptions module) of ``django.tasks``, else
    of the ``django_tasks`` backport."""
    for name in ("django.tasks", "django_tasks"):
        try:
            return (importlib.import_module(name),
                    importlib.import_module(f"{name}.backends.base"),
                    importlib.import_module(f"{name}.exceptions"))
        except ImportError:
            continue
    raise ImportError("conveyor.contrib.django needs Django 6 (django.tasks) or the"
                      " django-tasks package: pip install 'conveyor[django]'")


tasks_api, backends_base, exceptions = _api()
BaseTaskBackend: Any = backends_base.BaseTaskBackend
_base = importlib.import_module(f"{tasks_api.__name__}.base")
DjangoTask: Any = _base.Task
TaskResult: Any = _base.TaskResult
TaskResultStatus: Any = _base.TaskResultStatus
TaskError: Any = _base.TaskError
TaskContext: Any = _base.TaskContext

__all__ = ["ConveyorBackend", "to_conveyor_priority"]

_STATUS = {
    JobState.SCHEDULED: "READY", JobState.READY: "READY", JobState.RETRYING: "READY",
    JobState.ACTIVE: "RUNNING", JobState.SUCCEEDED: "SUCCESSFUL", JobState.DEAD: "FAILED",
    JobState.CANCELLED: "FAILED",
}
_attempt: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar(
    "conveyor_django_attempt", default=None)


def to_conveyor_priority(priority: int) -> int:
    """Django's -100..100 (default 0) onto conveyor's 0..9 (default 5), order kept."""
    if priority == 0:
        return 5
    if priority > 0:
        return min(9, 5 + math.ceil(min(priority, 100) * 4 / 100))
    return max(0, 5 - math.ceil(min(-priority, 100) * 5 / 100))


def _when(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC)


def _error(text: str | None) -> Any:
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


class _Attempts(Hook):
    """Makes the running job's attempt visible to the task (for ``takes_context``)."""

    @contextmanager
    def _run(self, attempt: Attempt) -> Iterator[None]:
        token = _attempt.set(attempt)
        try:
            yield
        finally:
            _attempt.reset(token)

    def run(self, task: Task[Any, Any], attempt: Attempt) -> AbstractContextManager[None]:
        return self._run(attempt)


class ConveyorBackend(BaseTaskBackend):  # type: ignore[misc]
    """Stores Django tasks as conveyor jobs; ``manage.py conveyor_worker`` runs them."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options = {k.lower(): v for k, v in self.options.items()}
        self.app = Conveyor(options.get("url"), namespace=options.get("namespace", "conveyor"))
        self.app.hooks.append(_Attempts())
        self.retries = int(options.get("retries", 0))
        self.backoff = float(options.get("backoff", 1.0))
        self.timeout = options.get("timeout")
        self.visibility_timeout = float(options.get("visibility_timeout", 30.0))
        self.on_commit = bool(options.get("enqueue_on_commit", False))
        self.app.tasks = _DjangoTasks(self)

    # -- the conveyor side -----------------------------------------------------------------

    def conveyor_task(self, module_path: str) -> Task[Any, Any] | None:
        """The conveyor task that runs the Django task at ``module_path`` (made on first
        use); None when that path names no Django task of this backend."""
        known: Task[Any, Any] | None = dict.get(self.app.tasks, module_path)
        if known is not None:
            return known
        django_task = self._resolve(module_path)
        if django_task is None:
            return None

        def run(*args: Any, **kwargs: Any) -> Any:
            return self._call(module_path, list(args), kwargs)

        run.__module__, run.__qualname__ = __name__, module_path
        task: Task[Any, Any] = Task(self.app, run, name=module_path, queue=django_task.queue_name,
                    retries=self.retries, backoff=self.backoff, timeout=self.timeout,
                    visibility_timeout=self.visibility_timeout, idle_threshold=300.0)
        dict.__setitem__(self.app.tasks, module_path, task)
        return task

    def _resolve(self, module_path: str) -> Any:
        """The Django task object at ``module_path``, or None. Only module paths under an
        installed app or the settings' package are imported: a job's task name comes from
        Redis, and must not be able to import arbitrary modules."""
        from django.apps import apps
        from django.conf import settings

        roots = {config.name.split(".")[0] for config in apps.get_app_configs()}
        roots.add(str(getattr(settings, "SETTINGS_MODULE", "") or "").split(".")[0])
        if module_path.split(".")[0] not in roots - {""}:
            return None
        try:
            found = import_string(module_path)
        except ImportError:
            return None
        return found if isinstance(found, DjangoTask) and found.backend == self.alias else None

    def _call(self, module_path: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        django_task = self._resolve(module_path)
        if django_task is None:  # resolved when the job was fetched: cannot happen
            raise LookupError(f"no Django task at {module_path!r}")
        close_old_connections()  # as Django does around a request
        try:
            if django_task.takes_context:
                attempt = _attempt.get()
                job_id = attempt.job_id if attempt else ""
                result = self._result(django_task, job_id, args, kwargs, "RUNNING",
                                      attempts=attempt.attempt if attempt else 1)
                return django_task.call(TaskContext(task_result=result), *args, **kwargs)
            return django_task.call(*args, **kwargs)
        finally:
            close_old_connections()

    # -- the Django side -------------------------------------------------------------------

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        self.validate_task(task)
        conveyor_task = self.conveyor_task(task.module_path)
        if conveyor_task is None:
            raise exceptions.InvalidTaskError(
                f"{task.module_path} is not importable from an installed app")
        queued = conveyor_task.options(priority=to_conveyor_priority(task.priority),
                                       at=self._run_after(task.run_after))
        if queued.queue != task.queue_name:
            queued.queue = task.queue_name
        args, kwargs = list(args), dict(kwargs)
        arguments = [(tuple(args), kwargs)]
        if self.on_commit and not transaction.get_autocommit():
            # Planned (encoded) now, so an argument that cannot be fails here; stored, and
            # its enqueue hooks run, once the transaction commits.
            planned = producer.plan(queued, arguments)
            transaction.on_commit(partial(producer.store, planned))
            [job_id] = planned.job_ids
        else:
            [job] = producer.enqueue(queued, arguments)
            job_id = job.id
        return self._result(task, job_id, args, kwargs, "READY", enqueued_at=datetime.now(UTC))

    @staticmethod
    def _run_after(run_after: datetime | None) -> datetime | None:
        if run_after is None or run_after.tzinfo is not None:
            return run_after
        from django.utils import timezone

        aware: datetime = timezone.make_aware(run_after)
        return aware

    def get_result(self, result_id: str) -> Any:
        try:
            job = self.app.job(result_id)
            record = self.app.redis.hgetall(self.app.keys(job.queue).job(job.short_id))
            info = JobInfo.from_record(self.app, job.queue, job.short_id, record)
        except (ValueError, JobNotFound):
            raise exceptions.TaskResultDoesNotExist(result_id) from None
        django_task = self._resolve(info.task) if record else None
        if django_task is None:
            raise exceptions.TaskResultDoesNotExist(result_id)
        try:
            args, kwargs = self.app.codec.decode_args(record.get(ARGS.encode(), b""))
        except Exception:
            args, kwargs = [], {}
        return self._from_info(django_task, info, args, kwargs)

    def _from_info(self, task: Any, info: JobInfo, args: list[Any], kwargs: dict[str, Any]
                   ) -> Any:
        status = _STATUS[info.state]
        errors = [_error(info.error or info.state.value)] if status == "FAILED" else []
        result = self._result(task, info.id, args, kwargs, status, attempts=info.attempts,
                              enqueued_at=_when(info.enqueued_at),
                              started_at=_when(info.started_at),
                              finished_at=_when(info.finished_at), errors=errors)
        if status == "SUCCESSFUL":
            object.__setattr__(result, "_return_value", info.result)
        return result

    def _result(self, task: Any, job_id: str, args: list[Any], kwargs: dict[str, Any],
                status: str, attempts: int = 0, **times: Any) -> Any:
        values: dict[str, Any] = {
            "task": task, "id": job_id, "status": TaskResultStatus[status],
            "enqueued_at": None, "started_at": None, "finished_at": None,
            "last_attempted_at": times.get("started_at"), "args": args, "kwargs": kwargs,
            "backend": self.alias, "errors": [], "worker_ids": ["conveyor"] * attempts,
        }
        values.update(times)
        accepted = {f.name for f in dataclasses.fields(TaskResult) if f.init}
        return TaskResult(**{k: v for k, v in values.items() if k in accepted})


class _DjangoTasks(dict[str, Task[Any, Any]]):
    """The backend app's task registry: a job's task name (a Django task's module path)
    is resolved on first sight, so a worker runs every task of the project without a list
    of them."""

    def __init__(self, backend: ConveyorBackend) -> None:
        super().__init__()
        self._backend = backend

    def get(self, name: str, default: Any = None) -> Any:
        task = self._backend.conveyor_task(name)
        return default if task is None else task

    def __getitem__(self, name: str) -> Task[Any, Any]:
        task = self._backend.conveyor_task(name)
        if task is None:
            raise KeyError(name)
        return task
