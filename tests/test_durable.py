"""Durable enqueue: ``WAIT`` after the enqueue, on its connection, against a real primary
and a real replica."""

from __future__ import annotations

import uuid

import pytest

import conveyor
from helpers import RedisServer, wait_until


def _primary_and_replica(make_server: type[RedisServer]) -> tuple[RedisServer, RedisServer]:
    """A durable primary and a replica in sync with it."""
    primary = make_server(durable=True).start()
    replica = make_server(extra=["--replicaof", "127.0.0.1", str(primary.port)])
    replica.start()
    wait_until(lambda: replica.client().info("replication")["master_link_status"] == "up", 10,
               message="the replica in sync")
    return primary, replica


def test_a_durable_enqueue_returns_once_the_replica_has_the_job(
        make_server: type[RedisServer]) -> None:
    primary, replica = _primary_and_replica(make_server)
    app = conveyor.Conveyor(primary.url, namespace=f"d{uuid.uuid4().hex[:6]}",
                            durable_timeout=0.5)
    task = app.task(name="keep", queue="q")(lambda n: n)
    try:
        job = task.options(durable=True).enqueue(1)
        # Read from the replica straight away: WAIT returned only once it had the job.
        assert replica.client().hget(app.keys("q").job(job.short_id), "s") == b"ready"
        jobs = task.options(durable=True).enqueue_many([(n,) for n in range(3000)])
        last = jobs[-1]
        assert replica.client().hget(app.keys("q").job(last.short_id), "s") == b"ready"

        replica.client().execute_command("CLIENT", "PAUSE", 3000, "ALL")  # it stops acking
        with pytest.raises(conveyor.NotReplicated) as caught:
            task.options(durable=True).enqueue(2)
        assert caught.value.replicas == 0 and len(caught.value.jobs) == 1
        assert caught.value.jobs[0].info().state == "ready"  # stored on the primary
        assert task.enqueue(3).info().state == "ready"  # plain enqueue does not wait
    finally:
        app.close()


def test_a_durable_enqueue_whose_reply_was_lost_stores_once_and_waits_for_the_replica(
        make_server: type[RedisServer]) -> None:
    from lost_reply import LoseReplies, script

    primary, replica = _primary_and_replica(make_server)
    app = conveyor.Conveyor(primary.url, namespace=f"d{uuid.uuid4().hex[:6]}",
                            durable_timeout=2.0)
    task = app.task(name="keep", queue="q")(lambda n: n)
    try:
        with LoseReplies(script("enqueue")) as lost:
            jobs = task.options(durable=True).enqueue_many([(n,) for n in range(20)])
        assert lost.lost == 1
        k = app.keys("q")
        assert app.redis.llen(k.ready_prefix + "5:") == 20  # each job once
        assert replica.client().hget(k.job(jobs[-1].short_id), "s") == b"ready"
    finally:
        app.close()
