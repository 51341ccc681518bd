"""The worker registry: live workers with a heartbeat, gone when they stop or die."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any

import conveyor
from conveyor import keys as keyspace
from conveyor.clock import ServerClock
from conveyor.worker import registry
from conveyor.worker.registry import keep_registered, live_workers
from helpers import RedisServer, running_worker, wait_until


def test_a_running_worker_is_registered_and_leaves_when_stopped(app: conveyor.Conveyor) -> None:
    with running_worker(app, queues=["reg"], concurrency=7) as worker:
        records = wait_until(lambda: live_workers(app), 5, message="the worker to register")
        (record,) = records
        assert record.id == worker.id and record.pid == os.getpid()
        assert record.queues == ("reg",) and record.concurrency == 7 and record.jobs == 0
        assert abs(record.started_at - time.time()) < 30
        key = keyspace.worker_key(app.namespace, worker.id)
        assert 0 < app.redis.ttl(key) <= 30  # expires unless kept alive
    assert live_workers(app) == []
    assert app.redis.exists(keyspace.worker_key(app.namespace, worker.id)) == 0


def test_readers_prune_dead_workers(app: conveyor.Conveyor) -> None:
    zset = keyspace.workers_key(app.namespace)
    now_ms = int(time.time() * 1000)
    app.redis.zadd(zset, {"long-gone": now_ms - 3_600_000, "hash-expired": now_ms})
    assert live_workers(app) == []
    assert app.redis.zcard(zset) == 0


@dataclass
class StubWorker:
    """What the registry reads of a worker."""

    app: conveyor.Conveyor
    id: str = "stub"
    queues: list[str] = field(default_factory=lambda: ["a", "b"])
    concurrency: int = 3
    held: dict[Any, Any] = field(default_factory=dict)
    processed: int = 0
    stuck: int = 0
    clock: ServerClock = field(default_factory=ServerClock)


def _calls(client: Any, command: str) -> int:
    stats = client.info("commandstats").get(f"cmdstat_{command}")
    return int(stats["calls"]) if stats else 0


async def test_an_unchanged_beat_costs_two_commands(make_server: type[RedisServer]) -> None:
    server = make_server().start()
    app = conveyor.Conveyor(server.url, namespace="beat")
    worker = StubWorker(app)
    client = server.client()
    beats = asyncio.ensure_future(keep_registered(worker, interval=0.05))  # type: ignore[arg-type]
    try:
        await asyncio.sleep(0.6)
        worker.processed = 5  # one field changed: one HSET of that field
        await asyncio.sleep(0.3)
    finally:
        beats.cancel()
        await asyncio.gather(beats, return_exceptions=True)
    expires, zadds = _calls(client, "expire"), _calls(client, "zadd")
    assert expires >= 8 and zadds == expires
    prunes = _calls(client, "zremrangebyscore")  # dead workers' entries: every 6th beat
    assert prunes == -(-expires // registry.PRUNE_EVERY)
    assert _calls(client, "hset") == 2  # the first beat and the change, nothing in between
    assert client.zcard("beat:workers") == 0 and not client.exists("beat:worker:stub")
    await app.aclose()
    app.close()


async def test_a_vanished_hash_is_written_again(make_server: type[RedisServer]) -> None:
    server = make_server().start()
    app = conveyor.Conveyor(server.url, namespace="again")
    client = server.client()
    beats = asyncio.ensure_future(keep_registered(StubWorker(app), interval=0.05))  # type: ignore[arg-type]
    try:
        await asyncio.sleep(0.2)
        client.delete("again:worker:stub")
        await asyncio.sleep(0.2)
        assert client.hget("again:worker:stub", "queues") == b"a,b"
    finally:
        beats.cancel()
        await asyncio.gather(beats, return_exceptions=True)
    await app.aclose()
    app.close()


async def test_live_workers_prune_the_entries_of_killed_ones(
        make_server: type[RedisServer]) -> None:
    server = make_server().start()
    app = conveyor.Conveyor(server.url, namespace="prune")
    client = server.client()
    client.zadd("prune:workers", {"killed": 1000})  # beat long ago, never removed
    beats = asyncio.ensure_future(keep_registered(StubWorker(app), interval=0.05))  # type: ignore[arg-type]
    try:
        for _ in range(100):
            if client.zscore("prune:workers", "killed") is None:
                break
            await asyncio.sleep(0.05)
        assert client.zscore("prune:workers", "killed") is None
        assert client.zscore("prune:workers", "stub") is not None
    finally:
        beats.cancel()
        await asyncio.gather(beats, return_exceptions=True)
        await app.aclose()
        app.close()
