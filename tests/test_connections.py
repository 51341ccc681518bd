"""Connections that misbehave, through a real TCP proxy in front of a real redis-server:
a half-open connection is noticed within seconds, and a worker comes back after one."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis
import redis.asyncio

import conveyor
import conveyor.clients
from conveyor.clients import SOCKET_TIMEOUT
from conveyor.faults.proxy import Proxy
from helpers import RedisServer, running_worker


def test_the_proxy_forwards_resets_and_black_holes(redis_server: RedisServer) -> None:
    with Proxy(("127.0.0.1", redis_server.port)) as proxy:
        client = redis.Redis(port=proxy.port, socket_timeout=1)
        assert client.ping()
        # Hold the connection across the reset: a pool checks a connection it hands out
        # and quietly reconnects a dead one, which would hide the reset.
        connection = client.connection_pool.get_connection()
        proxy.reset()
        with pytest.raises(redis.exceptions.ConnectionError):
            connection.send_command("PING")
            connection.read_response()
        client.connection_pool.release(connection)
        proxy.blackhole()
        fresh = redis.Redis(port=proxy.port, socket_timeout=0.5)
        with pytest.raises(redis.exceptions.TimeoutError):
            fresh.ping()
        proxy.heal()
        assert redis.Redis(port=proxy.port, socket_timeout=1).ping()


def test_a_half_open_connection_is_noticed_within_seconds(redis_server: RedisServer,
                                                          namespace: str) -> None:
    with Proxy(("127.0.0.1", redis_server.port)) as proxy:
        app = conveyor.Conveyor(proxy.url, namespace=namespace)
        try:
            assert app.redis.ping()
            proxy.blackhole()  # the peer vanished without a word
            began = time.monotonic()
            with pytest.raises(redis.exceptions.RedisError):
                app.redis.ping()
            assert time.monotonic() - began < SOCKET_TIMEOUT * 3  # not TCP's 15 minutes
        finally:
            proxy.heal()
            app.close()


def test_a_worker_comes_back_after_a_black_hole(redis_server: RedisServer) -> None:
    namespace = f"c{uuid.uuid4().hex[:8]}"
    direct = conveyor.Conveyor(redis_server.url, namespace=namespace)
    with Proxy(("127.0.0.1", redis_server.port)) as proxy:
        through = conveyor.Conveyor(proxy.url, namespace=namespace)
        for app in (direct, through):
            app.task(name="double", queue="q")(lambda n: 2 * n)
        try:
            with running_worker(through, queues=["q"], concurrency=2):
                assert direct.job(direct.tasks["double"].enqueue(1).id).result(timeout=10) == 2
                proxy.blackhole()
                jobs = [direct.tasks["double"].enqueue(n) for n in range(10)]
                time.sleep(2)  # the outage
                proxy.heal()
                assert [j.result(timeout=SOCKET_TIMEOUT * 4) for j in jobs] == [
                    2 * n for n in range(10)]
        finally:
            through.close()
            direct.close()


@pytest.mark.parametrize("args", [
    ("SET", "k", "é"),
    ("EVALSHA", "a" * 40, 2, "x", b"\x00\xff", 1.5, -3, ""),
    ("SET", "k", memoryview(b"view")),  # hiredis refuses it: redis-py's path copies it
    ("SET", bytearray(b"k"), b"v"),
    ("CONFIG GET", "maxmemory"),  # a two-word name is split
    (b"GET", "k"),
])
def test_async_connections_pack_commands_as_redis_py_does(args: tuple[object, ...]) -> None:
    ours = conveyor.clients.HiredisPackedConnection().pack_command(*args)
    theirs = redis.asyncio.connection.Connection().pack_command(*args)
    assert b"".join(ours) == b"".join(theirs)


def test_the_async_client_sends_what_it_packs(redis_server: RedisServer) -> None:
    async def main() -> list[object]:
        client = conveyor.clients.async_client(redis_server.url)
        try:
            await client.set("packed", memoryview(b"\x00\xff"))
            await client.execute_command("HSET", "h", "f", 2.5, "n", 7)
            return [await client.get("packed"), await client.hgetall("h"),
                    await client.config_get("maxmemory")]
        finally:
            await client.aclose()

    raw, mapping, config = asyncio.run(main())
    assert raw == b"\x00\xff"
    assert mapping == {b"f": b"2.5", b"n": b"7"}
    assert list(config) == [b"maxmemory"] or list(config) == ["maxmemory"]
