"""Sending one request until it is answered: for calls whose loss would cost work.

A script call names its request (:attr:`~conveyor.scripts.ScriptCall.request`), and the
script keeps its reply under that name, so the same call sent again after a lost reply
(a reset, a timeout) returns the first reply instead of applying twice. An error reply
that means "not now" (out of memory, a replica, loading, busy, a cluster reconfiguring)
means the call did not run, and may be sent again as well. :func:`resend` does both until
a deadline; any other error (a script's own refusal, a bad argument) is raised at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

T = TypeVar("T")
#: error replies that mean the server did not run the call and may run it a moment later
NOT_NOW = ("OOM", "READONLY", "LOADING", "BUSY", "UNBLOCKED", "CLUSTERDOWN", "TRYAGAIN",
           "MASTERDOWN", "NOSCRIPT")
FIRST_PAUSE, MAX_PAUSE = 0.05, 1.0  # seconds between sends: doubling from the first


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` leaves the call worth sending again: its reply was lost (it may have
    run; the same request is safe to send again) or the server said "not now"."""
    if isinstance(exc, (RedisConnectionError, RedisTimeoutError, ConnectionError,
                        TimeoutError)):
        return True
    return isinstance(exc, ResponseError) and str(exc).split(" ", 1)[0] in NOT_NOW


def resend(send: Callable[[], T], seconds: float,
           sleep: Callable[[float], None] = time.sleep) -> T:
    """``send()`` until it returns, for up to ``seconds``; a transient error (see
    :func:`transient`) is waited out with back-off, any other error is raised, and the
    last transient error too once time is up. ``send`` must send the same request each
    time (the same :class:`~conveyor.scripts.ScriptCall` object)."""
    deadline, pause = time.monotonic() + seconds, FIRST_PAUSE
    while True:
        try:
            return send()
        except Exception as exc:
            if not transient(exc) or time.monotonic() + pause > deadline:
                raise
        sleep(pause)
        pause = min(MAX_PAUSE, pause * 2)


async def aresend(send: Callable[[], Awaitable[T]], seconds: float) -> T:
    """The async twin of :func:`resend`."""
    deadline, pause = time.monotonic() + seconds, FIRST_PAUSE
    while True:
        try:
            return await send()
        except Exception as exc:
            if not transient(exc) or time.monotonic() + pause > deadline:
                raise
        await asyncio.sleep(pause)
        pause = min(MAX_PAUSE, pause * 2)
