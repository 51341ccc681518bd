"""The Redis server's clock: the one module that asks Redis for the time.

Times in conveyor are the server's (a job's enqueue, start and finish stamps, due times,
lease deadlines, heartbeats), so that clock skew between machines changes nothing. Lua
scripts read ``TIME`` through ``scripts/include/clock.lua``; Python code reads it here:

* :func:`server_now` / :func:`aserver_now` send ``TIME`` (one round trip);
* :func:`ask` queues ``TIME`` on a pipeline that reads other things in the same round
  trip, and :func:`from_reply` turns its reply into epoch seconds; :data:`TIME_COMMAND`
  is the same for a message encoded by hand (a plain enqueue's, ``scripts/plain.py``);
* :class:`ServerClock` keeps the offset between the server's clock and the local
  monotonic clock, so a long-lived process (a worker, a supervisor) can tell the server's
  time without asking each time. A worker feeds it the server time its fetch replies
  carry; others :meth:`~ServerClock.refresh` it now and then.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["TIME_COMMAND", "ServerClock", "aserver_now", "ask", "from_reply", "server_now"]

TIME_COMMAND = b"*1\r\n$4\r\nTIME\r\n"
"""``TIME`` encoded for the wire, to append to a message; :func:`from_reply` reads it."""


def from_reply(reply: Any) -> float:
    """Epoch seconds from a ``TIME`` reply (``(seconds, microseconds)``); the local clock
    when the server answers zero, as some Redis-compatible engines do."""
    sec, usec = reply
    return float(sec) + float(usec) / 1e6 if sec else time.time()


def ask(pipe: Any) -> None:
    """Queue ``TIME`` on ``pipe``; :func:`from_reply` reads its reply. (A cluster pipeline
    refuses keyless commands: on a cluster, call :func:`server_now` instead.)"""
    pipe.time()


def server_now(client: Any) -> float:
    """The server's clock now, epoch seconds (one round trip).

    :param client: a synchronous redis-py client (plain, Sentinel or Cluster)
    """
    return from_reply(client.time())


async def aserver_now(client: Any) -> float:
    """The server's clock now, epoch seconds (one round trip).

    :param client: an asyncio redis-py client
    """
    return from_reply(await client.time())


class ServerClock:
    """The server's clock as a process sees it: an offset from the local monotonic clock,
    set by the latest server time observed."""

    def __init__(self) -> None:
        self._offset: float | None = None  # server epoch seconds - local monotonic seconds

    def observe(self, server_ms: float, sent_at: float | None = None) -> None:
        """Record the server time carried by a reply that has just arrived.

        :param sent_at: the local monotonic time the request was sent at. A script reads
            the time when it starts and may run long after (a fetch that expires a
            thousand jobs): anchored at the send, the estimate is off by the way there
            only (a timer then fires a little early, which costs a fetch), never by the
            script's run and the way back (a timer would fire late).
        """
        self._offset = server_ms / 1000 - (time.monotonic() if sent_at is None else sent_at)

    def passed(self, server_ms: float) -> None:
        """Record a time the server's clock has reached by now, from a reply that may have
        waited before it was read: it can only move the estimate forward."""
        if self._offset is None or server_ms / 1000 > self.now():
            self.observe(server_ms)

    def refresh(self, client: Any) -> float:
        """Ask the server for its time (synchronous client) and return it."""
        now = server_now(client)
        self.observe(now * 1000)
        return now

    async def arefresh(self, client: Any) -> float:
        """Ask the server for its time (asyncio client) and return it."""
        now = await aserver_now(client)
        self.observe(now * 1000)
        return now

    def now(self) -> float:
        """Server epoch seconds now (the local wall clock until a reply has been seen)."""
        if self._offset is None:
            return time.time()
        return time.monotonic() + self._offset

    def seconds_until(self, server_ms: float) -> float:
        """Seconds from now until the server's clock reads ``server_ms``."""
        return server_ms / 1000 - self.now()
