"""Redis clients as conveyor makes them.

redis-py's asyncio connection packs commands in Python, which costs more than the rest of
a worker's per-batch work for script calls with hundreds of arguments; with hiredis
installed (a dependency), this packs them in C, as the sync client already does.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

import redis
import redis.asyncio
from redis.asyncio.connection import Connection as AsyncConnection
from redis.connection import HiredisRespSerializer


class HiredisPackedConnection(AsyncConnection):
    """An asyncio connection that packs commands with hiredis."""

    _serializer = HiredisRespSerializer()

    def pack_command(self, *args: Any) -> list[bytes]:
        packed: list[bytes] = self._serializer.pack(*args)
        return packed


def sync_client(url: str, **options: Any) -> Any:
    """A ``redis.Redis`` for ``url`` (replies as bytes)."""
    return redis.Redis.from_url(url, **options)


def async_client(url: str, **options: Any) -> Any:
    """A ``redis.asyncio.Redis`` for ``url`` (replies as bytes), packing in C on TCP."""
    if urlparse(url).scheme == "redis":
        options.setdefault("connection_class", HiredisPackedConnection)
    return redis.asyncio.Redis.from_url(url, **options)
