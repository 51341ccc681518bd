"""Declaring tasks: ``@app.task`` and ``@app.periodic``, the part of
:class:`~conveyor.Conveyor` that fills its registry of tasks (typed overloads included)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast, overload

from .batch import Batch
from .errors import ConfigurationError
from .task import AsyncTask, BatchTaskDecorator, ExceptionClasses, Task, TaskDecorator

if TYPE_CHECKING:
    from .app import Conveyor
    from .schedule import Periodic

__all__ = ["TaskDeclarations"]

P = ParamSpec("P")
R = TypeVar("R")


class TaskDeclarations:
    """What :class:`~conveyor.Conveyor` declares tasks with; its ``tasks`` and ``periodics``
    are the registry."""

    tasks: dict[str, Task[Any, Any]]
    periodics: list[Periodic]

    @overload
    def task(self, fn: Callable[P, Coroutine[Any, Any, R]]) -> AsyncTask[P, R]: ...

    @overload
    def task(self, fn: Callable[P, R]) -> Task[P, R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        *,
        name: str | None = None,
        queue: str = "default",
        retries: int = 3,
        backoff: float = 1.0,
        timeout: float | None = None,
        visibility_timeout: float = 30.0,
        idle_threshold: float = 300.0,
        retry_on: ExceptionClasses | None = None,
        no_retry_on: ExceptionClasses | None = None,
        encrypt: bool = False,
        redact: Sequence[str] = (),
    ) -> TaskDecorator: ...

    @overload
    def task(
        self,
        fn: None = None,
        *,
        batch: Batch,
        name: str | None = None,
        queue: str = "default",
        retries: int = 3,
        backoff: float = 1.0,
        timeout: float | None = None,
        visibility_timeout: float = 30.0,
        idle_threshold: float = 300.0,
        retry_on: ExceptionClasses | None = None,
        no_retry_on: ExceptionClasses | None = None,
        encrypt: bool = False,
        redact: Sequence[str] = (),
    ) -> BatchTaskDecorator: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        queue: str = "default",
        retries: int = 3,
        backoff: float = 1.0,
        timeout: float | None = None,
        visibility_timeout: float = 30.0,
        idle_threshold: float = 300.0,
        retry_on: ExceptionClasses | None = None,
        no_retry_on: ExceptionClasses | None = None,
        batch: Batch | None = None,
        encrypt: bool = False,
        redact: Sequence[str] = (),
    ) -> Any:
        """Register a function (sync or async) as a task.

        The task keeps the function's types: ``enqueue`` takes its parameters, and the
        :class:`~conveyor.Job` it returns has its return type (for a coroutine function,
        what the coroutine returns).

        :param name: task name stored with its jobs (default ``module.function``)
        :param queue: queue its jobs go to
        :param retries: runs allowed after the first before the job goes dead
        :param backoff: base seconds of the exponential, jittered, capped retry delay
        :param timeout: seconds a run may take; an async run is cancelled, a sync one is
            abandoned and failed (a supervised worker process is replaced)
        :param visibility_timeout: lease length in seconds; heartbeats keep it alive while
            the job runs, so it only bounds how soon a dead worker's job runs again
        :param idle_threshold: seconds without a finished job after which the type is idle
        :param retry_on: exception classes (one, or a tuple) that are retried; any other
            exception ends the job dead at once
        :param no_retry_on: exception classes that end the job dead at once; any other is
            retried (give this or ``retry_on``, not both). Whatever these say, a task that
            raises :class:`~conveyor.Fail` ends dead at once
        :param batch: call the function once for many jobs, with the list of their
            :class:`~conveyor.BatchItem` (see ``docs/batches.md``); ``enqueue`` still takes
            one job's arguments
        :param encrypt: seal its jobs' arguments and results (and step values) with the
            app's ``encryption`` keys before they leave this process; people see
            ``[encrypted]`` in their place
        :param redact: names of parameters whose values the dashboard, the CLI and the
            API show as ``[redacted]`` (the worker gets them as they are)
        """

        def register(func: Callable[..., Any]) -> Task[Any, Any]:
            task_name = name or f"{func.__module__}.{func.__qualname__}"
            existing = self.tasks.get(task_name)
            if existing is not None and existing.fn is not func:
                raise ConfigurationError(f"a task named {task_name!r} is already registered")
            kind = AsyncTask if inspect.iscoroutinefunction(func) else Task
            task: Task[Any, Any] = kind(
                cast("Conveyor", self), func, name=task_name, queue=queue, retries=retries,
                backoff=backoff, timeout=timeout, visibility_timeout=visibility_timeout,
                idle_threshold=idle_threshold, retry_on=retry_on, no_retry_on=no_retry_on,
                batch=batch, encrypt=encrypt, redact=redact,
            )
            self.tasks[task_name] = task
            return task

        return register(fn) if fn is not None else register

    def periodic(
        self,
        cron: str,
        *,
        queue: str = "default",
        name: str | None = None,
        catch_up: bool = False,
        **task_options: Any,
    ) -> TaskDecorator:
        """Register a task that fires on a cron schedule (UTC), once per tick across workers.

        :param cron: five fields (minute precision) or six (the first is seconds)
        :param queue: queue the fired jobs go to
        :param name: task name (default ``module.function``)
        :param catch_up: after an outage fire every missed tick, not just the latest
        :param task_options: other :meth:`task` settings (retries, timeout, ...)
        """
        from .schedule import Periodic

        def register(func: Callable[..., Any]) -> Task[Any, Any]:
            task: Task[Any, Any] = self.task(name=name, queue=queue, **task_options)(func)
            self.periodics.append(Periodic(task=task, cron=cron, catch_up=catch_up))
            return task

        decorator: TaskDecorator = register  # type: ignore[assignment]
        return decorator

