"""What the async transport does differently from the sync one, for real (hand-written,
as its twin ``_sync/io.py``; ``transport.py`` beside it imports these names from here, and
the sync transport generated from it imports the same names from its own ``io``)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from redis.commands.core import AsyncScript as Script
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["Pipelines", "Script", "exchange", "pipelines_scripts", "sent_later"]

# An asyncio read_response given this timeout arms no timer of its own (redis-py >= 8; an
# older one arms one that never fires): the caller's deadline bounds it instead.
_NO_TIMER = math.inf


def pipelines_scripts(client: Any) -> bool:
    """Whether ``client``'s pipelines take script calls: an asyncio cluster client has no
    connection pool of its own, and its pipelines refuse EVALSHA."""
    return hasattr(client, "connection_pool")


def sent_later(client: Any) -> bool:
    """Never on asyncio: ``run`` sends on the ``client`` it is given, and awaits the reply."""
    return False


class Pipelines:
    """Nothing here: only the sync runner adds calls to a pipeline of the caller's
    (``queue``)."""


async def exchange(conn: Any, message: bytes, queued: int) -> list[Any]:
    """Send a packed MULTI and read every reply; EXEC's, or the error that aborted it.

    One deadline bounds the whole exchange (the connection's socket timeout): redis-py's
    own arms and disarms a timer for each of the replies, which cost more than the rest of
    an async enqueue's Python."""
    try:
        async with asyncio.timeout(conn.socket_timeout):
            await conn.send_packed_command([message])
            refused = None
            for _ in range(queued):
                try:
                    await conn.read_response(timeout=_NO_TIMER)
                except ResponseError as exc:
                    refused = refused or exc
            try:
                reply = await conn.read_response(timeout=_NO_TIMER)
            except ResponseError as exc:
                raise refused or exc from None
    except TimeoutError as exc:  # the deadline passed; redis-py's error, as its own read's
        raise RedisTimeoutError(f"no reply to a plain enqueue within {conn.socket_timeout} s"
                                ) from exc
    return reply  # type: ignore[no-any-return]
