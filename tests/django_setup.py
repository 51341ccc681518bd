"""Django, set up in the test process on the test project (``tests/django_project``),
for the tests of conveyor's Tasks backend; import this module before anything of Django's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_project.settings")
django.setup()

from django.test import override_settings  # noqa: E402 - needs the settings above

from conveyor.contrib.django import ConveyorBackend, tasks_api  # noqa: E402
from django_project.settings import tasks_setting  # noqa: E402


@contextmanager
def conveyor_tasks(url: str, namespace: str, **options: Any) -> Iterator[ConveyorBackend]:
    """``TASKS`` pointing the default backend at ``url`` and ``namespace``, for the
    block; its backend."""
    with override_settings(TASKS=tasks_setting(url, namespace, **options)):
        backend = tasks_api.task_backends["default"]
        assert isinstance(backend, ConveyorBackend)
        try:
            yield backend
        finally:
            backend.app.close()


def run_worker(backend: ConveyorBackend, *queues: str, concurrency: int = 1) -> str:
    """Run a real conveyor worker in this process until no job is ready; its id."""
    worker = backend.app.worker(queues=list(queues or ("default", "other")),
                                concurrency=concurrency)
    worker.run(burst=True)
    return worker.id


def heard(backend: ConveyorBackend) -> list[str]:
    """The task signals the test project's listeners heard, in order, as lines."""
    from django_project.apps import heard_key

    lines = backend.app.redis.lrange(heard_key(backend.app.namespace), 0, -1)
    return [line.decode() for line in lines]
