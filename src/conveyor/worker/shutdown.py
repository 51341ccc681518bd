"""A worker's way out: the stop request, the grace period, and the jobs it gives back.

A stop (SIGTERM, SIGINT, :meth:`~conveyor.worker.Worker.stop`, or the worker's own
``max_jobs``) ends the fetching; then :meth:`Shutdown.drain` hands back at once the jobs
that have not started, gives the running ones the grace period, and interrupts the rest.
Every job goes back to its queue without using up an attempt: a shutdown never
dead-letters a job. A second stop request cuts the grace period short.

Each step of the way out is bounded, so that nothing (a client call that swallows its
cancellation, a stuck thread) can hold the stop for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .backoff import REDIS_ERRORS
from .handback import HandBack
from .handoff import Waiting
from .loops import where
from .slots import Slots

log = logging.getLogger("conveyor.worker")
INTERRUPTED = "interrupted: the worker shut down"


class Shutdown:
    """Whether a stop was asked for, and how long running jobs may take to finish.

    :param grace: seconds running jobs get to finish after a stop request
    """

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.requested = False
        self._hurry: asyncio.Future[None] | None = None  # the drain's wait, cut short

    def request(self, running: int = 0) -> None:
        """Ask for a stop; a second request drops the grace period.

        :param running: jobs running now (for the log line: what the stop waits for)
        """
        if self.requested:
            log.warning("second stop request: interrupting the running jobs now; they go"
                        " back to their queues")
            self.grace = 0
            if self._hurry is not None and not self._hurry.done():
                self._hurry.set_result(None)
        elif running:
            log.info("stopping: taking no new jobs, draining %d running job(s) for up to"
                        " %.0f s (grace period); stop again to interrupt them (they go back"
                        " to their queues)", running, self.grace,
                        extra={"running": running, "grace": self.grace})
        else:
            log.info("stopping: no job is running")
        self.requested = True

    async def drain(self, slots: Slots, hand_back: HandBack) -> None:
        """After a stop: hand back at once the jobs of ``slots`` that have not started,
        give running ones the grace period, then interrupt the rest and hand them back."""
        await hand_back.held(slots.take_unstarted(), "")
        running = slots.running()
        if running:
            self._hurry = asyncio.get_running_loop().create_future()
            if self.grace <= 0:
                self._hurry.set_result(None)
            waiters: list[asyncio.Future[Any]] = [
                asyncio.gather(*running, return_exceptions=True), self._hurry]
            await asyncio.wait(waiters, timeout=self.grace, return_when=asyncio.FIRST_COMPLETED)
            self._hurry.cancel()
            self._hurry = None
        interrupted = slots.interrupt()
        if interrupted:
            log.warning("interrupting %d running job(s); they go back to their queues",
                        len(interrupted))
        await hand_back.held(interrupted, INTERRUPTED)


async def leave_waiting(waiting: Waiting, client: Any, queues: Sequence[str],
                        hand_back: HandBack) -> None:
    """Unregister as a waiter and hand back what was handed over but not taken."""
    left: dict[str, list[Any]] = {}
    with contextlib.suppress(*REDIS_ERRORS):
        async with asyncio.timeout(2.0):
            left = await waiting.leave(client, queues)
    for queue, jobs in left.items():
        await hand_back(queue, [(j.short_id, j.token) for j in jobs], within=2.0)


def install_signals(on_signal: Callable[[], None]) -> list[int]:
    """Call ``on_signal`` on SIGTERM and SIGINT (in the main thread only); the signals
    handled, for :func:`remove_signals`."""
    installed: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        return installed
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, on_signal)
            installed.append(sig)
        except (NotImplementedError, RuntimeError):
            pass
    return installed


def remove_signals(installed: list[int]) -> None:
    loop = asyncio.get_running_loop()
    for sig in installed:
        loop.remove_signal_handler(sig)


def end_leftovers(loop: asyncio.AbstractEventLoop, timeout: float) -> None:
    """After the worker's coroutine ended: cancel whatever it left running and wait a
    bounded time, then shut down async generators and the default executor, each bounded.
    (``asyncio.Runner`` waits for all three without a bound: a task that swallowed its
    cancellation inside a client call, or a stuck executor thread, would hold the stop.)"""
    leftovers = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in leftovers:
        task.cancel()
    if leftovers:
        _, stuck = loop.run_until_complete(asyncio.wait(leftovers, timeout=timeout))
        for task in stuck:
            log.warning("task %s did not stop within %.1f s of being cancelled (at %s); the"
                        " worker exits without it", task.get_name(), timeout, where(task))

    async def shut_down() -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await loop.shutdown_asyncgens()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await loop.shutdown_default_executor()

    loop.run_until_complete(shut_down())
