"""Outcomes waiting to be recorded, sent in batches: one ``finish`` call per queue per flush.

While one flush is on the wire, new outcomes collect for the next, so the batch size
follows the load without any timer. When Redis is unreachable or refuses the call the
outcomes stay here and are sent once it takes them; meanwhile their jobs' leases are kept
alive (:meth:`Outbox.leases` feeds the lease heartbeat), so a job whose run has ended is
not run again while its outcome waits. Each queue is tried again after a back-off of its
own: one queue's refusals (a key of its own written over by hand, say) do not hold back
the outcomes of the others.

A batch whose reply was lost (it may have been recorded) is sent again as it was, before
any outcome that came after it (see :mod:`.doubt`): its reply, the first one if it ran,
says what became of each outcome, and dead jobs' hooks follow once (:mod:`.dead` tells
them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..scripts import calls, max_items
from .backoff import REDIS_ERRORS, QueueBackoff
from .dead import DeadNotices
from .doubt import InDoubt
from .executor import Held
from .joblog import log_outcome

if TYPE_CHECKING:
    from ..app import Conveyor

log = logging.getLogger("conveyor.worker")
# A refused script (ResponseError: out of memory, say) is retried like an unreachable
# server: the outcomes are kept, never dropped.
ERRORS = REDIS_ERRORS
GATHER_TURNS = 2  # loop turns a flush waits for outcomes being delivered
FINISH_MOST = max_items("finish")  # outcomes one finish call carries at most


class Outbox:
    def __init__(self, app: Conveyor, runner: Any,
                 before_flush: Callable[[set[tuple[str, str]]], Awaitable[None]] | None = None,
                 *, notices: DeadNotices | None = None,
                 on_handover: Callable[[str], Awaitable[None]] | None = None) -> None:
        """:param before_flush: awaited with the (queue, short id) of the outcomes about to
            be sent (the worker writes their progress still pending, which the outcomes
            would make too late to write)
        :param notices: told of jobs the outcomes made dead, and of dead letters the cap
            deleted (default: the app's hooks and callbacks, no alerts)
        :param on_handover: awaited with a queue whose acknowledgements queued workflow
            hand-overs
        """
        self.app = app
        self.runner = runner
        self.before_flush = before_flush
        self.pending: dict[str, list[calls.Outcome]] = {}
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self.refused = 0
        self.notices = notices if notices is not None else DeadNotices(app)
        self._backoff = QueueBackoff()  # queues whose last finish failed
        self._doubts: InDoubt[str] = InDoubt()  # per queue: a batch whose reply was lost
        # (queue, short id, token) -> the lease of an outcome not yet acknowledged
        self._leases: dict[tuple[str, str, str], Held] = {}
        self.on_handover = on_handover

    def add(self, queue: str, outcome: calls.Outcome, lease: Held | None = None) -> None:
        """Record ``outcome`` of a job of ``queue``; ``lease`` (the run's) is kept alive
        until Redis has acknowledged the outcome (see :meth:`leases`)."""
        self.pending.setdefault(queue, []).append(outcome)
        if lease is not None:
            self._leases[(queue, outcome.short_id, outcome.token)] = lease
        self._idle.clear()
        self._ready.set()

    def leases(self) -> list[Held]:
        """The leases of the jobs whose outcomes wait here: the worker still holds them."""
        return list(self._leases.values())

    def _waiting(self) -> bool:
        return bool(self.pending) or bool(self._doubts)

    def _unrecorded(self) -> int:
        """Outcomes not yet acknowledged: pending, or in a batch in doubt."""
        doubts = (self._doubts.get(queue) for queue in self._doubts)
        return sum(map(len, self.pending.values())) + sum(
            len(doubt.carried) for doubt in doubts if doubt is not None)

    async def run(self) -> None:
        """Record outcomes as they come, until cancelled (a worker's loop never returns:
        its keeper would take that for a death)."""
        while True:
            await self._wait()
            # Let the outcomes already on their way join this batch: thread completions the
            # loop has been told of (delivered in the loop's next turns) would otherwise wait
            # for the next flush, and small batches cost Redis and this process a script
            # call each. A few loop turns, not a timer: nothing waits when nothing comes.
            for _ in range(GATHER_TURNS):
                await asyncio.sleep(0)
            self._ready.clear()
            await self._flush_once()
            if not self._waiting():
                self._idle.set()

    async def _wait(self) -> None:
        """Until outcomes are added, or a queue that failed is due to be tried again."""
        retry = self._backoff.next_retry()
        if retry is None:
            await self._ready.wait()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), retry)

    async def _flush_once(self) -> None:
        # Taken before the progress is written: every outcome taken was reported after its
        # run's last progress, so that progress goes out first (after the outcome it would
        # be refused, the job no longer being active).
        queues = [queue for queue in dict.fromkeys([*self._doubts, *self.pending])
                  if not self._backoff.waiting(queue)]
        batches = [(queue, self._take(queue)) for queue in queues]
        try:
            await self._before_flush({(queue, o.short_id) for queue, batch in batches
                                      for o in batch})
            for i, (queue, batch) in enumerate(batches):
                try:
                    await self._record(queue, batch)
                except ERRORS as exc:
                    log.warning("could not record outcomes in %s (%s); retrying in %.2f s",
                                queue, exc, self._backoff.failed(queue))
                    doubt = self._doubts.get(queue)
                    if doubt is not None and doubt.carried is batch:
                        batches[i] = (queue, [])  # sent, reply lost: it goes again as it was
                    continue  # put back below; the other queues' go on
                batches[i] = (queue, [])
                self._backoff.succeeded(queue)
        finally:
            for queue, batch in batches:  # not recorded: keep their order, try again
                if batch:
                    self.pending.setdefault(queue, [])[:0] = batch

    def _take(self, queue: str) -> list[calls.Outcome]:
        """The next batch of ``queue``: its oldest outcomes, as many as one ``finish`` call
        may carry (:data:`~conveyor.scripts.MAX_COMMAND_ARGS`). Outcomes gather here faster
        than a slow link records them, far past a worker's concurrency; the rest goes in
        the next flush, at once."""
        waiting = self.pending.pop(queue, [])
        if len(waiting) > FINISH_MOST:
            self.pending[queue] = waiting[FINISH_MOST:]
            waiting = waiting[:FINISH_MOST]
            self._ready.set()
        return waiting

    async def _record(self, queue: str, batch: list[calls.Outcome]) -> None:
        """Send ``queue``'s batch in doubt, if any, then ``batch`` (if not empty)."""
        doubt = self._doubts.get(queue)
        if doubt is not None:
            done = await self._doubts.send(self.runner, queue, doubt.call)
            await self._recorded(queue, doubt.carried, done)
        if batch:
            call = calls.finish(self.app.keys(queue), batch, self.app.limits)
            await self._recorded(queue, batch,
                                 await self._doubts.send(self.runner, queue, call, batch))

    async def _recorded(self, queue: str, batch: list[calls.Outcome],
                        done: calls.Finished) -> None:
        """Redis answered the finish of ``batch``: its leases are no longer held."""
        for outcome, code in zip(batch, done.codes, strict=True):
            held = self._leases.pop((queue, outcome.short_id, outcome.token), None)
            log_outcome(queue, outcome, code, held)
        self._after(queue, batch, done)
        if done.handed_over and self.on_handover is not None:
            await self.on_handover(queue)

    async def _before_flush(self, jobs: set[tuple[str, str]]) -> None:
        if self.before_flush is None or not jobs:
            return
        try:
            await self.before_flush(jobs)
        except ERRORS as exc:  # progress is not worth holding outcomes back for
            log.debug("could not write pending progress before outcomes: %s", exc)

    def _after(self, queue: str, batch: list[calls.Outcome], done: calls.Finished) -> None:
        refused = [o.short_id for o, c in zip(batch, done.codes, strict=True)
                   if c == calls.FINISH_REFUSED]
        if refused:
            self.refused += len(refused)
            log.warning("%d outcome(s) refused in %s: the lease was lost and the job was taken"
                        " over (%s)", len(refused), queue, ", ".join(refused[:5]))
        dead = [o.short_id for o, c in zip(batch, done.codes, strict=True)
                if c == calls.FINISH_DEAD]
        if dead:
            self.notices.dead(queue, dead)
        expired = [o.short_id for o, c in zip(batch, done.codes, strict=True)
                   if c == calls.FINISH_EXPIRED]
        if expired:
            self.notices.expired(queue, expired)
        if done.trimmed:
            self.notices.trimmed(queue, done.trimmed)

    async def flush_all(self, timeout: float = 10.0) -> None:
        """Wait until everything pending is recorded (or ``timeout`` passes)."""
        # Not just "nothing pending": a batch already taken off `pending` may still be on
        # the wire, and stopping now would cancel it and lose those outcomes.
        if not self._waiting() and self._idle.is_set():
            return
        self._ready.set()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            log.error("could not record %d outcome(s) before stopping; their jobs will run"
                      " again when their leases expire", self._unrecorded())
