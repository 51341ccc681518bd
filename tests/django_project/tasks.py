"""Tasks of the test project."""

from __future__ import annotations

from typing import Any

import redis

from conveyor.contrib.django import tasks_api

task = tasks_api.task


@task()
def add(x: int, y: int) -> int:
    return x + y


@task()
def echo(*args: Any, **kwargs: Any) -> list[Any]:
    return [list(args), kwargs]


@task()
async def async_add(x: int, y: int) -> int:
    return x + y


@task()
def fail() -> None:
    raise ValueError("this task fails on purpose")


@task(takes_context=True)
def attempt_and_workers(context: Any) -> list[Any]:
    return [context.attempt, list(context.task_result.worker_ids)]


@task()
def note(url: str, key: str, label: str) -> None:
    """Append ``label`` to the list ``key``: the order in which jobs ran."""
    client = redis.Redis.from_url(url)
    try:
        client.rpush(key, label)
    finally:
        client.close()


@task()
def returns_a_function() -> Any:
    """A return value Django cannot store (not JSON)."""
    return lambda: True
