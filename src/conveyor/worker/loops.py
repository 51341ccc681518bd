"""Supervision of a worker's own long-lived tasks.

A worker runs a few loops beside its main one: wake-ups, lease heartbeats, the outcome
outbox, the registry heartbeat, the periodic scheduler. Each must outlive every error
Redis can answer with; a loop that ended quietly would leave a worker that looks healthy
and no longer does its job (idle workers that never wake, long jobs whose leases lapse,
cron that never fires). So every loop runs under :class:`Loops`: an error restarts it
after a back-off, with a log line; a loop that cannot be kept alive (it raised something
that is not an ``Exception``, or it returned) stops the worker, which then exits non-zero
so that its supervisor replaces it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .backoff import CONNECTION_ERRORS, pause_after

__all__ = ["LoopDied", "Loops", "where"]

log = logging.getLogger("conveyor.worker")
HEALTHY_AFTER = 30.0  # a loop that ran this long without failing starts its back-off afresh
RECANCEL_SECONDS = 0.1  # how often a stop cancels again a loop that goes on


class LoopDied(RuntimeError):
    """A worker loop ended and could not be restarted; the worker stopped because of it."""


class Loops:
    """Starts named loops and keeps them running until :meth:`cancel`.

    :param on_fatal: called (on the event loop) with the error when a loop cannot be kept
        alive; the worker uses it to stop itself
    """

    def __init__(self, on_fatal: Callable[[BaseException], None]) -> None:
        self._on_fatal = on_fatal
        self._tasks: list[asyncio.Task[None]] = []
        self.restarts: dict[str, int] = {}
        self.fatal: BaseException | None = None

    def start(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        """Run ``loop()`` for the worker's whole life, restarting it after each error."""
        task = asyncio.get_running_loop().create_task(self._keep(name, loop), name=name)
        task.add_done_callback(self._ended)
        self._tasks.append(task)

    def restart(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        """Stop the loop ``name`` (if it runs) and start ``loop`` under that name."""
        for task in [t for t in self._tasks if t.get_name() == name and not t.done()]:
            task.cancel()
            self._tasks.remove(task)
        self.start(name, loop)

    async def _keep(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        failures = 0
        clock = asyncio.get_running_loop().time
        while True:
            began = clock()
            try:
                await loop()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if clock() - began > HEALTHY_AFTER:
                    failures = 0
                failures += 1
                self.restarts[name] = self.restarts.get(name, 0) + 1
                pause = pause_after(failures)
                # Redis out of reach is expected now and then: one line when it starts,
                # without a traceback; any other error shows where it came from.
                expected = isinstance(exc, CONNECTION_ERRORS)
                level = logging.DEBUG if expected and failures > 1 else logging.WARNING
                log.log(level, "%s failed (%s: %s); restarting it in %.2f s", name,
                        type(exc).__name__, exc, pause, exc_info=failures == 1 and not expected)
                await asyncio.sleep(pause)
                continue
            raise LoopDied(f"{name} returned; a worker loop must run until the worker stops")

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:  # cannot happen: _keep only ends by raising
            exc = LoopDied(f"{task.get_name()} ended")
        if not isinstance(exc, LoopDied):
            exc = LoopDied(f"{task.get_name()} died: {type(exc).__name__}: {exc}")
        log.critical("%s; stopping the worker so that it is replaced", exc)
        if self.fatal is None:
            self.fatal = exc
        self._on_fatal(exc)

    async def cancel(self, timeout: float = 2.0) -> None:
        """Stop every loop; bounded, since a cancellation swallowed inside a client call
        must not hang the worker's stop.

        A loop cancelled in the middle of a Redis call may see the client turn the
        cancellation into a connection error, which the loop takes as a fault to retry
        after a pause: so a loop still running is cancelled again, at its next wait.
        """
        clock = asyncio.get_running_loop().time
        deadline = clock() + timeout
        stuck = {task for task in self._tasks if not task.done()}
        while stuck and clock() < deadline:
            for task in stuck:
                task.cancel()
            _, stuck = await asyncio.wait(stuck, timeout=min(RECANCEL_SECONDS,
                                                             deadline - clock()))
        if stuck:
            for task in stuck:
                log.warning("%s did not stop within %.1f s of being cancelled (at %s); the"
                            " worker stops without it", task.get_name(), timeout, where(task))


def where(task: asyncio.Task[Any]) -> str:
    """Where ``task`` is suspended, outermost call first (the coroutine chain it awaits
    down), for a log line about a task that hangs."""
    steps: list[str] = []
    awaited: Any = task.get_coro()
    while awaited is not None and len(steps) < 20:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
        if frame is None:
            break
        steps.append(f"{frame.f_code.co_name} ({frame.f_code.co_filename.rsplit('/', 1)[-1]}"
                     f":{frame.f_lineno})")
        awaited = getattr(awaited, "cr_await", None)
    return " > ".join(steps) or "no frame"
