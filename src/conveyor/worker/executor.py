"""Running one leased job: decode, call the task, and turn what happened into an outcome.

Every attempt ends in exactly one outcome, whatever the task does: return, raise any
exception (``SystemExit``, ``KeyboardInterrupt``, a ``RecursionError`` from a deeply
nested payload, an exception whose ``str()`` itself fails), or overrun its timeout. An
attempt that produced no outcome would leave its job ``active`` for the worker's life.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import hooks
from .. import keys as keyspace
from ..clock import ServerClock
from ..context import JobContext, enter, leave
from ..encryption import MAGIC, Unsealable, open_payload, seal_result
from ..errors import Fail, LeaseLost, Snooze
from ..hints import ArgumentMismatch, convert_arguments
from ..scripts.calls import Leased, Outcome
from ..waits import Suspended
from .threads import ThreadRunner

if TYPE_CHECKING:
    from ..app import Conveyor
    from ..task import Task

log = logging.getLogger("conveyor.worker")
MAX_ERROR = 8192

LEASED, RUNNING, WITHDRAWN = "leased", "running", "withdrawn"


@dataclass(eq=False)
class Held:
    """A job this worker holds a lease on, and its run here (at most one per job)."""

    queue: str
    leased: Leased  # the current lease; replaced when the job is leased here again
    started_at: float | None = None  # server epoch s when the function began
    # What to wait on or cancel: the coroutine's task (async), a future (sync).
    task: asyncio.Future[None] | None = field(default=None, repr=False)
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    next_beat: float | None = None  # loop time its lease is next due for a heartbeat
    lease_lost: bool = False
    # Telling Redis that the lease's run began (heartbeat.lua): once told, a lost lease is
    # charged an attempt. ``tell_by``: loop time by which the heartbeat tells it; ``telling``:
    # told before the run begins (a job that lost a lease before, see Leased.confirm).
    start_told: bool = False
    tell_by: float | None = None
    telling: bool = False
    # The run goes on from an earlier lease whose start was told (and charged): this lease
    # tells so, and its attempt is given back.
    continued: bool = False
    batch: bool = False  # a job of a batch task: gathered, then run in a call of many
    opened: bytes | None = field(default=None, repr=False)  # its arguments, opened if sealed
    # Set (from the heartbeat) once someone cancelled the job; the task's context reads it.
    cancel_requested: bool = False
    # Starting a run (a thread) and withdrawing the job (a stop) exclude each other.
    state: str = LEASED
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def try_start(self, clock: ServerClock) -> bool:
        """Claim the job for running; False if it was withdrawn first."""
        with self._lock:
            if self.state != LEASED:
                return False
            self.state = RUNNING
            self.started_at = clock.now()
            return True

    def withdraw(self, *, running_too: bool) -> bool:
        """Take the job away from this worker: always when ``running_too``, else only if
        it has not started. True if it was taken away before it started running."""
        with self._lock:
            unstarted = self.state == LEASED
            if unstarted or running_too:
                self.state = WITHDRAWN
            return unstarted

    @property
    def withdrawn(self) -> bool:
        """True once the worker gave the job up (handed back, interrupted, timed out)."""
        return self.state == WITHDRAWN


def describe(exc: BaseException) -> str:
    """The error text stored on the job: type, message, then the traceback (bounded).

    Never raises: an exception whose ``str()`` or traceback cannot be formatted is
    described by its type and what went wrong formatting it.
    """
    name = type(exc).__name__
    try:
        head = f"{name}: {exc}"
    except Exception as failed:
        head = f"{name} (its message could not be read: {type(failed).__name__})"
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception:
        text = ""
    return (head + "\n" + text)[:MAX_ERROR]


class Executor:
    """Runs jobs: async tasks on the loop, sync tasks on a bounded set of threads."""

    def __init__(self, app: Conveyor, clock: ServerClock, threads: int, *,
                 supervised: bool = False, on_slot_back: Callable[[], None] = lambda: None,
                 progress: Any = None) -> None:
        """:param on_slot_back: called when an overrunning or cancelled run returns its slot
        :param progress: where tasks' progress reports go (a ``ProgressWriter``)
        """
        self.app = app
        self.progress = progress
        self.on_slot_back = on_slot_back
        self.supervised = supervised  # a supervisor replaces this process when stuck
        self.clock = clock
        self.threads = ThreadRunner(asyncio.get_running_loop(), threads)
        self.abandoned = 0  # sync runs that overran their timeout, in all
        self.stuck: dict[int, float] = {}  # id(Held) -> when it overran, while its thread runs
        # id(Held) -> when it was cancelled, while its sync run still holds its thread
        self.winding_down: dict[int, float] = {}

    def _dead(self, held: Held, reason: str) -> Outcome:
        return Outcome(held.leased.short_id, held.leased.token, "dead",
                       held.started_at or self.clock.now(), reason)

    def decode(self, held: Held) -> tuple[list[Any], dict[str, Any]] | Outcome:
        """The job's arguments, converted to the task's type hints, or the dead outcome
        that a job with none usable gets."""
        leased = held.leased
        if leased.problem:
            return self._dead(held, leased.problem)
        task = self.app.tasks.get(leased.task)
        if task is None:
            return self._dead(held, f"unknown task {leased.task!r}")
        held.opened = leased.args
        if leased.args[:4] == MAGIC:  # sealed (an encrypted task's): opened for this job
            try:
                held.opened = open_payload(self.app.encryption, leased.args, leased.task,
                                           "args", keyspace.job_id(held.queue, leased.short_id))
            except Unsealable as exc:  # no key for it here, or it was altered or moved
                return self._dead(held, f"arguments cannot be opened: {exc}")
        try:
            args, kwargs = self.app.codec.decode_args(held.opened)
        except Exception as exc:  # EncodingError, or RecursionError from deep nesting
            return self._dead(held, f"corrupt payload: {describe(exc)}")
        # An argument that does not fit its annotation fails the same way every attempt.
        try:
            return convert_arguments(task.hints, task.name, args, kwargs)
        except ArgumentMismatch as exc:
            return self._dead(held, str(exc))
        except Exception as exc:  # RecursionError from deep nesting
            return self._dead(held, f"arguments could not be converted: {describe(exc)}")

    async def run(self, held: Held) -> Outcome | None:
        """Run ``held`` to an outcome (None: it was withdrawn before it started)."""
        if not held.try_start(self.clock):
            return None
        decoded = self.decode(held)
        if isinstance(decoded, Outcome):
            return decoded
        task = self.app.tasks[held.leased.task]
        args, kwargs = decoded
        enter(JobContext(self.app, held, self.progress))  # this asyncio task's own context
        try:
            with self._hooks(held, task):
                value = await self._call(task, args, kwargs)
            return self._ok(held, self.result(held, task, value))
        except Snooze as snooze:
            return self._snooze(held, snooze)
        except Suspended:
            return self._suspend(held)
        except _Overran:
            return self._timed_out(held, task)
        except asyncio.CancelledError as exc:
            if _cancelled_from_outside():
                raise
            return self._failed(held, task, exc, "CancelledError raised by the task")
        except BaseException as exc:  # SystemExit and the like end this attempt, not the worker
            return self._failed(held, task, exc)

    @staticmethod
    async def _call(task: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Await an async task's coroutine within its timeout. A ``TimeoutError`` the task
        raises itself (an HTTP or database client's) is the task's failure, told apart from
        conveyor's own timeout by whether the deadline passed."""
        if task.timeout is None:
            return await task.fn(*args, **kwargs)
        try:
            async with asyncio.timeout(task.timeout) as deadline:
                return await task.fn(*args, **kwargs)
        except TimeoutError:
            if deadline.expired():
                raise _Overran() from None
            raise

    def _hooks(self, held: Held, task: Any) -> AbstractContextManager[None]:
        """The app's run hooks (tracing, test helpers) around one call of the task."""
        leased = held.leased
        return hooks.running(self.app, task, held.queue, leased.short_id, leased.attempts,
                             leased.max_attempts, held.opened or leased.args)

    def result(self, held: Held, task: Task[Any, Any], value: Any) -> bytes:
        """A run's return value as stored: encoded, and sealed when the task is encrypted.

        :raises SerializationError: the value cannot be encoded
        """
        payload = self.app.codec.encode_result(value)
        if not task.encrypt:
            return payload
        return seal_result(self.app, task, keyspace.job_id(held.queue, held.leased.short_id),
                           payload)

    def _ok(self, held: Held, payload: bytes) -> Outcome:
        return Outcome(held.leased.short_id, held.leased.token, "ok",
                       held.started_at or self.clock.now(), payload)

    def start_sync(self, held: Held, task: Any, done: Callable[[Held, Outcome], None]) -> None:
        """Run the job of a sync task on a thread; ``done(held, outcome)`` runs on the loop.

        The whole attempt (decode, call, encode) happens in the thread, so a job costs the
        loop no coroutine and one batched wake-up. The timeout counts from when the
        function starts (not while the job waits for a thread); a run past it is reported
        then and its thread abandoned: it keeps its slot until it returns.
        """
        loop = asyncio.get_running_loop()
        held.task = loop.create_future()

        def finished(outcome: Outcome | None) -> None:
            if held.timer is not None:
                held.timer.cancel()
            if self.stuck.pop(id(held), None) is not None:
                log.warning("the overrunning run of job %s returned; its slot is free again",
                            held.leased.short_id)
                self.on_slot_back()
            elif self.winding_down.pop(id(held), None) is not None:
                self.on_slot_back()
            if outcome is not None and held.state == RUNNING:
                done(held, outcome)

        def arm_timer() -> None:
            if held.state == RUNNING and held.task is not None and not held.task.done():
                held.timer = loop.call_later(task.timeout, self._overran, held, task, done)

        self.threads.call(self._attempt_in_thread, (held, task, loop, arm_timer), finished)

    def _attempt_in_thread(self, job: tuple[Held, Any, asyncio.AbstractEventLoop, Any]
                           ) -> Outcome | None:
        held, task, loop, arm_timer = job
        try:
            if not held.try_start(self.clock):
                return None  # handed back before a thread was free: do not run it
            if task.timeout is not None:
                loop.call_soon_threadsafe(arm_timer)
            decoded = self.decode(held)
            if isinstance(decoded, Outcome):
                return decoded
            args, kwargs = decoded
            token = enter(JobContext(self.app, held, self.progress))
            try:
                with self._hooks(held, task):
                    value = task.fn(*args, **kwargs)
            finally:
                leave(token)
            return self._ok(held, self.result(held, task, value))
        except Snooze as snooze:
            return self._snooze(held, snooze)
        except Suspended:
            return self._suspend(held)
        except BaseException as exc:  # whatever the task raises ends in an outcome
            try:
                return self._failed(held, task, exc)
            except BaseException:
                return self._dead(held, f"{type(exc).__name__} (could not be recorded)")

    def _overran(self, held: Held, task: Any, done: Callable[[Held, Outcome], None]) -> None:
        since = self.winding_down.pop(id(held), None)
        if since is not None:
            # Cancelled, and still running past its timeout: as stuck as any overrun (a
            # supervisor replaces the process); its job already ended cancelled.
            self.abandoned += 1
            self.stuck[id(held)] = since
            log.error("task %s (job %s) was cancelled and still runs past its %s s timeout;"
                      " its thread cannot be interrupted", task.name, held.leased.short_id,
                      task.timeout)
            return
        if held.state != RUNNING or held.task is None or held.task.done():
            return
        self.abandoned += 1
        self.stuck[id(held)] = self.clock.now()
        remedy = ("the supervisor will replace this process" if self.supervised else
                  "its slot stays taken until it returns; run workers under the supervisor"
                  " (-p) so that the process is replaced")
        log.error(
            "task %s (job %s) overran its %s s timeout; its thread cannot be interrupted"
            " (%d thread(s) stuck now): %s", task.name, held.leased.short_id,
            task.timeout, len(self.stuck), remedy,
        )
        done(held, self._timed_out(held, task))

    def cancelled(self, held: Held) -> Outcome:
        """The outcome that ends a run someone cancelled. A sync run still on its thread
        keeps its slot until it returns (whatever it returns then is dropped)."""
        if held.state == RUNNING and isinstance(held.task, asyncio.Future) and \
                not isinstance(held.task, asyncio.Task) and not held.task.done():
            self.winding_down[id(held)] = self.clock.now()
        # started_at 0: the run never began (the cancel came while it waited for a slot or
        # a thread), so finish gives its attempt back.
        return Outcome(held.leased.short_id, held.leased.token, "cancelled",
                       held.started_at or 0.0, "")

    def _snooze(self, held: Held, snooze: Snooze) -> Outcome:
        return Outcome(held.leased.short_id, held.leased.token, "snooze",
                       held.started_at or self.clock.now(), str(snooze),
                       int(snooze.seconds * 1000))

    def _suspend(self, held: Held) -> Outcome:
        """The run reached a durable wait that is not over (``conveyor.waits``)."""
        return Outcome(held.leased.short_id, held.leased.token, "suspend",
                       held.started_at or self.clock.now(), "")

    def _failed(self, held: Held, task: Any, exc: BaseException, error: str | None = None
                ) -> Outcome:
        """The outcome of a run that raised ``exc``: a retry, or dead at once when the
        task's retry policy refuses it (``Fail``, ``retry_on``, ``no_retry_on``). A run
        that lost its lease is left to the retry path: its outcome is refused anyway."""
        if isinstance(exc, Fail):
            return self._dead(held, exc.reason)
        text = describe(exc) if error is None else error
        if isinstance(exc, LeaseLost) or task.retries_after(exc):
            return self._retry(held, task, text)
        return self._dead(held, text)

    def _timed_out(self, held: Held, task: Any) -> Outcome:
        """A run past the task's timeout fails as a ``TimeoutError`` would, so that
        ``retry_on=(TimeoutError,)`` retries it."""
        text = f"timeout: the task ran longer than {task.timeout} s"
        return self._failed(held, task, TimeoutError(text), text)

    def _retry(self, held: Held, task: Any, error: str) -> Outcome:
        delay = task.retry_delay(held.leased.attempts)
        return Outcome(held.leased.short_id, held.leased.token, "retry",
                       held.started_at or self.clock.now(), error, int(delay * 1000))

    def shutdown(self) -> None:
        self.threads.shutdown()


class _Overran(Exception):
    """The task ran past its timeout (conveyor's deadline, not a timeout of the task's own)."""


def _cancelled_from_outside() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
