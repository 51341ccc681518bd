"""Batch tasks under :func:`conveyor.testing.inline`: the jobs of one ``enqueue`` (or one
``enqueue_many``) are passed to the function together, as one call on a worker would pass
them; each item is then settled as on a worker (its mark, the call's return or exception),
and the items to retry are called again at once, together, without backoff."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import keys as keyspace
from .batch import BatchItem

if TYPE_CHECKING:
    from .task import Task
    from .testing import InlineRunner

__all__ = ["run_batch"]

Call = Callable[[Any, list[Any], dict[str, Any]], Any]


def run_batch(runner: InlineRunner, queue: str, task: Task[Any, Any],
              jobs: list[tuple[str, bytes]], call: Call) -> None:
    """Run the jobs ``(short id, payload)`` of ``task`` in calls of the items left to run,
    up to the task's attempts."""
    opened = [(short_id, runner.opened(queue, short_id, task, payload))
              for short_id, payload in jobs]
    pending = [(short_id, payload) for short_id, payload in opened if payload]  # b"": dead
    for attempt in range(1, task.max_attempts + 1):
        if not pending:
            return
        items = [_item(runner, queue, short_id, payload, attempt, task.max_attempts)
                 for short_id, payload in pending]
        error: Exception | None = None
        try:
            call(task, [items], {})
        except Exception as exc:
            error = exc
        pending = [job for job, item in zip(pending, items, strict=True)
                   if not _settle(runner, queue, task, job[0], item, error, attempt)]


def _item(runner: InlineRunner, queue: str, short_id: str, payload: bytes, attempt: int,
          max_attempts: int) -> BatchItem:
    runner._start(queue, short_id, attempt)
    args, kwargs = runner.app.codec.decode_args(payload)
    tenant = runner.record(queue, short_id).get(b"tenant", b"").decode() or None
    return BatchItem(keyspace.job_id(queue, short_id), list(args), dict(kwargs), tenant,
                     attempt, max_attempts)


def _settle(runner: InlineRunner, queue: str, task: Task[Any, Any], short_id: str,
            item: BatchItem, error: Exception | None, attempt: int) -> bool:
    """Record what became of one item; False when it is to be called again."""
    mark = item.marked
    if mark is not None and mark[0] == "dead":
        runner._dead(queue, short_id, mark[1])
        return True
    if mark is not None and mark[0] == "retry":
        if attempt < task.max_attempts:
            runner._update(queue, short_id, state="retrying", error=mark[1])
            return False
        runner._dead(queue, short_id, mark[1])
        return True
    if error is None or mark is not None:
        runner._succeed(queue, short_id, task, item.result)
        return True
    return runner._failed(queue, short_id, task, attempt, error)
