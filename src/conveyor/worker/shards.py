"""The worker's side of sharded queues (:mod:`conveyor.sharding`): which shards it serves,
and the rebalancing of each sharded queue's concurrency cap.

At start the worker serves every shard of its queues that may hold jobs; this loop looks
at the layouts again and hands new shards to the worker (a count raised while it runs):
every :data:`LOOK_SECONDS` while the worker works, every :data:`IDLE_LOOK_SECONDS` (the
length of an idle worker's quiet spell) while it has nothing to do, so that an idle
worker sends almost no commands. Jobs without a tenant are spread over every shard, so
the first to reach the queue itself makes its workers busy and the look quick.

A sharded queue with a cap gets a rebalancing round every :data:`ROUND_SECONDS` while its
shares move, less often while they stay put (down to every :data:`QUIET_ROUND_SECONDS`,
or :data:`IDLE_ROUND_SECONDS` while the worker is idle: what nobody waits for is spread
evenly, so a job arriving on any shard starts at once while the cap has room); only one
worker's round runs at a time (the others find the lock taken). A queue without a cap gets
a round only at each look (it removes shares left from a cap). A failed look
or round is logged and tried at the next tick: until then the shards keep the shares they
have, which never add up to more than the cap.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .. import sharding
from .backoff import REDIS_ERRORS

if TYPE_CHECKING:
    from ..app import Conveyor

log = logging.getLogger("conveyor.worker")
LOOK_SECONDS = 2.0  # how often a working worker reads the layouts again
IDLE_LOOK_SECONDS = 20.0  # ... and an idle one (WAKE_BLOCK_SECONDS: its quiet spell)
ROUND_SECONDS = 0.25  # how often a sharded queue's cap is shared out while shares move
QUIET_ROUND_SECONDS = 1.0  # ... and at most this long apart while they stay put
IDLE_ROUND_SECONDS = 5.0  # ... while the worker is idle


class ShardWatch:
    """Knows the shards of ``bases`` a worker serves.

    :param bases: the queues the worker was asked to serve
    :param on_new: called with shards to serve from now on (in the order found)
    :param work: how much the worker has done and holds (a number that changes while it
        works: its runs ended plus the jobs it holds)
    """

    def __init__(self, app: Conveyor, client: Any, runner: Any, bases: Sequence[str],
                 on_new: Callable[[list[str]], None],
                 work: Callable[[], int] = lambda: 0) -> None:
        self._app = app
        self._client = client
        self._runner = runner
        self._bases = list(bases)
        self._on_new = on_new
        self.served: dict[str, list[str]] = {q: [q] for q in self._bases}
        self._capped: dict[str, bool] = dict.fromkeys(self._bases, False)
        self._pause: dict[str, float] = dict.fromkeys(self._bases, ROUND_SECONDS)
        self._due: dict[str, float] = dict.fromkeys(self._bases, 0.0)
        self._work = work
        self._seen_work = work()
        self._idle = True  # nothing done since the last look (the first was at start)

    async def look(self) -> None:
        """Read the layouts; hand the shards not served yet to the worker."""
        found = await sharding.aserved(self._app, self._client, self._bases)
        new: list[str] = []
        for queue, (layout, shards) in found.items():
            self._capped[queue] = layout.concurrency is not None
            known = self.served[queue]
            fresh = [s for s in shards if s not in known]
            if fresh:
                known.extend(fresh)
                new.extend(fresh)
        if new:
            log.info("serving shard(s) %s as well", ", ".join(new))
            self._on_new(new)

    async def first_look(self) -> None:
        """The look at start (a failure is logged: the loop looks again soon)."""
        try:
            await self.look()
        except REDIS_ERRORS as exc:
            log.warning("could not read the layouts of %s (%s: %s); serving the queues"
                        " alone until the next look", ", ".join(self._bases),
                        type(exc).__name__, exc)

    async def _round(self, queue: str) -> None:
        changed = await sharding.rebalance(self._app, self._client, self._runner, queue,
                                           self.served[queue])
        # Shares that moved may move again soon; shares that stayed put are looked at less
        # often (a round taken by another worker leaves the pause as it is).
        if changed:
            self._pause[queue] = ROUND_SECONDS
        elif changed == 0:
            self._pause[queue] = min(IDLE_ROUND_SECONDS if self._idle else QUIET_ROUND_SECONDS,
                                     self._pause[queue] * 2)
        self._due[queue] = time.monotonic() + self._pause[queue]

    async def run(self) -> None:
        """Look at the layouts and share the caps out, for the worker's whole life."""
        looked = time.monotonic()
        while True:
            await asyncio.sleep(ROUND_SECONDS)
            try:
                work = self._work()
                if work != self._seen_work:
                    self._seen_work, self._idle = work, False
                looking = time.monotonic() - looked >= (
                    IDLE_LOOK_SECONDS if self._idle else LOOK_SECONDS)
                if looking:
                    looked = time.monotonic()
                    self._idle = True  # until work shows up
                    await self.look()
                for queue, shards in self.served.items():
                    if len(shards) > 1 and (looking or (
                            self._capped[queue] and time.monotonic() >= self._due[queue])):
                        await self._round(queue)
            except REDIS_ERRORS as exc:
                log.warning("could not look after the shards of %s (%s: %s); trying again in"
                            " %.2f s", ", ".join(self._bases), type(exc).__name__, exc,
                            ROUND_SECONDS)
