"""Keeping leases alive: a held job's lease is extended by heartbeat, so the lease only
bounds how soon a dead worker's job runs again, not how long a job may run.

A job is held from its lease until Redis has acknowledged its outcome: a run that has
ended keeps being beaten while its outcome waits in the outbox (Redis refusing writes for
a while, a key that only the acknowledgement reads written over), or it would run again
elsewhere although it is done.

Each held job is due for a heartbeat a third of its own visibility timeout after its last
one (or after it was leased); the loop sleeps until the earliest such time and is woken
when a job is leased, so a job with a short timeout leased while the loop slept for a
longer one still gets its first heartbeat in time. Leases due within the same short
window go out together, one script call per queue.

A fetch reclaims expired leases, this worker's own included. So before the worker fetches
from a queue, :meth:`LeaseKeeper.catch_up` beats that queue's leases whose heartbeat is
overdue (the loop could not reach Redis for a while): once Redis is back, the worker's own
fetch never takes from it a job it still holds.

A heartbeat also tells Redis, once, that a lease's run has begun (within about a second of
its start, with the beats then due): a lease lost after that is charged an attempt, one lost
before is not (include/maintain.lua). A job that lost a lease before its start was told
tells it before its run begins (:meth:`LeaseKeeper.tell_start`).

A cancel of a running job reaches its holder with a heartbeat. So that it lands within a
second or two rather than a third of the visibility timeout, the loop also looks, every
``CANCEL_POLL`` seconds while it holds jobs, whether any of them is in its queue's
``cancelling`` set (one ``ZMSCORE`` per queue), and beats those at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

import redis

from ..scripts import calls, max_items
from .backoff import REDIS_ERRORS, pause_after
from .doubt import InDoubt
from .executor import Held

log = logging.getLogger("conveyor.worker")
IDLE_WAIT = 5.0  # seconds between looks when nothing is held (a lease wakes it sooner)
CANCEL_POLL = 0.5  # seconds between looks for cancels of held jobs
BATCH_WINDOW = 0.25  # fraction of a job's interval by which it may be beaten early
START_TELL = 0.5  # seconds: the loop looks this often for runs that began, and tells them
# so this long after it saw them (runs shorter than that end before: their outcome tells)
BEAT_MOST = max_items("heartbeat")  # leases one heartbeat call carries at most
LOOK_MOST = 2000  # ids one look for cancels (ZMSCORE) carries at most

# What a heartbeat call was for: the held jobs and the leases it extends, in order.
Beat = tuple[list[Held], list[tuple[str, str, int, str]]]


def beat_interval(held: Held) -> float:
    """Seconds between heartbeats of ``held``: a third of its visibility timeout."""
    return max(0.05, held.leased.visibility_ms / 3000)


def _untold(held: Held) -> bool:
    """Whether ``held``'s run began (or is about to) and Redis has not been told."""
    return (held.started_at is not None or held.telling) and not held.start_told \
        and not held.lease_lost


def _telling(held: Held) -> str:
    """What ``held``'s next heartbeat tells of its run (see :func:`calls.heartbeat`)."""
    if not _untold(held):
        return ""
    return calls.CONTINUED if held.continued else calls.STARTED


class LeaseKeeper:
    """Extends the leases of held jobs before a third of their visibility timeout passes.

    :param held_jobs: the jobs the worker holds now (running, or ended with their outcome
        not yet acknowledged)
    :param leased: set by the worker whenever it leases a job
    :param runner: the async script runner
    :param keys: queue name -> its key names
    :param on_cancel: called with a held job whose heartbeat says it is to be cancelled
    :param client: the async Redis client, to look for cancels (None: never look)
    """

    def __init__(self, held_jobs: Callable[[], Iterable[Held]], leased: asyncio.Event,
                 runner: Any, keys: Callable[[str], Any],
                 on_cancel: Callable[[Held], None] = lambda _held: None,
                 client: Any = None) -> None:
        self._held_jobs = held_jobs
        self._leased = leased
        self._runner = runner
        self._keys = keys
        self._on_cancel = on_cancel
        self._client = client
        self._doubts: InDoubt[str] = InDoubt()  # per queue: a heartbeat whose reply was lost
        self._sending = asyncio.Lock()  # the loop and a catch-up beat one at a time
        self._clock = asyncio.get_running_loop().time

    async def run(self) -> None:
        """Beat leases as they come due, until cancelled (a worker's loop never returns)."""
        failures = 0
        next_poll = self._clock()
        while True:
            now = self._clock()
            jobs = list(self._held_jobs())
            for held in jobs:
                if held.next_beat is None:
                    held.next_beat = now + beat_interval(held)
                if held.tell_by is None and _untold(held):
                    held.tell_by = now + START_TELL
            wait = min((h.next_beat for h in jobs if h.next_beat is not None),
                       default=now + IDLE_WAIT)
            if any(not h.start_told for h in jobs):  # a run may begin meanwhile
                wait = min([wait, now + START_TELL]
                           + [h.tell_by for h in jobs if h.tell_by is not None
                              and _untold(h)])
            if jobs and self._client is not None:
                wait = min(wait, next_poll)
            self._leased.clear()
            if wait > now:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._leased.wait(), wait - now)
                continue
            try:
                if jobs and self._client is not None and next_poll <= now:
                    next_poll = now + CANCEL_POLL
                    await self._look_for_cancels(jobs, now)
                due = [h for h in jobs if h.next_beat is not None
                       and (h.next_beat - BATCH_WINDOW * beat_interval(h) <= now
                            or (h.tell_by is not None and h.tell_by <= now
                                and _untold(h)))]
                await self._beat(due, now)
                failures = 0
            except REDIS_ERRORS as exc:
                failures += 1
                pause = min([pause_after(failures), CANCEL_POLL]
                            + [beat_interval(h) / 2 for h in jobs])
                log.warning("could not extend leases (%s: %s); retrying in %.2f s",
                            type(exc).__name__, exc, pause)
                await asyncio.sleep(pause)

    async def catch_up(self, queue: str) -> None:
        """Beat now the leases of ``queue`` whose heartbeat is overdue by a whole interval
        (the loop could not reach Redis), and a heartbeat of ``queue`` in doubt: called
        before a fetch from ``queue``, which would reclaim those leases once expired. A
        failure is left to the fetch that follows (it meets the same trouble)."""
        now = self._clock()
        late = [h for h in self._held_jobs() if h.queue == queue and h.next_beat is not None
                and h.next_beat + beat_interval(h) <= now]
        if not late and queue not in self._doubts:
            return
        try:
            await self._beat(late, now, queues=[queue])
        except REDIS_ERRORS as exc:
            log.debug("could not extend the leases of %s before a fetch: %s", queue, exc)

    async def tell_start(self, held: Held) -> bool:
        """Tell Redis that ``held``'s run begins, before it does (its job lost a lease
        before its start was told: see ``Leased.confirm``). Tried again while Redis cannot
        be reached; False once the lease is lost or the job withdrawn (it must not run)."""
        held.telling = True
        failures = 0
        while not held.lease_lost and not held.withdrawn:
            try:
                await self._beat([held], self._clock(), queues=[held.queue])
                return held.start_told and not held.lease_lost
            except REDIS_ERRORS as exc:
                failures += 1
                pause = min(pause_after(failures), beat_interval(held) / 2)
                log.warning("could not tell the start of job %s (%s: %s); retrying in"
                            " %.2f s", held.leased.short_id, type(exc).__name__, exc, pause)
                await asyncio.sleep(pause)
        return False

    async def _look_for_cancels(self, jobs: list[Held], now: float) -> None:
        """Make the held jobs that someone asked to cancel due for a heartbeat now."""
        by_queue: dict[str, list[Held]] = {}
        for held in jobs:
            if not held.cancel_requested:
                by_queue.setdefault(held.queue, []).append(held)
        for queue, held_queue in by_queue.items():
            # At most LOOK_MOST ids a command: a worker may hold more than a command of
            # 3,999 arguments can carry.
            for start in range(0, len(held_queue), LOOK_MOST):
                held_here = held_queue[start:start + LOOK_MOST]
                try:
                    scores = await self._client.zmscore(
                        self._keys(queue).cancelling, [h.leased.short_id for h in held_here])
                except redis.ResponseError as exc:  # this queue's set refused: beats go on
                    log.debug("could not look for cancels in %s: %s", queue, exc)
                    break
                for held, score in zip(held_here, scores, strict=True):
                    if score is not None:
                        held.next_beat = now

    async def _beat(self, due: list[Held], now: float, queues: list[str] | None = None
                    ) -> None:
        """Beat ``due``, one call per queue, each after that queue's heartbeat in doubt (if
        any); with ``queues``, those queues only."""
        by_queue: dict[str, list[Held]] = {
            queue: [] for queue in (self._doubts if queues is None else queues)}
        for held in due:
            by_queue.setdefault(held.queue, []).append(held)
        refused: BaseException | None = None
        async with self._sending:
            for queue, jobs in by_queue.items():
                try:
                    await self._beat_queue(queue, jobs, now)
                except REDIS_ERRORS as exc:
                    # The other queues' leases are extended all the same (one queue's
                    # trouble, a key written over by hand, must not let them lapse); this
                    # one is tried again.
                    refused = refused or exc
        if refused is not None:
            raise refused

    async def _beat_queue(self, queue: str, jobs: list[Held], now: float) -> None:
        doubt = self._doubts.get(queue)
        if doubt is not None:  # its reply was lost: the same call first (see .doubt)
            codes = await self._doubts.send(self._runner, queue, doubt.call)
            self._beaten(queue, doubt.carried, codes, now)
        # The leases of outcomes not yet recorded count too, so a worker may hold more than
        # one call may carry (MAX_COMMAND_ARGS): one call per part, in turn.
        for start in range(0, len(jobs), BEAT_MOST):
            part = jobs[start:start + BEAT_MOST]
            leases = [(h.leased.short_id, h.leased.token, h.leased.visibility_ms, _telling(h))
                      for h in part]
            beat: Beat = (part, leases)
            call = calls.heartbeat(self._keys(queue), leases)
            self._beaten(queue, beat, await self._doubts.send(self._runner, queue, call, beat),
                         now)

    def _beaten(self, queue: str, beat: Beat, codes: list[int], now: float) -> None:
        jobs, leases = beat
        lost = []
        for held, lease, code in zip(jobs, leases, codes, strict=True):
            if held.leased.token != lease[1]:
                continue  # leased again meanwhile: the next beat carries the new token
            held.next_beat = now + beat_interval(held)
            if code and lease[3]:
                held.start_told = True
            if code == calls.BEAT_CANCEL:
                self._on_cancel(held)
            elif not code and not held.lease_lost:
                held.lease_lost = True
                lost.append(lease[0])
        if lost:
            log.warning("lost the lease of %d job(s) in %s (another worker took them over;"
                        " their results here will be refused): %s",
                        len(lost), queue, ", ".join(lost[:5]))
