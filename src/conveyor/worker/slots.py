"""The worker's running set: the jobs it holds, one slot each, and the runs on them.

One object owns what the slots hold, so that "how many jobs could this worker lease now"
has one answer (:meth:`Slots.free`) and every change to it happens here: a leased job
starts (:meth:`Slots.start`), its run ends (its outcome goes to the outbox and its slot is
free), someone cancels it, or a stop takes the jobs back. Others ask; they never change
the set. Two events tell the rest of the worker what happened: :attr:`Slots.freed` (a
slot came free: the wake listener may block again) and :attr:`Slots.leased` (a job was
leased: its heartbeat may be due sooner).

A sync run that overran its timeout, or that was cancelled and still runs, keeps its
thread and so its slot until it returns (the executor counts those).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..clock import ServerClock
from ..scripts import calls
from .executor import Executor, Held

if TYPE_CHECKING:
    from ..app import Conveyor

log = logging.getLogger("conveyor.worker")


class Slots:
    """Up to ``concurrency`` held jobs and their runs.

    :param app: the application whose tasks run here
    :param clock: the server's clock as the worker reads it
    :param concurrency: most jobs held at once
    :param max_jobs: most runs in the worker's life (None: no limit)
    :param processed: runs ended before (a worker run again goes on counting)
    :param supervised: a supervisor replaces the process when a run gets stuck
    :param progress: where tasks' progress reports go (a ``ProgressWriter``)
    :param record: given each run's outcome with its run (its lease is kept until the
        outcome is acknowledged)
    :param on_freed: called with the queue of a run that ended, and whether no job is held
        now
    :param on_back: called when a run that overran its timeout, or was cancelled, returns
        its thread, and so its slot
    :param on_quota: called each time a run ends once ``max_jobs`` runs have ended
    """

    def __init__(self, app: Conveyor, clock: ServerClock, concurrency: int, *,
                 max_jobs: int | None = None, processed: int = 0, supervised: bool = False,
                 progress: Any = None,
                 record: Callable[[str, calls.Outcome, Held], None],
                 on_freed: Callable[[str, bool], None] = lambda _queue, _empty: None,
                 on_back: Callable[[], None] = lambda: None,
                 on_quota: Callable[[], None] = lambda: None) -> None:
        self._tasks = app.tasks
        self.concurrency = concurrency
        self.max_jobs = max_jobs
        self.processed = processed
        self.held: dict[tuple[str, str], Held] = {}
        self.freed = asyncio.Event()  # a slot came free
        self.leased = asyncio.Event()  # a job was leased
        self._record = record
        self._on_freed = on_freed
        self._on_back = on_back
        self._on_quota = on_quota
        self.executor = Executor(app, clock, concurrency, supervised=supervised,
                                 on_slot_back=self._slot_back, progress=progress)

    @property
    def stuck(self) -> int:
        """Slots held by sync runs that overran their timeout (capacity lost until they
        return)."""
        return len(self.executor.stuck)

    def free(self) -> int:
        """Jobs this worker could lease now. A sync run that overran its timeout keeps its
        thread, and so its slot, until it returns."""
        free = (self.concurrency - len(self.held) - len(self.executor.stuck)
                - len(self.executor.winding_down))
        if self.max_jobs is not None:  # never lease more than it will run
            free = min(free, self.max_jobs - self.processed - len(self.held))
        return free

    def start(self, queue: str, leased: calls.Leased) -> None:
        """Run a job leased from ``queue`` (or, if it runs here already, go on with that run
        under the new lease)."""
        running = self.held.get((queue, leased.short_id))
        if running is not None:
            # Its lease lapsed while it ran here (a stalled loop, a Redis pause) and this
            # worker leased it again: the run in progress becomes the new lease's run, with
            # the new token, rather than a second run of the same job beside it.
            log.warning("job %s was leased again while it still runs here: the run goes on"
                        " under the new lease", leased.short_id)
            running.leased, running.lease_lost, running.next_beat = leased, False, None
            self.leased.set()
            return
        held = Held(queue, leased)
        self.held[(queue, leased.short_id)] = held
        self.leased.set()
        task = self._tasks.get(leased.task)
        if task is not None and not task.is_async and not leased.problem:
            self.executor.start_sync(held, task, self._finished)
        else:
            held.task = asyncio.create_task(self._execute(held))

    async def _execute(self, held: Held) -> None:
        try:
            outcome = await self.executor.run(held)
        except asyncio.CancelledError:
            return  # withdrawn by a stop, which hands the job back itself
        if outcome is not None:
            self._finished(held, outcome)

    def _finished(self, held: Held, outcome: calls.Outcome) -> None:
        """Record an attempt's outcome and free its slot (once per run)."""
        key = (held.queue, held.leased.short_id)
        if self.held.get(key) is not held or held.withdrawn:
            return  # already handed back, interrupted or timed out
        if held.task is not None and not held.task.done() and \
                not isinstance(held.task, asyncio.Task):
            held.task.set_result(None)  # a sync attempt's future: the job is settled
        if outcome.token != held.leased.token:  # leased again while it ran: the new lease
            outcome = dataclasses.replace(outcome, token=held.leased.token)
        self._record(held.queue, outcome, held)  # its lease is kept until acknowledged
        self.processed += 1
        if self.max_jobs is not None and self.processed >= self.max_jobs:
            self._on_quota()
        del self.held[key]
        self._on_freed(held.queue, not self.held)
        self.freed.set()

    def cancel(self, held: Held) -> None:
        """Someone cancelled a job held here (its heartbeat said so): end the run now. An
        async task is cancelled; a sync one sees ``ctx.cancelled`` and keeps its thread
        until it returns. The job ends cancelled at once either way."""
        if held.cancel_requested:
            return
        held.cancel_requested = True
        if self.held.get((held.queue, held.leased.short_id)) is not held or held.withdrawn:
            return
        log.info("job %s~%s was cancelled while it ran here: stopping it", held.queue,
                 held.leased.short_id)
        self._finished(held, self.executor.cancelled(held))
        held.withdraw(running_too=True)  # what the run reports later is dropped
        if isinstance(held.task, asyncio.Task):
            held.task.cancel()

    def _slot_back(self) -> None:
        self.freed.set()
        self._on_back()

    # -- a stop takes the jobs back ---------------------------------------------------------

    def take_unstarted(self) -> list[Held]:
        """Give up the jobs whose runs have not started (they go back to their queues)."""
        unstarted = [h for h in list(self.held.values()) if h.withdraw(running_too=False)]
        for held in unstarted:
            del self.held[(held.queue, held.leased.short_id)]
        return unstarted

    def running(self) -> list[asyncio.Future[None]]:
        """What to wait on for the runs in progress to end."""
        return [h.task for h in self.held.values() if h.task is not None]

    def interrupt(self) -> list[Held]:
        """Give up every job still held, interrupting its run (an async task is cancelled;
        what a sync one reports later is dropped)."""
        interrupted = list(self.held.values())
        for held in interrupted:
            held.withdraw(running_too=True)
            if isinstance(held.task, asyncio.Task):
                held.task.cancel()
        self.held.clear()
        return interrupted

    def shutdown(self) -> None:
        """Let the executor's idle threads exit."""
        self.executor.shutdown()
