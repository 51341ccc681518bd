"""The tasks the test modules of django-tasks-rq and django-tasks-db import as
``tests.tasks``, a module their source distributions do not ship: written here from what
those tests call and check (names, return values, the messages of the errors they raise).

They are tasks of Django's Tasks API in use (``django.tasks``, or the backport before
Django 6), so conveyor's backend runs them under this package's settings.
"""

from __future__ import annotations

from typing import Any

from conveyor.contrib.django import tasks_api

task = tasks_api.task


@task()
def noop_task(*args: Any, **kwargs: Any) -> None:
    return None


@task()
async def noop_task_async(*args: Any, **kwargs: Any) -> None:
    return None


@task()
def calculate_meaning_of_life() -> int:
    return 42


@task()
def failing_task_value_error() -> None:
    raise ValueError("This task failed due to ValueError")


@task()
def failing_task_system_exit() -> None:
    raise SystemExit("This task failed due to SystemExit")


@task()
def complex_exception() -> None:
    raise ValueError(ValueError("This task failed"))


@task()
def complex_return_value() -> Any:
    return lambda: True  # neither JSON nor picklable


@task(takes_context=True)
def get_task_id(context: Any) -> str:
    return str(context.task_result.id)


@task(takes_context=True)
def test_context(context: Any, attempt: int) -> None:
    assert isinstance(context, tasks_api.TaskContext)
    assert context.attempt == attempt
