"""Redis clients as conveyor makes them.

redis-py's asyncio connection packs commands in Python, which costs more than the rest of
a worker's per-batch work for script calls with hundreds of arguments; with hiredis
installed (a dependency), this packs them in C, as the sync client already does.

A URL whose scheme ends in ``+cluster`` (``redis+cluster://host:port/0``,
``rediss+cluster://...``) names one startup node of a Redis Cluster: the clients are then
redis-py's cluster clients, which discover the other nodes and route each command to the
node owning its key's slot. Every key of a queue carries the queue's hash tag, so each
script call lands on one node.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.asyncio.connection import Connection as AsyncConnection
from redis.connection import HiredisRespSerializer

from .errors import ConfigurationError


class HiredisPackedConnection(AsyncConnection):
    """An asyncio connection that packs commands with hiredis."""

    _serializer = HiredisRespSerializer()

    def pack_command(self, *args: Any) -> list[bytes]:
        packed: list[bytes] = self._serializer.pack(*args)
        return packed


CLUSTER_SUFFIX = "+cluster"
# redis-py's pools raise at 100 connections. A worker's sync tasks may share the app's
# client from as many threads as its concurrency, so the pools here are larger and, when
# full, wait for a connection instead of failing the job.
POOL_SIZE = 1024
POOL_WAIT = 30.0  # seconds a command may wait for a free connection


def is_cluster(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (scheme ``redis+cluster`` or
    ``rediss+cluster``)."""
    return urlparse(url).scheme.endswith(CLUSTER_SUFFIX)


def _node_url(url: str) -> str:
    """The startup node's plain URL: the scheme without ``+cluster``, database 0 (the only
    one a cluster has)."""
    parts = urlparse(url)
    if parts.path.strip("/") not in ("", "0"):
        raise ConfigurationError(f"a Redis Cluster has only database 0, not {parts.path!r}")
    return parts._replace(scheme=parts.scheme.removesuffix(CLUSTER_SUFFIX), path="").geturl()


def sync_client(url: str, **options: Any) -> Any:
    """A ``redis.Redis`` (or ``redis.cluster.RedisCluster``) for ``url``, replies as bytes."""
    if is_cluster(url):
        return redis.cluster.RedisCluster.from_url(_node_url(url), **options)
    options.setdefault("max_connections", POOL_SIZE)
    options.setdefault("timeout", POOL_WAIT)
    return redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(url, **options))


def async_client(url: str, **options: Any) -> Any:
    """A ``redis.asyncio.Redis`` for ``url`` (replies as bytes), packing in C on TCP; a
    ``redis.asyncio.cluster.RedisCluster`` for a cluster URL (its nodes make their own
    connections, with redis-py's packing)."""
    if is_cluster(url):
        return redis.asyncio.cluster.RedisCluster.from_url(_node_url(url), **options)
    if urlparse(url).scheme == "redis":
        options.setdefault("connection_class", HiredisPackedConnection)
    options.setdefault("max_connections", POOL_SIZE)
    options.setdefault("timeout", POOL_WAIT)
    pool = redis.asyncio.BlockingConnectionPool.from_url(url, **options)
    return redis.asyncio.Redis(connection_pool=pool)
