"""Running one leased job: decode, call the task, and turn what happened into an outcome."""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import EncodingError
from ..keys import job_id
from ..scripts.calls import Leased, Outcome
from .clock import ServerClock
from .threads import ThreadRunner

if TYPE_CHECKING:
    from ..app import Conveyor

log = logging.getLogger("conveyor.worker")
MAX_ERROR = 8192


@dataclass(eq=False)
class Held:
    """A job this worker holds a lease on."""

    queue: str
    leased: Leased
    started_at: float | None = None  # server epoch s when the function began
    # What to wait on or cancel: the coroutine's task (async), a future (sync).
    task: asyncio.Future[None] | None = field(default=None, repr=False)
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)

    @property
    def withdrawn(self) -> bool:
        """True once the worker gave the job up (handed back, interrupted, timed out)."""
        return self.task is not None and self.task.done()


def describe(exc: BaseException) -> str:
    """The error text stored on the job: type, message, then the traceback (bounded)."""
    text = "".join(traceback.format_exception(exc))
    head = f"{type(exc).__name__}: {exc}"
    return (head + "\n" + text)[:MAX_ERROR]


class Executor:
    """Runs jobs: async tasks on the loop, sync tasks on a bounded set of threads."""

    def __init__(self, app: Conveyor, clock: ServerClock, threads: int, *,
                 supervised: bool = False) -> None:
        self.app = app
        self.supervised = supervised  # a supervisor replaces this process when stuck
        self.clock = clock
        self.threads = ThreadRunner(asyncio.get_running_loop(), threads)
        self.abandoned = 0  # sync runs that overran their timeout and still hold a thread
        self.stuck: dict[str, float] = {}  # job id -> when it overran, while its thread runs

    def _dead(self, held: Held, reason: str) -> Outcome:
        return Outcome(held.leased.short_id, held.leased.token, "dead",
                       held.started_at or self.clock.now(), reason)

    async def run(self, held: Held) -> Outcome:
        """Run ``held`` to an outcome; never raises except on cancellation."""
        leased = held.leased
        task = self.app.tasks.get(leased.task)
        if task is None:
            held.started_at = self.clock.now()
            return self._dead(held, f"unknown task {leased.task!r}")
        try:
            args, kwargs = self.app.codec.decode_args(leased.args)
        except EncodingError as exc:
            held.started_at = self.clock.now()
            return self._dead(held, str(exc))
        try:
            value = await self._call(held, task, args, kwargs)
            payload = self.app.codec.encode_result(value)
        except TimeoutError:
            return self._retry(held, task, f"timeout: the task ran longer than {task.timeout} s")
        except Exception as exc:
            return self._retry(held, task, describe(exc))
        return Outcome(leased.short_id, leased.token, "ok", held.started_at or self.clock.now(),
                       payload)

    def start_sync(self, held: Held, task: Any, done: Callable[[Held, Outcome], None]) -> None:
        """Run the job of a sync task on a thread; ``done(held, outcome)`` runs on the loop.

        The whole attempt (decode, call, encode) happens in the thread, so a job costs the
        loop no coroutine and one batched wake-up. A run past the task's timeout is reported
        at the deadline and its thread abandoned (a supervisor replaces the process).
        """
        loop = asyncio.get_running_loop()
        held.task = loop.create_future()
        if task.timeout is not None:
            held.timer = loop.call_later(task.timeout, self._overran, held, task, done)

        def finished(outcome: Outcome | None) -> None:
            if held.timer is not None:
                held.timer.cancel()
            self.stuck.pop(job_id(held.queue, held.leased.short_id), None)
            if outcome is not None and not held.withdrawn:
                done(held, outcome)

        self.threads.call(self._attempt_in_thread, (held, task), finished)

    def _attempt_in_thread(self, job: tuple[Held, Any]) -> Outcome | None:
        held, task = job
        if held.withdrawn:  # handed back before a thread was free: do not run it
            return None
        held.started_at = self.clock.now()
        leased = held.leased
        try:
            args, kwargs = self.app.codec.decode_args(leased.args)
        except EncodingError as exc:
            return self._dead(held, str(exc))
        try:
            payload = self.app.codec.encode_result(task.fn(*args, **kwargs))
        except Exception as exc:
            return self._retry(held, task, describe(exc))
        return Outcome(leased.short_id, leased.token, "ok", held.started_at, payload)

    def _overran(self, held: Held, task: Any, done: Callable[[Held, Outcome], None]) -> None:
        if held.withdrawn:
            return
        self.abandoned += 1
        self.stuck[job_id(held.queue, held.leased.short_id)] = time.time()
        remedy = ("the supervisor will replace this process" if self.supervised else
                  "run workers under the supervisor (-p) so the process is replaced")
        log.error(
            "task %s (job %s) overran its %s s timeout; its thread cannot be interrupted and"
            " is abandoned (%d abandoned so far): %s", task.name, held.leased.short_id,
            task.timeout, self.abandoned, remedy,
        )
        done(held, self._retry(held, task, f"timeout: the task ran longer than {task.timeout} s"))

    def _retry(self, held: Held, task: Any, error: str) -> Outcome:
        delay = task.retry_delay(held.leased.attempts)
        return Outcome(held.leased.short_id, held.leased.token, "retry",
                       held.started_at or self.clock.now(), error, int(delay * 1000))

    async def _call(self, held: Held, task: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Await an async task's coroutine (sync tasks go through :meth:`start_sync`)."""
        held.started_at = self.clock.now()
        if task.timeout is None:
            return await task.fn(*args, **kwargs)
        async with asyncio.timeout(task.timeout):
            return await task.fn(*args, **kwargs)

    def shutdown(self) -> None:
        self.threads.shutdown()
