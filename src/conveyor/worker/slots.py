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

Jobs of batch tasks are held here too, but take no slot each: they are gathered and run
many per call by :mod:`.batches`, and a call takes one slot.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..clock import ServerClock
from ..scripts import calls
from ..sharding import base_queue
from .batches import Batches
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
    :param tell_start: tells Redis that a held job's run begins, before it does (for a job
        that lost a lease before its start was told); False: its lease is lost, no run
    """

    def __init__(self, app: Conveyor, clock: ServerClock, concurrency: int, *,
                 max_jobs: int | None = None, processed: int = 0, supervised: bool = False,
                 progress: Any = None,
                 record: Callable[[str, calls.Outcome, Held], None],
                 on_freed: Callable[[str, bool], None] = lambda _queue, _empty: None,
                 on_back: Callable[[], None] = lambda: None,
                 on_quota: Callable[[], None] = lambda: None,
                 tell_start: Callable[[Held], Awaitable[bool]] | None = None) -> None:
        self._tasks = app.tasks
        self._tell_start = tell_start
        self._clock = clock
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
        self.batches = Batches(app, clock, self.executor, concurrency=concurrency,
                               slot_free=lambda: self._free_slots() > 0,
                               finished=self._finished, progress=progress)
        self._batch_queues = self.batches.queues()
        self._plain_queues = {t.queue for t in app.tasks.values() if t.batch is None}

    @property
    def stuck(self) -> int:
        """Slots held by sync runs that overran their timeout (capacity lost until they
        return)."""
        return len(self.executor.stuck)

    def _free_slots(self) -> int:
        """Slots free now: each plain job held takes one, each batch call one. A sync run
        that overran its timeout keeps its thread, and so its slot, until it returns."""
        return (self.concurrency - (len(self.held) - self.batches.held) - self.batches.calls
                - len(self.executor.stuck) - len(self.executor.winding_down))

    def free(self, queue: str | None = None) -> int:
        """Jobs this worker could lease now. From a queue that batch tasks send their jobs
        to, the batch room (a full call per slot) while a slot is free, plus the free slots
        when plain tasks send jobs there too."""
        free = self._free_slots()
        if queue is not None and free > 0 and base_queue(queue) in self._batch_queues:
            plain = free if base_queue(queue) in self._plain_queues else 0
            free = plain + self.batches.room()
        if self.max_jobs is not None:  # never lease more than it will run
            free = min(free, self.max_jobs - self.processed - len(self.held))
        return free

    def take(self, queue: str, jobs: list[calls.Leased]) -> list[calls.Leased]:
        """Start the jobs leased from ``queue`` that fit (a plain job in a free slot, a job
        of a batch task in the batch room); returns the rest, to be handed back."""
        rest = []
        for leased in jobs:
            if (queue, leased.short_id) in self.held or self._fits(leased):
                self.start(queue, leased)
            else:
                rest.append(leased)
        return rest

    def _fits(self, leased: calls.Leased) -> bool:
        if self.max_jobs is not None and self.processed + len(self.held) >= self.max_jobs:
            return False
        if self._is_batch(leased):
            return self.batches.room() > 0
        return self._free_slots() > 0

    def _is_batch(self, leased: calls.Leased) -> bool:
        task = self._tasks.get(leased.task)
        return task is not None and task.batch is not None and not leased.problem

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
            # One run, one attempt: a run whose start was told under the earlier lease
            # (charged when it was reclaimed) tells at once that it goes on under this one.
            running.continued = running.continued or running.start_told
            running.start_told = False
            running.tell_by = 0.0 if running.continued else None
            self.leased.set()
            return
        held = Held(queue, leased)
        self.held[(queue, leased.short_id)] = held
        self.leased.set()
        if leased.confirm and self._tell_start is not None:
            held.task = asyncio.create_task(self._tell_then_run(held))
        else:
            self._run(held)

    async def _tell_then_run(self, held: Held) -> None:
        """Run ``held`` once Redis knows that its run begins; drop it if its lease is lost
        first (it runs elsewhere) or a stop took it back."""
        assert self._tell_start is not None
        told = await self._tell_start(held)
        key = (held.queue, held.leased.short_id)
        if self.held.get(key) is not held or held.withdrawn:
            return  # a stop took it back (and hands it back itself)
        if not told:
            self._release(key, held)
            self._on_freed(held.queue, not self.held)
            self.freed.set()
            return
        self._run(held)

    def _run(self, held: Held) -> None:
        """Start ``held``'s run (a batch task's job: gather it for a call)."""
        leased = held.leased
        if self._is_batch(leased):
            held.batch = True
            self.batches.held += 1
            self.batches.add(held)
            return
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
        self._release(key, held)
        self._on_freed(held.queue, not self.held)
        self.freed.set()
        if not held.batch:  # (a batch call dispatches once all its items are recorded)
            self.batches.dispatch()

    def _release(self, key: tuple[str, str], held: Held) -> None:
        del self.held[key]
        if held.batch:
            self.batches.held -= 1

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
        if held.batch:  # the call goes on for the other items; this one's result is dropped
            # (started_at 0: its run never began, so its lease used no attempt)
            self._finished(held, calls.Outcome(held.leased.short_id, held.leased.token,
                                               "cancelled", held.started_at or 0.0, ""))
            held.withdraw(running_too=True)
            return
        self._finished(held, self.executor.cancelled(held))
        held.withdraw(running_too=True)  # what the run reports later is dropped
        if isinstance(held.task, asyncio.Task):
            held.task.cancel()

    def _slot_back(self) -> None:
        self.freed.set()
        self._on_back()
        self.batches.dispatch()

    # -- a stop takes the jobs back ---------------------------------------------------------

    def take_unstarted(self) -> list[Held]:
        """Give up the jobs whose runs have not started (they go back to their queues)."""
        unstarted = [h for h in list(self.held.values()) if h.withdraw(running_too=False)]
        for held in unstarted:
            self._release((held.queue, held.leased.short_id), held)
        return unstarted

    def running(self) -> list[asyncio.Future[None]]:
        """What to wait on for the runs in progress to end."""
        return [h.task for h in self.held.values() if h.task is not None] + \
            self.batches.running()

    def interrupt(self) -> list[Held]:
        """Give up every job still held, interrupting its run (an async task is cancelled;
        what a sync one reports later is dropped)."""
        interrupted = list(self.held.values())
        for held in interrupted:
            held.withdraw(running_too=True)
            if isinstance(held.task, asyncio.Task):
                held.task.cancel()
        self.batches.interrupt()
        self.held.clear()
        self.batches.held = 0
        return interrupted

    def shutdown(self) -> None:
        """Let the executor's idle threads exit."""
        self.executor.shutdown()
