"""The consumer: leases jobs for the free slots, or sleeps until there may be some.

It fills the free slots from the queues that may have work, starting each round at the
next queue (so that no queue is always served first), and otherwise sleeps until a
wake-up, a slot coming free, or the earliest due time among its queues (a delayed job, a
lease deadline). It owns what it knows of each queue: whether it may have ready jobs,
whether limits held jobs back, when something is next due, whether its last fetch failed
(a pause of its own) or was lost on the wire (:mod:`.doubt`: the same call goes again).

Others tell it what they learn — a wake marker (:meth:`Consumer.wake_all`), ready jobs
(:meth:`Consumer.look_again`), a due time (:meth:`Consumer.due_at`), jobs handed over
(:meth:`Consumer.take_handed`) — and never write its state themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..clock import ServerClock
from ..scripts import calls
from ..sharding import base_queue
from .backoff import REDIS_ERRORS, QueueBackoff
from .dead import DeadNotices
from .doubt import InDoubt
from .handback import HandBack
from .handoff import WAITER_TTL_MS, Waiting
from .joblog import log_dead_at_fetch
from .slots import Slots
from .wake import WAKE_BLOCK_SECONDS

if TYPE_CHECKING:
    from ..bounds import Limits

log = logging.getLogger("conveyor.worker")
EMPTY_SHARD_LOOK_SECONDS = 0.1  # how often a busy worker looks again at shards found empty


class Consumer:
    """Fills ``slots`` from ``queues``.

    :param queues: queues to serve, in order of preference
    :param slots: the running set whose free slots are filled
    :param runner: the async script runner
    :param keys: queue name -> its key names
    :param limits: the app's limits (sent with each fetch)
    :param worker_id: names the worker to the fetch (for its registration as a waiter)
    :param waiting: the worker's registrations as a waiter
    :param clock: the server's clock as the worker reads it
    :param catch_up: awaited with a queue before each fetch from it (the worker's own
        overdue heartbeats go first, so that the fetch reclaims no lease it still holds)
    :param notices: told of dead jobs and trimmed dead letters a fetch reports
    :param hand_back: hands back jobs leased beyond the free slots
    :param settle: awaited before a burst worker leaves (outcomes and alerts sent)
    :param stopping: whether a stop was asked for (the consumer then takes no new work)
    """

    def __init__(self, queues: Sequence[str], slots: Slots, runner: Any,
                 keys: Callable[[str], Any], limits: Limits, worker_id: str, waiting: Waiting,
                 clock: ServerClock, *, catch_up: Callable[[str], Awaitable[None]],
                 notices: DeadNotices, hand_back: HandBack,
                 settle: Callable[[], Awaitable[None]], stopping: Callable[[], bool]) -> None:
        self.queues = list(queues)
        self.slots = slots
        self._runner = runner
        self._keys = keys
        self._limits = limits
        self._worker_id = worker_id
        self._waiting = waiting
        self._clock = clock
        self._catch_up = catch_up
        self._notices = notices
        self._hand_back = hand_back
        self._settle = settle
        self._stopping = stopping
        self.nudge = asyncio.Event()  # there may be something to do: fill again
        self.idle = asyncio.Event()  # it waits: no fetch of its own is under way
        self._more = dict.fromkeys(self.queues, True)
        self._held_back: dict[str, bool] = {}  # a limit held ready jobs at the last fetch
        # Queues whose last fetch failed wait out a pause of their own; the others are
        # served meanwhile.
        self._fetch_backoff = QueueBackoff()
        self._fetches: InDoubt[str] = InDoubt()  # per queue: a fetch whose reply was lost
        self._wakes = 0  # wake-ups seen so far (one that arrives during a fetch is kept)
        self.next_due: dict[str, float | None] = dict.fromkeys(self.queues)
        self._rotation = 0
        self._top: dict[str, int | None] = {}  # per queue: its highest ready priority
        self._looked = 0.0  # when shards found empty were last looked at again
        self._sharded: dict[str, set[str]] = {}  # queue -> its shards served, when several
        self._group()

    @property
    def stopping(self) -> bool:
        return self._stopping()

    async def run(self, burst: bool) -> None:
        """Fill and sleep until a stop is asked for (with ``burst``, until no job is ready)."""
        while not self._stopping():
            self.nudge.clear()
            took = await self._fill()
            if took:
                continue
            if burst and not self.slots.held and not any(self._more.values()) \
                    and not any(self._held_back.values()):
                await self._settle()
                if not self.slots.held and not any(self._more.values()):
                    return  # (a hand-over while flushing may have made nodes ready)
            await self._sleep()

    async def _fill(self) -> bool:
        """Lease jobs for every free slot from queues that may have work; True if any."""
        took = False
        n = len(self.queues)
        for queue in self._order():
            free = self.slots.free(queue)
            if self.slots.free() <= 0 or self._stopping():
                break
            if ((not self._more[queue] and not self._is_due(queue))
                    or self._fetch_backoff.waiting(queue) or free <= 0):
                continue  # (free <= 0: the batch room is full; a call ending nudges)
            wakes, sent = self._wakes, time.monotonic()
            try:
                fetched, want = await self._fetch(queue, free)
            except REDIS_ERRORS as exc:
                self._fetch_failed(queue, exc)
                continue
            if self._fetch_backoff.succeeded(queue):
                log.info("fetching from queue %s again", queue, extra={"redis_back": True})
            self._fetched(queue, fetched, want, wakes, sent)
            # A fetch sent again may have leased for more slots than are free now (jobs
            # were handed over meanwhile): the rest goes back at once, attempt refunded.
            rest = fetched.jobs if self._stopping() else self.slots.take(queue, fetched.jobs)
            self.slots.batches.fetched(queue, drained=len(fetched.jobs) < want)
            if rest:
                await self._hand_back(queue, [(j.short_id, j.token) for j in rest])
            took = took or bool(fetched.jobs)
        self._rotation = (self._rotation + 1) % n
        return took

    def _order(self) -> list[str]:
        """The queues in the order this round serves them: in turn, except that the shards
        of a sharded queue go by the highest priority each had ready at its last fetch (a
        shard not fetched from yet first), so that a higher priority waiting on one shard
        is not passed over for a lower one on another."""
        n = len(self.queues)
        order = [self.queues[(self._rotation + i) % n] for i in range(n)]
        if not self._sharded:
            return order
        if time.monotonic() - self._looked >= EMPTY_SHARD_LOOK_SECONDS:
            # A shard found empty is not woken when jobs reach it while this worker is
            # busy with the others: looked at again now and then, first.
            self._looked = time.monotonic()
            self._forget_empty(*self._sharded.values())
        for shards in self._sharded.values():
            places = [i for i, queue in enumerate(order) if queue in shards]
            ranked = sorted((order[i] for i in places), key=self._rank)
            for i, queue in zip(places, ranked, strict=True):
                order[i] = queue
        return order

    def _forget_empty(self, *groups: set[str]) -> None:
        """Shards of ``groups`` whose last fetch found nothing: rank them as unknown (first)
        and fetch from them at the next round."""
        for shards in groups:
            for queue in shards:
                if queue in self._top and self._top[queue] is None:
                    del self._top[queue]
                    self._more[queue] = True

    def _rank(self, queue: str) -> int:
        if queue not in self._top:
            return -10  # never fetched from: first
        top = self._top[queue]
        return 1 if top is None else -top

    def _fetched(self, queue: str, fetched: calls.Fetched, want: int, wakes: int,
                 sent: float) -> None:
        """Learn from a fetch's reply what ``queue`` holds now (``sent``: when it was sent,
        local monotonic time)."""
        self._waiting.offered(queue, fetched.offered)
        self._clock.observe(fetched.now_ms, sent)
        self.next_due[queue] = fetched.next_due_ms
        # A wake-up that came while the fetch was on the wire may be for a job stored
        # after the script ran: look again rather than lose it.
        self._more[queue] = len(fetched.jobs) == want or self._wakes != wakes
        self._held_back[queue] = fetched.held
        self._top[queue] = fetched.top
        if fetched.dead:
            log_dead_at_fetch(queue, fetched.dead)
            self._notices.dead(queue, fetched.dead)
        if fetched.trimmed:
            self._notices.trimmed(queue, fetched.trimmed)
        if fetched.expired:
            self._notices.expired(queue, fetched.expired)

    async def _fetch(self, queue: str, free: int) -> tuple[calls.Fetched, int]:
        """Fetch from ``queue`` up to ``free`` jobs, or send again the fetch whose reply was
        lost (see :mod:`.doubt`: it may have leased jobs that nobody else will run); the
        reply and how many jobs the call asked for. The worker's own overdue heartbeats in
        ``queue`` go first, so that the fetch reclaims no lease this worker still holds."""
        await self._catch_up(queue)
        doubt = self._fetches.get(queue)
        if doubt is not None:
            call, want = doubt.call, doubt.carried
        else:
            ttl = WAITER_TTL_MS if self._waiting.enabled else 0  # 0: registers nothing
            call, want = calls.fetch(self._keys(queue), free, self._limits,
                                     worker=self._worker_id, waiter_ttl_ms=ttl), free
        fetched: calls.Fetched = await self._fetches.send(self._runner, queue, call, want)
        return fetched, want

    def _fetch_failed(self, queue: str, exc: BaseException) -> None:
        """A fetch from ``queue`` failed: Redis unreachable, or refusing (out of memory, a
        key of this queue written over by hand). The worker keeps serving the jobs in hand
        and its other queues, and tries this one again after a pause that grows with each
        failure in a row (one queue's trouble, a key or a Cluster node of its own, must not
        stop the others)."""
        pause = self._fetch_backoff.failed(queue)
        self._more[queue] = True
        log.warning("could not fetch jobs from queue %s (%s: %s); retrying it in %.2f s",
                    queue, type(exc).__name__, exc, pause)

    def take_handed(self, queue: str, handed: calls.Fetched) -> list[calls.Leased]:
        """Start jobs an enqueue handed to this worker; returns those beyond its free slots
        (or all, once stopping), which the caller hands back, and those whose lease ended
        while the entry waited (a stopped process): never run, they are handed back too,
        their attempts refunded (a lease reclaimed meanwhile refuses the hand-back)."""
        self._clock.passed(handed.now_ms)  # the entry may have waited in its list
        if handed.dead:
            log_dead_at_fetch(queue, handed.dead)
            self._notices.dead(queue, handed.dead)
        if handed.trimmed:
            self._notices.trimmed(queue, handed.trimmed)
        if handed.next_due_ms is not None:  # a deadline: the fetch then cancels the run
            self.due_at(queue, handed.next_due_ms)
        jobs = [j for j in handed.jobs
                if self._clock.seconds_until(handed.now_ms + j.visibility_ms) > 0]
        ended = [j for j in handed.jobs if j not in jobs]
        if ended:
            log.warning("%d job(s) of %s were handed over %.1f s ago: their leases have ended;"
                        " handing them back", len(ended), queue,
                        -self._clock.seconds_until(handed.now_ms))
        rest = jobs if self._stopping() else self.slots.take(queue, jobs)
        returned = {id(leased) for leased in rest}
        for leased in jobs:
            if id(leased) not in returned:
                # As a fetch's next due time would: look again when the lease ends, in
                # case this run stalls past it.
                self.due_at(queue, handed.now_ms + leased.visibility_ms)
        # Jobs are handed over only to a worker that found none ready: gather no longer.
        self.slots.batches.fetched(queue, drained=True)
        return ended + rest

    def _is_due(self, queue: str) -> bool:
        due = self.next_due.get(queue)
        return due is not None and self._clock.seconds_until(due) <= 0

    async def _sleep(self) -> None:
        """Wait for a wake-up, a free slot, or the earliest due time, whichever comes first."""
        timeout = None
        dues = [d for d in self.next_due.values() if d is not None]
        room = any(self.slots.free(queue) > 0 for queue in self.queues)
        if dues and room:
            # A full worker cannot act on a due time (it would wake at once, again and again,
            # once the time has passed); a finishing job nudges it instead.
            timeout = max(0.0, self._clock.seconds_until(min(dues)))
        if self.slots.held and not any(self._more.values()):
            # Busy but the queues looked empty: look again now and then for new work.
            timeout = WAKE_BLOCK_SECONDS if timeout is None else min(timeout, WAKE_BLOCK_SECONDS)
        retry = self._fetch_backoff.next_retry()
        if retry is not None and room:  # a failed queue's next try
            timeout = retry if timeout is None else min(timeout, retry)
        if not self.nudge.is_set():
            self.idle.set()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.nudge.wait(), timeout)
        finally:
            self.idle.clear()

    # -- what others tell it ---------------------------------------------------------------

    def serve(self, queues: Sequence[str]) -> None:
        """Serve ``queues`` as well (new shards of a sharded queue): look at them now."""
        for queue in queues:
            if queue not in self._more:
                self.queues.append(queue)
                self.next_due[queue] = None
            self._more[queue] = True
        self._group()
        self._wake()

    def _group(self) -> None:
        groups: dict[str, set[str]] = {}
        for queue in self.queues:
            groups.setdefault(base_queue(queue), set()).add(queue)
        self._sharded = {base: shards for base, shards in groups.items() if len(shards) > 1}

    def wake_all(self) -> None:
        """Look at every queue again now (a wake marker arrived, or Redis came back)."""
        self._forget_empty(*self._sharded.values())
        for queue in self.queues:
            self._more[queue] = True
        self._wakes += 1
        self._wake()

    def _wake(self) -> None:
        """Wake the consumer; it is no longer idle until it has fetched and sleeps again."""
        self.idle.clear()
        self.nudge.set()

    def look_again(self, queue: str) -> None:
        """``queue`` has ready jobs: fetch from it at the next chance."""
        self._forget_empty({queue})  # (found empty before: it ranks as unknown again)
        self._more[queue] = True
        self._wakes += 1
        self._wake()

    def nodes_ready(self, queue: str) -> None:
        """A hand-over made workflow nodes ready in ``queue``."""
        if queue in self._more:
            self.look_again(queue)

    def freed(self, queue: str, empty: bool) -> None:
        """A run of a job of ``queue`` ended (``empty``: no job is held now)."""
        self._more[queue] = self._more[queue] or empty
        self._wake()

    def due_at(self, queue: str, due_ms: float) -> None:
        """Something in ``queue`` (a delayed job, a lease deadline) is due at ``due_ms``."""
        known = self.next_due.get(queue)
        if known is None or due_ms < known:
            self.next_due[queue] = due_ms
            self.nudge.set()
