"""Which parameters of a task are redacted (``@app.task(redact=(...))``), for the views.

The process showing a job may not have its task registered (``conveyor job --url ...``),
so every worker publishes its tasks' redacted parameters at start in the namespace's
``redact`` hash (:func:`apublish`), and a view reads them from there for a task it does
not know (:func:`redactions`).
"""

from __future__ import annotations

import inspect
import json
import logging
from typing import TYPE_CHECKING, Any

from .keys import redactions_key

if TYPE_CHECKING:
    from .app import Conveyor
    from .task import Task

__all__ = ["REDACTED", "apublish", "of_task", "redactions"]

REDACTED = "[redacted]"
log = logging.getLogger("conveyor.worker")


def of_task(task: Task[Any, Any]) -> dict[str, int]:
    """A task's redacted parameter names with their positions (-1: keyword only)."""
    if not task.redact:
        return {}
    try:
        params = list(inspect.signature(task.fn).parameters.values())
    except (TypeError, ValueError):
        return dict.fromkeys(task.redact, -1)
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return {p.name: (i if p.kind in positional else -1)
            for i, p in enumerate(params) if p.name in task.redact}


async def apublish(app: Conveyor, client: Any) -> None:
    """Write the redacted parameters of ``app``'s tasks where every view finds them, and
    drop the entries of its tasks that redact nothing (any more); a failure is logged
    (views that do not know a task then show its arguments)."""
    mapping = {name: json.dumps(sorted(of_task(task).items()))
               for name, task in app.tasks.items() if task.redact}
    plain = [name for name, task in app.tasks.items() if not task.redact]
    key = redactions_key(app.namespace)
    try:
        async with client.pipeline(transaction=False) as pipe:
            if mapping:
                pipe.hset(key, mapping=mapping)
            if plain:
                pipe.hdel(key, *plain)
            await pipe.execute()
    except Exception as exc:  # start-up goes on; said once
        log.warning("could not publish the redacted parameters of %d tasks: %s",
                    len(mapping), exc)


def redactions(app: Conveyor, task: str) -> dict[str, int]:
    """The redacted parameters of ``task``: from its registration here, else as a worker
    published them."""
    registered = app.tasks.get(task)
    if registered is not None:
        return of_task(registered)
    raw = app.redis.hget(redactions_key(app.namespace), task)
    if raw is None:
        return {}
    try:
        return {str(name): int(pos) for name, pos in json.loads(raw)}
    except (ValueError, TypeError):
        return {}


