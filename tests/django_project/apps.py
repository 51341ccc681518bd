"""The test project's app: its listeners write every task signal they hear into Redis
(``<namespace>:heard``), so a test hears the signals of a worker in another process."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig


def heard_key(namespace: str) -> str:
    return f"{namespace}:heard"


def _listener(name: str) -> Any:
    def listen(sender: type, task_result: Any, **kwargs: Any) -> None:
        from conveyor.contrib.django import tasks_api

        app = tasks_api.task_backends[task_result.backend].app
        line = " ".join([name, task_result.id, str(task_result.status),
                         ",".join(task_result.worker_ids), sender.__name__])
        app.redis.rpush(heard_key(app.namespace), line)

    return listen


class ProjectConfig(AppConfig):  # type: ignore[misc]
    name = "django_project"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        import importlib

        from conveyor.contrib.django import tasks_api

        signals = importlib.import_module(f"{tasks_api.__name__}.signals")
        for name in ("task_enqueued", "task_started", "task_finished"):
            getattr(signals, name).connect(_listener(name), weak=False,
                                           dispatch_uid=f"django_project.{name}")
