"""Waiting for Redis when a worker starts: one clear line, not a traceback per loop.

A worker started before its Redis (a deploy that brings both up, a Redis restarting)
says once that it cannot reach it, naming the URL (without the password), the cause and
what to check, then tries again with back-off, saying so at most every :data:`SAY_EVERY`
seconds, and says when it got through. Only then do its loops start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from ..unreachable import cause, describe
from ..urls import public_url
from .backoff import REDIS_ERRORS, pause_after

log = logging.getLogger("conveyor.worker")
SAY_EVERY = 30.0  # seconds between "still cannot reach" lines


async def wait_for_redis(client: Any, url: str, stop: asyncio.Event) -> bool:
    """Until Redis answers a PING (True), or ``stop`` is set first (False)."""
    failures = 0
    began = said = time.monotonic()
    while not stop.is_set():
        try:
            await client.ping()
        except REDIS_ERRORS as exc:
            failures += 1
            now = time.monotonic()
            if failures == 1:
                log.error("%s. Trying again until it answers", describe(exc, url),
                          extra={"redis": public_url(url)})
            elif now - said >= SAY_EVERY:
                said = now
                log.warning("still cannot reach Redis at %s after %.0f s: %s",
                            public_url(url), now - began, cause(exc)[0])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), pause_after(failures))
            continue
        if failures:
            log.warning("reached Redis at %s after %.0f s", public_url(url),
                        time.monotonic() - began)
        return True
    return False
