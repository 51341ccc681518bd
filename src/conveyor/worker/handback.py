"""Handing leased jobs back to their queues, their attempts refunded (``calls.release``).

A worker hands back what it leased and will not run: jobs a fetch sent again leased beyond
the free slots, jobs handed over beyond them or after their leases ended, and, on the way
out, the jobs it has not started or had to interrupt.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from ..scripts import calls, max_items
from .backoff import REDIS_ERRORS, pause_after
from .executor import Held

log = logging.getLogger("conveyor.worker")
RELEASE_MOST = max_items("release")  # jobs one release call hands back at most


class HandBack:
    """:param runner: the async script runner
    :param keys: queue name -> its key names
    """

    def __init__(self, runner: Any, keys: Callable[[str], Any]) -> None:
        self._runner = runner
        self._keys = keys

    async def __call__(self, queue: str,
                       leases: Sequence[tuple[str, str] | tuple[str, str, str]],
                       within: float = 10.0) -> None:
        """Hand leased jobs of ``queue`` back (``leases``: short id, token, and the reason
        to note, if any), trying Redis again for up to ``within`` seconds with the same
        call (its reply, if lost, is kept: see :mod:`.doubt`); past that their leases
        expire and they are reclaimed."""
        clock = asyncio.get_running_loop().time
        deadline = clock() + within
        # A stopping worker may hold more than one call may carry (MAX_COMMAND_ARGS).
        for start in range(0, len(leases), RELEASE_MOST):
            part = leases[start:start + RELEASE_MOST]
            call = calls.release(self._keys(queue), part)
            failures = 0
            while True:
                try:
                    await self._runner.run(call)
                    break
                except REDIS_ERRORS as exc:
                    failures += 1
                    if clock() > deadline:
                        log.error("could not hand back %d job(s) of %s (%s); they run again"
                                  " when their leases expire", len(leases) - start, queue, exc)
                        return
                    await asyncio.sleep(pause_after(failures))

    async def held(self, jobs: list[Held], reason: str, within: float = 10.0) -> None:
        """Hand ``jobs`` back to their queues, noting ``reason``, all within ``within``
        seconds."""
        by_queue: dict[str, list[tuple[str, str, str]]] = {}
        for held in jobs:
            lease = (held.leased.short_id, held.leased.token)
            by_queue.setdefault(held.queue, []).append((*lease, reason))
        clock = asyncio.get_running_loop().time
        deadline = clock() + within
        for queue, leases in by_queue.items():
            await self(queue, leases, within=max(0.0, deadline - clock()))
