"""Progress reports of running jobs, coalesced: a task may report as often as it likes.

``report`` (from any thread) only stores the latest value of a job and, the first time
since the last write, wakes the writer on the event loop. The writer sends what is pending,
one ``progress`` script call per queue, then rests ``INTERVAL`` seconds: at most one write
per job per interval, however many reports came in between. The script checks the lease
token, so a stale or cancelled run's progress is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from ..scripts import calls
from .doubt import InDoubt

log = logging.getLogger("conveyor.worker")
INTERVAL = 0.25  # seconds between writes: at most 4 writes per job per second


class ProgressWriter:
    """Latest progress of held jobs, written to Redis in batches.

    :param runner: the async script runner
    :param keys: queue name -> its key names
    """

    def __init__(self, runner: Any, keys: Callable[[str], Any]) -> None:
        self._loop = asyncio.get_running_loop()
        self._runner = runner
        self._keys = keys
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[Any, float, str]] = {}
        self._woken = False
        self._wake = asyncio.Event()
        # One write at a time, so that a newer value never lands before an older one.
        self._writing = asyncio.Lock()
        self.writes = 0  # job progress fields written (accepted or refused)
        self._doubts: InDoubt[str] = InDoubt()  # per queue: a write whose reply was lost
        self.calls = 0  # script calls sent

    def report(self, held: Any, fraction: float, note: str) -> None:
        """Keep ``fraction`` and ``note`` as the latest progress of ``held``; any thread."""
        with self._lock:
            self._pending[id(held)] = (held, fraction, note)
            wake = not self._woken
            self._woken = True
        if wake:  # a closed loop (the worker stopped) raises RuntimeError: nobody to tell
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._wake.set)

    def forget(self, held: Any) -> None:
        """Drop what ``held`` reported and was not written yet (its run has ended)."""
        with self._lock:
            self._pending.pop(id(held), None)

    async def run(self) -> None:
        """Write pending progress, then rest; for the worker's life (supervised)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.flush()
            await asyncio.sleep(INTERVAL)

    async def flush(self, only: set[tuple[str, str]] | None = None) -> None:
        """Write what is pending now: everything, or the jobs ``only`` names as (queue,
        short id). On a Redis error what was taken is put back (unless newer reports
        replaced it) and the error is raised."""
        async with self._writing:
            await self._write_pending(only)

    async def _write_pending(self, only: set[tuple[str, str]] | None) -> None:
        with self._lock:
            if only is None:
                pending, self._pending = self._pending, {}
                self._woken = False
            else:
                pending = {key: item for key, item in self._pending.items()
                           if (item[0].queue, item[0].leased.short_id) in only}
                for key in pending:
                    del self._pending[key]
        by_queue: dict[str, list[tuple[int, Any, float, str]]] = {}
        for key, (held, fraction, note) in pending.items():
            by_queue.setdefault(held.queue, []).append((key, held, fraction, note))
        if only is None:  # a write in doubt goes again even when nothing new came
            for queue in self._doubts:
                by_queue.setdefault(queue, [])
        queues = list(by_queue)
        for i, queue in enumerate(queues):
            items = by_queue[queue]
            try:
                await self._write(queue, items)
            except BaseException:
                doubt = self._doubts.get(queue)
                if doubt is not None and doubt.carried is items:
                    by_queue[queue] = []  # sent, reply lost: it goes again as it was
                self._put_back([it for q in queues[i:] for it in by_queue[q]])
                raise

    async def _write(self, queue: str, items: list[tuple[int, Any, float, str]]) -> None:
        """Send ``queue``'s write in doubt, if any (an older value first), then ``items``."""
        doubt = self._doubts.get(queue)
        if doubt is not None:
            await self._doubts.send(self._runner, queue, doubt.call)
        if items:
            reports = [(h.leased.short_id, h.leased.token, f, n) for _, h, f, n in items]
            call = calls.progress(self._keys(queue), reports)
            await self._doubts.send(self._runner, queue, call, items)
            self.calls += 1
            self.writes += len(reports)

    def _put_back(self, items: list[tuple[int, Any, float, str]]) -> None:
        """Keep ``items`` for the next write (unless newer reports replaced them) and wake
        the writer for it (also with none: a write in doubt goes again)."""
        with self._lock:
            for key, held, fraction, note in items:
                self._pending.setdefault(key, (held, fraction, note))
            self._woken = True
        self._loop.call_soon(self._wake.set)
