"""Redis clients as conveyor makes them.

redis-py's asyncio connection packs commands in Python, which costs more than the rest of
a worker's per-batch work for script calls with hundreds of arguments; with hiredis
installed (a dependency), this packs them in C, as the sync client already does.

A URL whose scheme ends in ``+cluster`` (``redis+cluster://host:port/0``,
``rediss+cluster://...``) names one startup node of a Redis Cluster: the clients are then
redis-py's cluster clients, which discover the other nodes and route each command to the
node owning its key's slot. Every key of a queue carries the queue's hash tag, so each
script call lands on one node.

A URL whose scheme ends in ``+sentinel`` names Redis Sentinels, a service and a database:
``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db][?client_name=x]``
(``rediss+sentinel://`` for TLS to the servers and the sentinels, both with the URL's TLS
options). The clients then ask
the sentinels for the current primary and follow it across failovers. ``client_name``
names the connections to the servers (``CLIENT LIST`` shows it), as in a plain URL.

redis-py's Sentinel clients ask the sentinels only when they open a connection, and an
open connection learns of a failover only from an error. A Sentinel failover leaves the
old primary taking writes for seconds after the sentinels named the new one (until they
demote it), and those writes are lost; so conveyor's Sentinel clients ask the sentinels
again at most once a second when they hand out a connection, and close their idle
connections to a primary the sentinels replaced.

Every client notices a dead peer within seconds, not after TCP's minutes: connections
time out on connect and on reads (a blocking reader passes a longer ``socket_timeout`` of
its own), use TCP keepalive, and are health-checked with a PING when idle for a while.

TLS options in a URL's query (``rediss://host:6380/0?ssl_ca_certs=ca.pem``) are taken out
and passed typed (:func:`conveyor.urls.split_tls`) to every kind of client alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import hiredis
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.asyncio.connection import Connection as AsyncConnection
from redis.connection import HiredisRespSerializer

from .errors import ConfigurationError
from .scripts import AsyncScriptRunner
from .urls import split_tls


class HiredisPackedConnection(AsyncConnection):
    """An asyncio connection that packs commands with hiredis.

    A command whose name is one word goes to ``hiredis.pack_command`` as it is: a worker's
    ``finish`` carries six arguments per job, and redis-py's serializer first copies them
    all in a generator (to turn a ``memoryview`` into bytes, which hiredis refuses with a
    ``TypeError``: such a command, and a two-word name like ``SCRIPT LOAD``, take its path).
    """

    _serializer = HiredisRespSerializer()

    def pack_command(self, *args: Any) -> list[bytes]:
        name = args[0]
        if type(name) is str and " " not in name:
            with contextlib.suppress(TypeError):
                return [hiredis.pack_command(args)]
        packed: list[bytes] = self._serializer.pack(*args)
        return packed


FOLLOW_SECONDS = 1.0  # a Sentinel client asks the sentinels for the primary this often
_FOLLOW_ERRORS = (redis.exceptions.RedisError, OSError)
# redis-py's Sentinel pools carry no annotations; typed here once.
_SyncSentinelPool: Any = redis.sentinel.SentinelConnectionPool
_AsyncSentinelPool: Any = redis.asyncio.sentinel.SentinelConnectionPool


class FollowingSentinelPool(_SyncSentinelPool):  # type: ignore[misc]
    """A Sentinel pool that notices a failover without waiting for an error: about once a
    second, handing out a connection, it asks the sentinels for the primary; redis-py then
    closes the idle connections to a primary that was replaced."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._asked = time.monotonic()

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        now = time.monotonic()
        if now - self._asked >= FOLLOW_SECONDS:
            self._asked = now
            with contextlib.suppress(*_FOLLOW_ERRORS):  # unreachable: the connect will say
                self.get_master_address()
        return super().get_connection(*args, **kwargs)


class AsyncFollowingSentinelPool(_AsyncSentinelPool):  # type: ignore[misc]
    """:class:`FollowingSentinelPool` for asyncio clients."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._asked = time.monotonic()

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        now = time.monotonic()
        if now - self._asked >= FOLLOW_SECONDS:
            self._asked = now
            with contextlib.suppress(*_FOLLOW_ERRORS):
                await self.get_master_address()
        return await super().get_connection(*args, **kwargs)


class AsyncSentinelClient(redis.asyncio.Redis):
    """The asyncio client of a Sentinel-managed primary: closing it closes its connections
    to the sentinels too, which redis-py's ``master_for`` client leaves open."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            await sentinel.aclose()


CLUSTER_SUFFIX = "+cluster"
SENTINEL_SUFFIX = "+sentinel"
# A command's reply is due within this (every conveyor script is a millisecond or so even
# for thousands of jobs); a half-open connection fails here instead of hanging for good.
SOCKET_TIMEOUT = 10.0
CONNECT_TIMEOUT = 5.0
HEALTH_CHECK_SECONDS = 15  # PING a connection idle this long before using it again
# redis-py's Sentinel classes carry no annotations; typed here once.
_SyncSentinel: Any = redis.sentinel.Sentinel
_AsyncSentinel: Any = redis.asyncio.sentinel.Sentinel
# redis-py's pools raise at 100 connections. A worker's sync tasks may share the app's
# client from as many threads as its concurrency, so the pools here are larger and, when
# full, wait for a connection instead of failing the job.
POOL_SIZE = 1024
POOL_WAIT = 30.0  # seconds a command may wait for a free connection
CLOSE_WAIT = 5.0  # seconds a closing Cluster client waits for its dropped nodes to disconnect


def is_cluster(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (scheme ``redis+cluster`` or
    ``rediss+cluster``)."""
    return urlparse(url).scheme.endswith(CLUSTER_SUFFIX)


def is_sentinel(url: str) -> bool:
    """Whether ``url`` names Redis Sentinels (scheme ``redis+sentinel`` or
    ``rediss+sentinel``)."""
    return urlparse(url).scheme.endswith(SENTINEL_SUFFIX)


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """What a ``redis+sentinel://`` URL names."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    tls: bool
    username: str | None
    password: str | None
    client_name: str | None = None


def _sentinel_query(url: str, query: str) -> str | None:
    """The ``client_name`` of a sentinel URL's query, the only option it takes."""
    try:
        options = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ConfigurationError(f"{url!r}: unreadable query {query!r}") from None
    unknown = sorted(set(options) - {"client_name"})
    if unknown:
        raise ConfigurationError(f"{url!r}: a redis+sentinel:// URL takes only client_name,"
                                 f" not {', '.join(unknown)}")
    names = options.get("client_name")
    return names[-1] if names else None


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Read a ``redis+sentinel://`` URL.

    :raises ConfigurationError: the URL does not name sentinels, a service and a database
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("redis" + SENTINEL_SUFFIX, "rediss" + SENTINEL_SUFFIX):
        raise ConfigurationError(f"not a redis+sentinel:// URL: {url!r}")
    rest, _, query = rest.partition("?")
    client_name = _sentinel_query(url, query)
    netloc, _, path = rest.partition("/")
    credentials, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = credentials.partition(":")
        username, password = (unquote(user) or None), (unquote(secret) if colon else None)
    sentinels = []
    for item in hosts.split(","):
        host, colon, port = item.strip().rpartition(":")
        if not colon or not host or not port.isdigit():
            raise ConfigurationError(
                f"sentinel {item!r} in {url!r} is not host:port (expected"
                " redis+sentinel://host:port[,host:port...]/service[/db])")
        sentinels.append((host.strip("[]"), int(port)))
    parts = [p for p in path.split("/") if p]
    if not parts or len(parts) > 2:
        raise ConfigurationError(f"{url!r} must name a service: .../<service>[/<db>]")
    if len(parts) == 2 and not parts[1].isdigit():
        raise ConfigurationError(f"database {parts[1]!r} in {url!r} is not a number")
    return SentinelTarget(tuple(sentinels), unquote(parts[0]),
                          int(parts[1]) if len(parts) == 2 else 0,
                          scheme.startswith("rediss"), username, password, client_name)


def _health(options: dict[str, Any], tls: dict[str, Any]) -> dict[str, Any]:
    """Connection defaults that notice a dead peer, and the URL's TLS options; the caller's
    options win."""
    for name, value in tls.items():
        options.setdefault(name, value)
    options.setdefault("socket_timeout", SOCKET_TIMEOUT)
    options.setdefault("socket_connect_timeout", CONNECT_TIMEOUT)
    options.setdefault("socket_keepalive", True)
    options.setdefault("health_check_interval", HEALTH_CHECK_SECONDS)
    return options


def _sentinel_options(target: SentinelTarget, options: dict[str, Any],
                      tls: dict[str, Any]) -> dict[str, Any]:
    sentinel_kwargs = {k: options[k] for k in ("socket_timeout", "socket_connect_timeout")}
    if target.tls:  # the sentinels and the servers share the TLS options
        sentinel_kwargs.update(tls, ssl=True)
        options["ssl"] = True
    if target.username:
        options["username"] = target.username
    if target.password:
        options["password"] = target.password
    if target.client_name:
        options["client_name"] = target.client_name
    options["db"] = target.db
    return sentinel_kwargs


def _node_url(url: str) -> str:
    """The startup node's plain URL: the scheme without ``+cluster``, database 0 (the only
    one a cluster has)."""
    parts = urlparse(url)
    if parts.path.strip("/") not in ("", "0"):
        raise ConfigurationError(f"a Redis Cluster has only database 0, not {parts.path!r}")
    return parts._replace(scheme=parts.scheme.removesuffix(CLUSTER_SUFFIX), path="").geturl()


def sync_client(url: str, **options: Any) -> Any:
    """A ``redis.Redis`` (or ``redis.cluster.RedisCluster``) for ``url``, replies as bytes."""
    url, tls = split_tls(url)
    _health(options, tls)
    if is_cluster(url):
        options.pop("health_check_interval")  # the cluster client checks its nodes itself
        return redis.cluster.RedisCluster.from_url(_node_url(url), **options)
    if is_sentinel(url):
        target = parse_sentinel_url(url)
        sentinel_kwargs = _sentinel_options(target, options, tls)
        sentinel = _SyncSentinel(list(target.sentinels),
                                           sentinel_kwargs=sentinel_kwargs, **options)
        return sentinel.master_for(target.service, connection_pool_class=FollowingSentinelPool,
                                   **options)
    options.setdefault("max_connections", POOL_SIZE)
    options.setdefault("timeout", POOL_WAIT)
    # from_pool: the client owns its pool, so closing the client closes its connections
    return redis.Redis.from_pool(redis.BlockingConnectionPool.from_url(url, **options))


class AsyncClusterClient(redis.asyncio.cluster.RedisCluster):
    """redis-py's asyncio Cluster client, whose ``aclose`` also waits (a few seconds at
    most) for the disconnects of nodes a topology refresh dropped: redis-py starts them as
    background tasks and does not wait, so a loop that ends right after the close would
    leave their sockets open."""

    async def aclose(self) -> None:
        await super().aclose()
        pending = list(getattr(self.nodes_manager, "_background_tasks", ()))
        if pending:
            await asyncio.wait(pending, timeout=CLOSE_WAIT)


def async_client(url: str, **options: Any) -> Any:
    """A ``redis.asyncio.Redis`` for ``url`` (replies as bytes), packing in C on TCP; a
    ``redis.asyncio.cluster.RedisCluster`` for a cluster URL (its nodes make their own
    connections, with redis-py's packing); a client of the current primary for a sentinel
    URL."""
    url, tls = split_tls(url)
    _health(options, tls)
    if is_cluster(url):
        options.pop("health_check_interval")
        return AsyncClusterClient.from_url(_node_url(url), **options)
    if is_sentinel(url):
        target = parse_sentinel_url(url)
        sentinel_kwargs = _sentinel_options(target, options, tls)
        sentinel = _AsyncSentinel(list(target.sentinels),
                                                   sentinel_kwargs=sentinel_kwargs, **options)
        return sentinel.master_for(target.service, redis_class=AsyncSentinelClient,
                                   connection_pool_class=AsyncFollowingSentinelPool, **options)
    if urlparse(url).scheme == "redis":
        options.setdefault("connection_class", HiredisPackedConnection)
    options.setdefault("max_connections", POOL_SIZE)
    options.setdefault("timeout", POOL_WAIT)
    pool = redis.asyncio.BlockingConnectionPool.from_url(url, **options)
    return redis.asyncio.Redis.from_pool(pool)  # owns its pool: aclose() disconnects it


class PerLoop:
    """An app's asyncio clients: one client (and its script runner) per event loop, since
    a connection belongs to the loop that opened it. A loop that is gone drops its pair."""

    def __init__(self) -> None:
        self._pairs: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[Any, AsyncScriptRunner]
        ] = weakref.WeakKeyDictionary()

    def get(self, url: str) -> tuple[Any, AsyncScriptRunner]:
        """The running loop's client and script runner, made for ``url`` on first use."""
        loop = asyncio.get_running_loop()
        pair = self._pairs.get(loop)
        if pair is None:
            client = async_client(url)
            pair = (client, AsyncScriptRunner(client))
            self._pairs[loop] = pair
        return pair

    async def aclose(self) -> None:
        """Close the running loop's client."""
        pair = self._pairs.pop(asyncio.get_running_loop(), None)
        if pair is not None:
            await pair[0].aclose()
