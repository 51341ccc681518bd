"""The outcome of each item of a batch call (see :mod:`.batches`): what the function marked
on the item, else what the call's return or exception means for it, by the task's retry
policy and the item's own attempts."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..batch import BatchItem
from ..clock import ServerClock
from ..errors import Fail, Snooze
from ..scripts.calls import Outcome
from .executor import Held, describe

if TYPE_CHECKING:
    from ..task import Task

# What a call gives back: an outcome for each item it settled.
Settled = list[tuple[Held, Outcome]]


class ItemOutcomes:
    """:param result: an item's result as stored (``Executor.result``: encoded, and sealed
        when the task is encrypted)
    :param clock: the server's clock (the start of an item that has none)
    """

    def __init__(self, result: Callable[[Held, Task[Any, Any], Any], bytes],
                 clock: ServerClock) -> None:
        self._result = result
        self._clock = clock

    def settle(self, task: Task[Any, Any], items: list[BatchItem],
               exc: BaseException | None, error: str | None = None) -> Settled:
        """Each item's outcome: its own mark first (dead, retry, or success with the result
        it was given); then success when the call returned, or what the call's exception
        means for it (``Fail``: dead; else a retry as the task's policy says, by the item's
        own attempts)."""
        text = None if exc is None or isinstance(exc, Fail | Snooze) else (
            error or describe(exc))
        settled: Settled = []
        for item in items:
            held: Held = item._lease
            mark = item.marked
            if mark is not None and mark[0] != "ok":
                outcome = (self._dead(held, mark[1]) if mark[0] == "dead"
                           else self.retry(held, task, mark[1]))
            elif exc is None or mark is not None:
                outcome = self._ok(held, task, item)
            else:
                outcome = self.failed(held, task, exc, text or "")
            settled.append((held, outcome))
        return settled

    def _ok(self, held: Held, task: Task[Any, Any], item: BatchItem) -> Outcome:
        try:
            payload = self._result(held, task, item.result)
        except Exception as exc:  # a result that cannot be stored fails this item alone
            return self.failed(held, task, exc, describe(exc))
        return Outcome(held.leased.short_id, held.leased.token, "ok", self._started(held),
                       payload)

    def failed(self, held: Held, task: Task[Any, Any], exc: BaseException, text: str
                ) -> Outcome:
        if isinstance(exc, Fail):
            return self._dead(held, exc.reason)
        if isinstance(exc, Snooze):
            return Outcome(held.leased.short_id, held.leased.token, "snooze",
                           self._started(held), str(exc), int(exc.seconds * 1000))
        if task.retries_after(exc):
            return self.retry(held, task, text)
        return self._dead(held, text)

    def _dead(self, held: Held, reason: str) -> Outcome:
        return Outcome(held.leased.short_id, held.leased.token, "dead", self._started(held),
                       reason)

    def retry(self, held: Held, task: Task[Any, Any], error: str) -> Outcome:
        delay = task.retry_delay(held.leased.attempts)
        return Outcome(held.leased.short_id, held.leased.token, "retry", self._started(held),
                       error, int(delay * 1000))

    def _started(self, held: Held) -> float:
        return held.started_at or self._clock.now()
