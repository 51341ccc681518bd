"""Jobs handed to an idle worker by the enqueue itself (see ``scripts/include/handoff.lua``).

Before it blocks, an idle worker with free slots registers as a waiter of each queue it
blocks on, offering its free slots; it then blocks on its own hand-off lists as well as the
wake keys. An enqueue that finds the registration leases the new jobs to this worker
inside the same script and pushes them onto the list, so the blocking pop returns jobs
ready to run: a job starts without the fetch round trip a wake marker costs.

A registration serves one enqueue. Each fetch of the worker replaces it (the slots it
offered are being filled), offering the slots the fetch left free: a worker that finds a
queue empty is registered by that very fetch, at no extra cost. After a hand-off the
worker registers again before it blocks again. The server keeps one registration per
worker and queue, so the worker's fetches and its listener may both renew it.

A registration lapses :data:`WAITER_TTL_MS` after it was made or last renewed, and the
worker renews its registrations every :data:`RENEW_EVERY` seconds (:func:`keep_renewed`:
one ``ZADD`` per queue, in one round trip, about 12 commands a minute per queue while
idle). So a worker killed (SIGKILL, the OOM killer) or stopped (SIGSTOP) while registered
is handed nothing more a few seconds later: enqueues go to a live waiter, or wake one. A
job handed to it before that and never taken off its hand-off list is not charged an
attempt: when its lease ends, the fetch that reclaims it finds it still on the list and
puts it back as it was (``scripts/include/maintain.lua``). A stopping worker unregisters
and hands back whatever is still on its lists.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..clock import ServerClock
from ..keys import QueueKeys
from ..scripts import calls
from .backoff import REDIS_ERRORS, pause_after
from .doubt import InDoubt

log = logging.getLogger("conveyor.worker")
WAITER_TTL_MS = 9_000  # a registration lapses this long after it was made or renewed
RENEW_EVERY = 6.0  # seconds between renewals (the rest of the TTL covers a late one)
RENEW_TOGETHER = 1.0  # seconds: registrations due this close are renewed in one round trip


@dataclass(eq=False, slots=True)
class Offer:
    """A registration of the worker in one queue, as the worker last set it."""

    slots: int
    renewed: float  # time.monotonic() when its lapse was last set (made, renewed)


class Waiting:
    """One worker's registrations as a waiter, per queue, as far as the worker knows them
    (a hand-off or the worker's own fetch changes them; the server keeps one per worker).

    :param keys: the queues' key names (``app.keys``)
    :param worker_id: names the worker in the registrations and its hand-off lists
    """

    def __init__(self, keys: Any, worker_id: str) -> None:
        self._keys = keys
        self.worker_id = worker_id
        self._offers: dict[str, Offer] = {}
        self._doubts: InDoubt[str] = InDoubt()  # per queue: a registration in doubt
        #: whether the worker takes hand-offs (a burst worker, which leaves once the queues
        #: are empty, does not)
        self.enabled = True

    def lists(self, queues: Iterable[str]) -> dict[str, str]:
        """Hand-off list name -> queue, for ``queues``."""
        return {self._queue_keys(q).handoff(self.worker_id): q for q in queues}

    def _queue_keys(self, queue: str) -> QueueKeys:
        keys: QueueKeys = self._keys(queue)
        return keys

    async def register(self, runner: Any, queues: Sequence[str], slots: int) -> float | None:
        """Offer ``slots`` to the next enqueue of each of ``queues`` where no registration
        offers at most that many; the server time (ms) if any was made."""
        now = None
        for queue in queues if self.enabled else ():
            offer = self._offers.get(queue)
            if offer is not None and offer.slots <= slots and queue not in self._doubts:
                continue
            doubt = self._doubts.get(queue)
            if doubt is None:
                call = calls.register_waiter(self._queue_keys(queue), self.worker_id, slots,
                                             WAITER_TTL_MS)
                offering = slots
            else:  # its reply was lost: the same call again (see .doubt)
                call, offering = doubt.call, doubt.carried
            now = await self._doubts.send(runner, queue, call, offering)
            self.offered(queue, offering)
        return now

    def offered(self, queue: str, slots: int) -> None:
        """The registration in ``queue`` now offers ``slots`` (0: there is none): a fetch
        replaced it, or a hand-off used it."""
        if slots > 0:
            self._offers[queue] = Offer(slots, time.monotonic())
        else:
            self._offers.pop(queue, None)

    def next_renewal(self) -> float:
        """Seconds until a registration is due to be renewed (:data:`RENEW_EVERY` when
        there is none: one made meanwhile is not due before that)."""
        now = time.monotonic()
        return max(0.0, min((o.renewed + RENEW_EVERY - now for o in self._offers.values()),
                            default=RENEW_EVERY))

    async def renew(self, client: Any, now_ms: float) -> None:
        """Make the registrations due for it lapse :data:`WAITER_TTL_MS` after ``now_ms``
        (the server's clock as the worker reads it); one a fetch or a registration set
        lately is not due. One that is gone (a hand-off used it; it lapsed and another
        worker removed it) is not made again here, only forgotten: the wake listener
        registers again before it next waits, and until then an enqueue wakes a worker."""
        began = time.monotonic()
        due = {queue: offer for queue, offer in self._offers.items()
               if offer.renewed + RENEW_EVERY - RENEW_TOGETHER <= began}
        if not due:
            return
        async with client.pipeline(transaction=False) as pipe:
            for queue in due:
                pipe.zadd(self._queue_keys(queue).waiters,
                          {self.worker_id: round(now_ms + WAITER_TTL_MS, 3)}, xx=True, ch=True)
            # A waiters key of another type (written over by hand) holds no registration.
            renewed = await pipe.execute(raise_on_error=False)
        for (queue, offer), done in zip(due.items(), renewed, strict=True):
            if self._offers.get(queue) is not offer:
                continue  # replaced meanwhile (a fetch, a hand-off): that one stands
            if done == 1:
                offer.renewed = began
            else:
                del self._offers[queue]

    async def leave(self, client: Any, queues: Sequence[str]) -> dict[str, list[calls.Leased]]:
        """Unregister from ``queues`` and take what is left on their hand-off lists: the
        jobs there are this worker's to hand back (queue -> jobs)."""
        left: dict[str, list[calls.Leased]] = {}
        for queue in queues:
            k = self._queue_keys(queue)
            self._offers.pop(queue, None)
            async with client.pipeline(transaction=True) as pipe:
                pipe.zrem(k.waiters, self.worker_id).hdel(k.waiter_offers, self.worker_id)
                pipe.lrange(k.handoff(self.worker_id), 0, -1).delete(k.handoff(self.worker_id))
                entries = (await pipe.execute())[-2]
            for entry in entries:
                handed = parse(entry)
                if handed is not None:
                    left.setdefault(queue, []).extend(handed.jobs)
        return left


async def keep_renewed(waiting: Waiting, client: Any, clock: ServerClock) -> None:
    """Renew ``waiting``'s registrations as they come due, for the worker's life. A
    renewal that fails is logged and tried again after a pause: meanwhile a registration
    may lapse, and enqueues wake a worker instead of handing it jobs."""
    failures = 0
    while True:
        await asyncio.sleep(waiting.next_renewal())
        try:
            await waiting.renew(client, clock.now() * 1000)
            failures = 0
        except REDIS_ERRORS as exc:
            failures += 1
            log.log(logging.WARNING if failures > 2 else logging.DEBUG,
                    "could not renew the registrations as a waiter (%s: %s)",
                    type(exc).__name__, exc)
            await asyncio.sleep(min(RENEW_EVERY, pause_after(failures)))


def parse(entry: bytes) -> calls.Fetched | None:
    """A hand-off entry, or None (logged) when it is mangled: its jobs, if any, come back
    when their leases expire."""
    try:
        return calls.parse_handoff(entry)
    except (ValueError, IndexError) as exc:
        log.warning("dropped a mangled hand-off entry (%s): %r", exc, entry[:80])
        return None
