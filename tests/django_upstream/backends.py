"""What the upstream run changes: every ``TASKS`` a test sets names conveyor's backend,
and the immediate backend's step of running the task becomes a real conveyor worker.

Django's tests set ``TASKS`` themselves (``@override_settings``) to its reference
backends. :func:`point_at_conveyor` rewrites each such setting as Django reads it: the
dummy backend (stores, never runs) becomes :class:`Stored`, the immediate
backend (runs the task inside ``enqueue``) becomes :class:`RunAtOnce`, both on the
runner's private redis-server. Other backends (the tests' own custom classes, a missing
module) are left as they are.
"""

from __future__ import annotations

import os
from typing import Any

from asgiref.local import Local

from conveyor.contrib.django import ConveyorBackend, tasks_api

__all__ = ["RunAtOnce", "Stored", "conveyor_tasks", "point_at_conveyor"]

_PACKAGES = ("django.tasks", "django_tasks")
# Backends that store a task for a worker to run: the dummy backend (nothing runs it) and
# the queues of django-tasks-rq and django-tasks-db, whose tests run their worker.
DUMMY = {f"{package}.backends.dummy.DummyBackend" for package in _PACKAGES} | {
    "django_tasks_rq.RQBackend", "django_tasks_rq.backend.RQBackend",
    "django_tasks_db.DatabaseBackend", "django_tasks_db.backend.DatabaseBackend"}
IMMEDIATE = {f"{package}.backends.immediate.ImmediateBackend" for package in _PACKAGES}


class Stored(ConveyorBackend):
    """Conveyor's backend with the two helpers Django's tests call on the dummy backend
    it stands in for: ``results``, the results of the jobs this backend stored, each read
    back from Redis, in the order they were enqueued; and ``clear()``, which deletes every
    job of the backend's namespace."""

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self._ids: list[str] = []

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        result = super().enqueue(task, args, kwargs)
        self._ids.append(result.id)
        return result

    @property
    def results(self) -> list[Any]:
        return [self.get_result(result_id) for result_id in self._ids]

    def clear(self) -> None:
        self._ids.clear()
        keys = list(self.app.redis.scan_iter(match=f"*{self.app.namespace}*"))
        for key in keys:
            self.app.redis.delete(key)


class RunAtOnce(ConveyorBackend):
    """Conveyor's backend, with a real conveyor worker run in this process right after
    the job is stored: ``enqueue`` returns the result as the worker left it, which is
    what Django's immediate backend returns."""

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        result = super().enqueue(task, args, kwargs)
        worker = self.app.worker(queues=[task.queue_name], concurrency=1)
        worker.run(burst=True)
        return self.get_result(result.id)


def conveyor_tasks(tasks: dict[str, Any]) -> dict[str, Any]:
    """``tasks`` (a ``TASKS`` setting) with Django's reference backends replaced by
    conveyor's, on the runner's Redis (``CONVEYOR_REDIS_URL``)."""
    url = os.environ["CONVEYOR_REDIS_URL"]
    replaced: dict[str, Any] = {}
    for alias, params in tasks.items():
        backend = params.get("BACKEND")
        if backend in DUMMY:
            backend = f"{Stored.__module__}.{Stored.__qualname__}"
        elif backend in IMMEDIATE:
            backend = f"{RunAtOnce.__module__}.{RunAtOnce.__qualname__}"
        else:
            replaced[alias] = params
            continue
        options = {**params.get("OPTIONS", {}), "url": url, "namespace": "upstream"}
        replaced[alias] = {**params, "BACKEND": backend, "OPTIONS": options}
    return replaced


def point_at_conveyor() -> None:
    """Make Django's backend registry read every ``TASKS`` through :func:`conveyor_tasks`
    (at once, and again each time a test changes the setting)."""
    handler = tasks_api.task_backends
    read = handler.configure_settings

    def configure_settings(settings: dict[str, Any] | None) -> dict[str, Any]:
        return conveyor_tasks(read(settings))

    handler.configure_settings = configure_settings
    handler.__dict__.pop("settings", None)
    handler._settings = None
    handler._connections = Local()
