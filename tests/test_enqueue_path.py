"""The enqueue path: what one call sends, counted in round trips.

A bulk enqueue to a queue this process has not used yet registers the queue and stores
every chunk of jobs in one round trip, from the sync and from the async API alike; a
single enqueue to a known queue is one round trip; a server that lost its scripts (a
restart, SCRIPT FLUSH) costs one more, and nothing is lost or stored twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

import conveyor
from helpers import RedisServer, run_async

JOBS = 10_000  # five script calls of 2,000 jobs


class Sends:
    """Round trips of one app: each send of a request (one command or a whole pipeline)
    on its connections, sync and async; the connections are redis-py's own, counting."""

    count = 0


class CountingConnection(redis.Connection):
    def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        Sends.count += 1
        super().send_packed_command(*args, **kwargs)


class CountingAsyncConnection(redis.asyncio.Connection):
    async def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        Sends.count += 1
        await super().send_packed_command(*args, **kwargs)


@pytest.fixture
def counted(redis_server: RedisServer, namespace: str) -> Iterator[conveyor.Conveyor]:
    app = conveyor.Conveyor(redis_server.url, namespace=namespace)
    app.redis.connection_pool.connection_class = CountingConnection
    yield app
    app.close()


def _register(app: conveyor.Conveyor, queue: str = "fresh") -> conveyor.Task[..., int]:
    @app.task(name=f"double.{queue}", queue=queue)
    def double(x: int) -> int:
        return 2 * x

    return double


def _trips(before: int) -> int:
    return Sends.count - before


def test_a_bulk_enqueue_to_a_new_queue_is_one_round_trip_sync(
        counted: conveyor.Conveyor) -> None:
    app = counted
    double = _register(app)
    _register(app, "known").enqueue(0)  # the connection and the scripts exist already
    before = Sends.count
    jobs = double.enqueue_many(range(JOBS))
    assert _trips(before) == 1
    assert len({j.id for j in jobs}) == JOBS
    assert conveyor.Monitor(app).backlog("fresh").ready == JOBS
    assert "fresh" in app.known_queues()
    before = Sends.count
    double.enqueue(1)
    assert _trips(before) == 1


def test_a_bulk_enqueue_to_a_new_queue_is_one_round_trip_async(
        counted: conveyor.Conveyor) -> None:
    app = counted
    double = _register(app)

    async def main() -> tuple[int, int, int]:
        app.aredis().connection_pool.connection_class = CountingAsyncConnection  # this loop's
        await _register(app, "known").aenqueue(0)
        before = Sends.count
        jobs = await double.aenqueue_many(range(JOBS))
        bulk = _trips(before)
        before = Sends.count
        await double.aenqueue(1)
        return bulk, _trips(before), len({j.id for j in jobs})

    bulk, single, distinct = run_async(app, main())
    assert (bulk, single, distinct) == (1, 1, JOBS)
    assert conveyor.Monitor(app).backlog("fresh").ready == JOBS + 1
    assert "fresh" in app.known_queues()


@pytest.mark.parametrize("many", [False, True])
def test_a_server_without_the_scripts_costs_one_more_round_trip_and_loses_nothing(
        counted: conveyor.Conveyor, many: bool) -> None:
    app = counted
    double = _register(app)
    double.enqueue(0)
    app.redis.script_flush()
    before = Sends.count
    if many:
        double.enqueue_many(range(1, 4001))
    else:
        double.enqueue(1)
    assert 2 <= _trips(before) <= 3  # the call, the load, the call again
    assert conveyor.Monitor(app).backlog("fresh").ready == (4001 if many else 2)

    async def again() -> None:
        app.aredis().connection_pool.connection_class = CountingAsyncConnection
        await app.aredis().ping()  # its handshake is not counted
        app.redis.script_flush()
        before = Sends.count
        await double.aenqueue(2)
        assert 2 <= _trips(before) <= 3
        app.redis.script_flush()
        before = Sends.count
        await double.aenqueue_many(range(3))
        assert 2 <= _trips(before) <= 3

    run_async(app, again())
    assert conveyor.Monitor(app).backlog("fresh").ready == (4001 if many else 2) + 4


def test_a_call_is_encoded_as_redis_py_encodes_it_also_from_the_kept_head() -> None:
    from conveyor.scripts import ScriptCall, _Packer, wire

    packer, reference = _Packer(), redis.Connection()
    keys = ("{ns:q}:j:", "{ns:q}:ready:")
    for tail in ([b"id-1", b"\xff\x00payload"], ["id-2", "ünïcode"], [7, 2.5]):
        call: ScriptCall[Any] = ScriptCall("enqueue", keys, ("", 10, 1.25, "task", *tail),
                                           fixed=4)
        forget = "" if tail[0] == 7 else "0123 4567"
        wire_keys, wire_args = wire(call, forget)
        assert wire_keys[-1] == "{ns:q}:reply:"  # the kept reply lives in the call's slot
        expected = b"".join(reference.pack_command("EVALSHA", "abc123", len(wire_keys),
                                                   *wire_keys, *wire_args))
        assert packer.pack(call, "abc123", forget) == expected
    assert len(packer._heads) == 1  # one head, kept for the three calls
