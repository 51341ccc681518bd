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
worker and queue, so the worker's fetches and its listener may both renew it. An idle
worker renews its registration only every :data:`RENEW_AFTER` seconds, so waiting costs
almost nothing. A registration lapses by itself: a worker killed while registered is
offered at most one more enqueue's jobs per queue, which are leased like any others and
come back when their leases expire. A stopping worker unregisters and hands back whatever
is still on its lists.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ..keys import QueueKeys
from ..scripts import calls

log = logging.getLogger("conveyor.worker")
WAITER_TTL_MS = 600_000  # a registration lapses after this unless renewed
RENEW_AFTER = 300.0  # seconds: an idle worker renews its registration this often


class Waiting:
    """One worker's registrations as a waiter, per queue, as far as the worker knows them
    (a hand-off or the worker's own fetch changes them; the server keeps one per worker).

    :param keys: the queues' key names (``app.keys``)
    :param worker_id: names the worker in the registrations and its hand-off lists
    """

    def __init__(self, keys: Any, worker_id: str) -> None:
        self._keys = keys
        self.worker_id = worker_id
        self._offers: dict[str, tuple[int, float]] = {}  # queue -> (slots offered, when)
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
        """Offer ``slots`` to the next enqueue of each of ``queues`` where no recent
        registration offers at most that many; the server time (ms) if any was made."""
        now = None
        for queue in queues if self.enabled else ():
            offer = self._offers.get(queue)
            if offer is not None and offer[0] <= slots and \
                    time.monotonic() - offer[1] < RENEW_AFTER:
                continue
            now = await runner.run(calls.register_waiter(
                self._queue_keys(queue), self.worker_id, slots, WAITER_TTL_MS))
            self._offers[queue] = (slots, time.monotonic())
        return now

    def offered(self, queue: str, slots: int) -> None:
        """The registration in ``queue`` now offers ``slots`` (0: there is none): a fetch
        replaced it, or a hand-off used it."""
        if slots > 0:
            self._offers[queue] = (slots, time.monotonic())
        else:
            self._offers.pop(queue, None)

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


def parse(entry: bytes) -> calls.Fetched | None:
    """A hand-off entry, or None (logged) when it is mangled: its jobs, if any, come back
    when their leases expire."""
    try:
        return calls.parse_handoff(entry)
    except (ValueError, IndexError) as exc:
        log.warning("dropped a mangled hand-off entry (%s): %r", exc, entry[:80])
        return None
