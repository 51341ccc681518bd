"""A short cache of JSON answers shared by every client of one dashboard process.

Every open dashboard polls the same endpoints every few seconds; with this cache, any
number of them cost Redis what one costs: an answer computed for an endpoint and its
parameters is served to every request for the same within ``seconds``, and requests
that arrive while it is being computed wait for it instead of computing it again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable

MAX_ENTRIES = 1000  # distinct (endpoint, parameters) kept at most


class SharedAnswers:
    """Answers by key, each kept ``seconds`` (0 or less: no caching); thread-safe."""

    def __init__(self, seconds: float = 1.0) -> None:
        self.seconds = seconds
        self.entries: dict[Hashable, tuple[float, bytes]] = {}
        self.computing: dict[Hashable, threading.Lock] = {}
        self.lock = threading.Lock()

    def _fresh(self, key: Hashable) -> bytes | None:
        with self.lock:
            entry = self.entries.get(key)
            return entry[1] if entry is not None and entry[0] > time.monotonic() else None

    def get(self, key: Hashable, compute: Callable[[], bytes]) -> bytes:
        """The answer for ``key``: kept if fresh, else computed once for every waiter."""
        if self.seconds <= 0:
            return compute()
        found = self._fresh(key)
        if found is not None:
            return found
        with self.lock:
            once = self.computing.setdefault(key, threading.Lock())
        with once:
            found = self._fresh(key)
            if found is not None:
                return found
            body = compute()
            with self.lock:
                now = time.monotonic()
                if len(self.entries) >= MAX_ENTRIES:
                    self.entries = {k: e for k, e in self.entries.items() if e[0] > now}
                    self.computing = {k: self.computing[k] for k in self.entries
                                      if k in self.computing}
                self.entries[key] = (now + self.seconds, body)
            return body
