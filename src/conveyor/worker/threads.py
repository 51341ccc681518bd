"""A thread pool for sync task bodies, built for many short calls.

``concurrent.futures`` wakes the event loop once per finished call and starts a thread
for every call that finds none idle. Here, a thread starts only when calls have waited
a little (``GROW_AFTER``) with every thread busy: short tasks are served by a few threads,
which fight less over the GIL, while slow blocking tasks still get up to ``max_threads``.
Finished calls reach the loop in batches: one wake-up for all that finished since the
last one.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any

_STOP = object()
GROW_AFTER = 0.002  # seconds calls may wait for a busy thread before another one starts


class ThreadRunner:
    """Runs calls on up to ``max_threads`` daemon threads and hands their results to
    callbacks on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_threads: int,
                 name: str = "conveyor-task") -> None:
        self._loop = loop
        self._max = max_threads
        self._name = name
        self._inbox: SimpleQueue[Any] = SimpleQueue()
        self._done: deque[tuple[Callable[[Any], None], bool, Any]] = deque()
        self._lock = threading.Lock()
        self._delivery_scheduled = False
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._closed = False
        self._grow_scheduled = False

    @property
    def threads(self) -> int:
        return len(self._threads)

    def call(self, fn: Callable[[Any], Any], arg: Any, on_done: Callable[[Any], None]) -> None:
        """Run ``fn(arg)`` in a thread and pass what it returns to ``on_done`` on the loop.

        Meant for calls that return their outcome rather than raise (an exception is
        reported to the loop's exception handler); no future is made per call.
        """
        self._inbox.put((on_done, fn, arg))
        if not self._threads:
            self._grow()
        elif not self._grow_scheduled and self._inbox.qsize() > self._idle:
            # More calls waiting than idle threads (not just "no idle thread": a batch that
            # arrives while one thread idles would otherwise run one call at a time).
            self._grow_scheduled = True
            self._loop.call_later(GROW_AFTER, self._grow_if_waiting)

    def _grow_if_waiting(self) -> None:
        self._grow_scheduled = False
        if self._inbox.qsize() > self._idle:
            self._grow()
            if len(self._threads) < self._max:  # still behind: look again soon
                self._grow_scheduled = True
                self._loop.call_later(GROW_AFTER, self._grow_if_waiting)

    def _grow(self) -> None:
        with self._lock:
            if len(self._threads) >= self._max or self._closed:
                return
            self._idle += 1  # counted idle until it takes its first call
        thread = threading.Thread(target=self._serve, name=f"{self._name}-{len(self._threads)}",
                                  daemon=True)
        self._threads.append(thread)
        thread.start()

    def _serve(self) -> None:
        while True:
            item = self._inbox.get()
            if item is _STOP:
                return
            with self._lock:
                self._idle -= 1
            on_done, fn, arg = item
            try:
                outcome = (True, fn(arg))
            except BaseException as exc:  # reported on the loop
                outcome = (False, exc)
            with self._lock:
                self._idle += 1
                self._done.append((on_done, *outcome))
                wake = not self._delivery_scheduled
                self._delivery_scheduled = True
            if wake:
                try:
                    self._loop.call_soon_threadsafe(self._deliver)
                except RuntimeError:  # the loop is closed: nobody waits for the result
                    return

    def _deliver(self) -> None:
        with self._lock:
            done, self._done = self._done, deque()
            self._delivery_scheduled = False
        for on_done, ok, value in done:
            if ok:
                on_done(value)
            else:
                self._loop.call_exception_handler(
                    {"message": "a threaded call raised", "exception": value})

    def shutdown(self) -> None:
        """Let idle threads exit; a thread still running a call ends when the call does."""
        self._closed = True
        for _ in self._threads:
            self._inbox.put(_STOP)
