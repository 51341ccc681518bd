"""The parts of Django's Tasks API this backend uses, from ``django.tasks`` (Django 6) or
else the ``django-tasks`` backport, resolved once at import.

Names that differ between them are looked up by what the module offers, not by version
number: Django 6 calls the invalid-task error ``InvalidTask``, the backport
``InvalidTaskError``; a later release of either keeps working as long as one of the
names is there.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

__all__ = ["BaseTaskBackend", "DjangoTask", "InvalidTask", "TaskContext", "TaskError",
           "TaskResult", "TaskResultDoesNotExist", "TaskResultStatus", "backends_base",
           "exceptions", "first_attribute", "normalize_json", "signals", "tasks_api"]


def _modules() -> tuple[ModuleType, ModuleType, ModuleType, ModuleType, ModuleType]:
    """(package, base, backends.base, exceptions, signals) of ``django.tasks``, else of
    the ``django_tasks`` backport."""
    for name in ("django.tasks", "django_tasks"):
        try:
            return tuple(importlib.import_module(f"{name}{part}")  # type: ignore[return-value]
                         for part in ("", ".base", ".backends.base", ".exceptions", ".signals"))
        except ImportError:
            continue
    raise ImportError("conveyor.contrib.django needs Django 6 (django.tasks) or the"
                      " django-tasks package: pip install 'conveyor[django]'")


def first_attribute(module: ModuleType, *names: str) -> Any:
    """The first of ``names`` that ``module`` has.

    :raises ImportError: it has none of them, naming the module and every name tried
    """
    for name in names:
        found = getattr(module, name, None)
        if found is not None:
            return found
    raise ImportError(f"{module.__name__} has none of {', '.join(names)}: this version of"
                      " Django's Tasks API is not supported")


tasks_api, _base, backends_base, exceptions, signals = _modules()
BaseTaskBackend: Any = backends_base.BaseTaskBackend
DjangoTask: Any = _base.Task
TaskResult: Any = _base.TaskResult
TaskResultStatus: Any = _base.TaskResultStatus
TaskError: Any = _base.TaskError
TaskContext: Any = _base.TaskContext
InvalidTask: type[Exception] = first_attribute(exceptions, "InvalidTask", "InvalidTaskError")
TaskResultDoesNotExist: type[Exception] = exceptions.TaskResultDoesNotExist


def _normalize_json() -> Any:
    """Django's ``normalize_json`` (``django.utils.json`` on Django 6, the backport's
    ``utils``): a value as Django stores it, ``TypeError`` for one it cannot."""
    for name in ("django.utils.json", f"{tasks_api.__name__}.utils"):
        try:
            return importlib.import_module(name).normalize_json
        except (ImportError, AttributeError):
            continue
    raise ImportError("no normalize_json in django.utils.json or the Tasks API's utils")


normalize_json: Any = _normalize_json()
