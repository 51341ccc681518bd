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

- ``priority`` (-100 to 100, default 0) folded onto conveyor's 0-9 (default 5), order
  kept (:mod:`.priority` has the table); the job carries the Django priority too, so a
  result reads it back as it was given;
- ``run_after`` onto ``at=``; ``queue_name`` onto the conveyor queue;
- a result's id is the conveyor job id, so ``get_result`` (and ``conveyor job ID``) work
  from any process; states map as scheduled/ready/retrying -> READY, active -> RUNNING,
  succeeded -> SUCCESSFUL, dead/cancelled -> FAILED; every field of a result is read from
  the job's record (:mod:`.results`);
- the signals ``task_enqueued`` (in the process that stores the job, at commit for
  ``enqueue_on_commit``), ``task_started`` and ``task_finished`` (in the worker, around
  each attempt) are sent as Django's own backends send them;
- each Django task is a conveyor task named by its module path, so the dashboard, stats
  and dead letters show it by name;
- an enqueue goes through :mod:`conveyor.producer` like a conveyor task's, enqueue hooks
  included: ``conveyor.contrib.otel.instrument(task.get_backend().app)`` traces it.

``OPTIONS``: ``url``, ``namespace`` (default ``"conveyor"``), ``retries`` (runs after a
failed first one before FAILED; default 0, as Django expects), ``backoff`` (base seconds
of the retry delay, default 1.0), ``timeout``,
``visibility_timeout``, and ``enqueue_on_commit`` (default ``False``): when true, an
enqueue inside ``transaction.atomic()`` is stored only once the transaction commits (and
never if it rolls back); the result returned at once already has the job's id, and its
``enqueued_at`` is None until the commit stores the job and fills it in.
"""

from __future__ import annotations

import contextvars
import traceback
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime
from typing import Any

from django.db import close_old_connections, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from ... import producer
from ...app import Conveyor
from ...errors import JobNotFound
from ...hooks import Attempt, Hook
from ...job import JobInfo
from ...record import ENQUEUED_MS
from ...task import Task
from . import results
from .api import (
    BaseTaskBackend,
    DjangoTask,
    InvalidTask,
    TaskContext,
    TaskError,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    signals,
    tasks_api,
)
from .priority import to_conveyor_priority

__all__ = ["ConveyorBackend", "tasks_api", "to_conveyor_priority"]

_attempt: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar(
    "conveyor_django_attempt", default=None)
_meta: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "conveyor_django_meta", default=None)
_NOTHING: AbstractContextManager[None] = nullcontext()


class _Attempts(Hook):
    """Makes the running job's attempt visible to the task's call; carries the Django
    task's own settings into the job's meta on enqueue."""

    @contextmanager
    def _run(self, attempt: Attempt) -> Iterator[None]:
        token = _attempt.set(attempt)
        try:
            yield
        finally:
            _attempt.reset(token)

    def run(self, task: Task[Any, Any], attempt: Attempt) -> AbstractContextManager[None]:
        return self._run(attempt)

    def enqueue(self, task: Task[Any, Any], count: int, meta: dict[str, str]
                ) -> AbstractContextManager[None]:
        meta.update(_meta.get() or {})
        return _NOTHING


def _send(signal: Any, sender: type, result: Any) -> None:
    """Send a worker-side signal: a listener's error never turns the attempt's outcome
    into another (``send_robust`` logs it on ``django.dispatch``)."""
    signal.send_robust(sender=sender, task_result=result)


def _failed(result: Any, exc: BaseException) -> None:
    error = TaskError(exception_class_path=f"{type(exc).__module__}.{type(exc).__qualname__}",
                      traceback="".join(traceback.format_exception(exc)))
    object.__setattr__(result, "status", TaskResultStatus.FAILED)
    object.__setattr__(result, "errors", [*result.errors, error])


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
        Redis, and must not be able to import arbitrary modules. The apps are those of
        ``INSTALLED_APPS``, not of the app registry, which a test case's
        ``available_apps`` narrows while the project's tasks stay the project's. The task
        may be declared for another backend: ``task.using(backend=...)`` sends it here."""
        from django.conf import settings

        roots = {str(entry).split(".")[0] for entry in settings.INSTALLED_APPS}
        roots.add(_settings_module().split(".")[0])
        if module_path.split(".")[0] not in roots - {""}:
            return None
        try:
            found = import_string(module_path)
        except ImportError:
            return None
        return found if isinstance(found, DjangoTask) else None

    def _call(self, module_path: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        attempt = _attempt.get()
        if attempt is None:  # only the worker calls this, inside the attempt's hook
            raise LookupError(f"{module_path} called outside a conveyor attempt")
        close_old_connections()  # as Django does around a request
        try:
            result = self.get_result(attempt.job_id)
            _send(signals.task_started, type(self), result)
            try:
                if result.task.takes_context:
                    value = result.task.call(TaskContext(task_result=result), *args, **kwargs)
                else:
                    value = result.task.call(*args, **kwargs)
                # Stored as Django stores it, or the attempt fails: a value that is not
                # JSON (a function, a set) raises Django's TypeError here, as with
                # Django's own backends, instead of failing once the task looked done.
                value = normalize_json(value)
            except BaseException as exc:
                _failed(result, exc)
                raise
            else:
                object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
                object.__setattr__(result, "_return_value", value)
            finally:
                # The worker records the outcome once the call returns: the finish time
                # is this process's clock, the record's comes a moment later.
                object.__setattr__(result, "finished_at", timezone.now())
                _send(signals.task_finished, type(self), result)
            return value
        finally:
            close_old_connections()

    # -- the Django side -------------------------------------------------------------------

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Check everything, then store: a call that raises has stored nothing."""
        self.validate_task(task)
        conveyor_task = self.conveyor_task(task.module_path)
        if conveyor_task is None:
            raise InvalidTask(f"{task.module_path} is not a task of this backend importable"
                              " from an app of INSTALLED_APPS or the settings' package")
        queued = conveyor_task.options(priority=to_conveyor_priority(task.priority),
                                       at=self._run_after(task.run_after))
        if queued.queue != task.queue_name:
            queued.queue = task.queue_name
        # The result is built first: building it rejects arguments Django does not accept,
        # and its JSON-normalised arguments are what the job stores.
        result = results.make_result(task, "", args, kwargs, self.alias)
        # Planned (encoded) now, so an argument that cannot be fails before anything is
        # stored; the store encodes again with the meta its hooks give, under the same id.
        planned = producer.plan(queued, [(tuple(result.args), result.kwargs)],
                                queue=producer.shard_for(queued))
        [job_id] = planned.job_ids
        object.__setattr__(result, "id", job_id)
        if self.on_commit and not transaction.get_autocommit():
            transaction.on_commit(lambda: self._store(planned, task, result))
        else:
            self._store(planned, task, result)
        return result

    def _store(self, planned: producer.Plan, task: Any, result: Any) -> None:
        token = _meta.set(results.django_meta(task))
        try:
            producer.store(planned)
        finally:
            _meta.reset(token)
        short_id = planned.jobs[0][0]
        enqueued_ms = self.app.redis.hget(self.app.keys(planned.queue).job(short_id),
                                          ENQUEUED_MS)
        if enqueued_ms is not None:  # the server's clock, as get_result reads it
            object.__setattr__(result, "enqueued_at", results.utc_of(int(enqueued_ms) / 1000))
        signals.task_enqueued.send(sender=type(self), task_result=result)

    @staticmethod
    def _run_after(run_after: datetime | None) -> datetime | None:
        if run_after is None or run_after.tzinfo is not None:
            return run_after
        aware: datetime = timezone.make_aware(run_after)
        return aware

    def get_result(self, result_id: str) -> Any:
        try:
            job = self.app.job(result_id)
            record = self.app.redis.hgetall(self.app.keys(job.queue).job(job.short_id))
            info = JobInfo.from_record(self.app, job.queue, job.short_id, record)
        except (ValueError, JobNotFound):
            raise TaskResultDoesNotExist(result_id) from None
        django_task = self._resolve(info.task) if record else None
        if django_task is None:
            raise TaskResultDoesNotExist(result_id)
        data = results.payload(record)
        try:
            arguments = self.app.codec.decode_args(data)
            meta = self.app.codec.decode_meta(data)
        except Exception:
            arguments, meta = ([], {}), {}
        task = results.task_of_meta(django_task, self.alias, info.queue, meta)
        return results.result_of_record(task, info, record, arguments, self.alias)


def _settings_module() -> str:
    """The project's settings module, also inside ``override_settings``: the settings it
    overrides (a ``UserSettingsHolder``) say ``SETTINGS_MODULE = None``, the project's are
    beneath them."""
    from django.conf import UserSettingsHolder, settings

    held: Any = getattr(settings, "_wrapped", settings)
    while isinstance(held, UserSettingsHolder):
        held = held.default_settings
    return str(getattr(held, "SETTINGS_MODULE", "") or "")


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
