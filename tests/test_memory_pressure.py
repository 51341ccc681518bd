"""Every public write under memory pressure: all or nothing, or an error that says exactly
what was written. A private redis-server with ``maxmemory`` and ``noeviction`` is filled
until Redis refuses writes with OOM, as a production server does in an out-of-memory spell.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import conveyor
from helpers import RedisServer, running_worker, wait_until


@pytest.fixture
def tight(make_server: type[RedisServer]) -> Iterator[tuple[RedisServer, conveyor.Conveyor]]:
    server = make_server(extra=["--maxmemory-policy", "noeviction"]).start()
    app = conveyor.Conveyor(server.url, namespace=f"m{uuid.uuid4().hex[:6]}")
    yield server, app
    app.close()


def _squeeze(client: redis.Redis, headroom: int) -> None:
    """Set maxmemory to what is used now plus ``headroom`` bytes."""
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used + headroom)


def _census(client: redis.Redis, app: conveyor.Conveyor, queue: str) -> dict[str, Any]:
    k = app.keys(queue)
    records = list(client.scan_iter(match=k.job_prefix + "*", count=1000))
    ready = sum(client.llen(key) for key in client.scan_iter(match=k.ready_prefix + "*"))
    return {"records": len(records), "ready_listed": ready,
            "ready_count": int(client.hget(k.counts, "ready") or 0)}


def test_a_bulk_enqueue_refused_part_way_names_the_jobs_it_stored(
        tight: tuple[RedisServer, conveyor.Conveyor]) -> None:
    server, app = tight
    client = server.client()

    @app.task(name="bulk", queue="q")
    def bulk(n: int, pad: str) -> None: ...

    bulk.enqueue(0, "")  # the queue is known
    _squeeze(client, 1_500_000)  # room for a chunk or two of these, not for all
    pad = "x" * 200
    with pytest.raises((conveyor.PartialEnqueue, redis.exceptions.OutOfMemoryError)) as caught:
        bulk.enqueue_many([(n, pad) for n in range(20_000)])
    client.config_set("maxmemory", 0)
    census = _census(client, app, "q")
    stored = caught.value.jobs if isinstance(caught.value, conveyor.PartialEnqueue) else []
    assert isinstance(caught.value, conveyor.PartialEnqueue), "expected some chunks stored"
    assert isinstance(caught.value.__cause__, redis.exceptions.OutOfMemoryError)
    # Exactly the jobs it names were stored (plus the first one), each whole and ready.
    assert census == {"records": len(stored) + 1, "ready_listed": len(stored) + 1,
                      "ready_count": len(stored) + 1}
    assert all(job.info().state == "ready" for job in stored[:: max(1, len(stored) // 20)])


def test_single_writes_are_all_or_nothing_under_oom(
        tight: tuple[RedisServer, conveyor.Conveyor]) -> None:
    server, app = tight
    client = server.client()

    @app.task(name="one", queue="q")
    def one(n: int) -> None: ...

    scheduled = one.options(delay=600).enqueue(1)
    ready = one.enqueue(2)
    before = _census(client, app, "q")
    _squeeze(client, 0)
    filler = 0
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        while True:  # fill what is left, so that every write is refused
            client.set(f"filler:{filler}", "y" * 10_000)
            filler += 1
    for call in (lambda: one.enqueue(3), lambda: one.options(key="k").enqueue(4),
                 lambda: one.options(delay=5).enqueue(5), lambda: one.enqueue_many([(6,), (7,)])):
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            call()
    assert _census(client, app, "q") == before  # nothing half-written
    # A #!lua script that may write is refused whole under OOM, before its first write.
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        scheduled.cancel()
    assert scheduled.info().state == "scheduled" and ready.info().state == "ready"
    client.config_set("maxmemory", 0)
    assert one.enqueue(8).info().state == "ready"


def test_dead_letters_under_oom_requeue_whole_or_not_at_all_and_purge_frees(
        tight: tuple[RedisServer, conveyor.Conveyor]) -> None:
    server, app = tight
    client = server.client()

    @app.task(name="bad", queue="q", retries=0)
    def bad(n: int) -> None:
        raise ValueError(n)

    jobs = bad.enqueue_many([(i,) for i in range(20)])

    with running_worker(app, queues=["q"], concurrency=4):
        wait_until(lambda: len(app.dead_letters("q")) == 20, 20, message="20 dead")
    _squeeze(client, 0)
    filler = 0
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        while True:
            client.set(f"filler:{filler}", "y" * 10_000)
            filler += 1
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        app.dead_letters("q").requeue()
    assert len(app.dead_letters("q")) == 20  # nothing requeued half-way
    assert {job.info().state for job in jobs} == {"dead"}
    # Purging only removes: it works in the spell, and frees memory for other writes.
    assert app.dead_letters("q").purge() == 20
    assert len(app.dead_letters("q")) == 0 and client.exists(app.keys("q").job(
        jobs[0].short_id)) == 0
