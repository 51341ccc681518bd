"""conveyor.testing: inline runs without Redis, drain on a real Redis, isolated namespaces."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import conveyor
from conveyor import testing
from helpers import free_port


def offline_app() -> conveyor.Conveyor:
    """An app whose Redis does not exist: anything that reaches Redis fails loudly."""
    return conveyor.Conveyor(f"redis://127.0.0.1:{free_port()}/0", namespace="offline")


class Order:
    def __init__(self, number: int) -> None:
        self.number = number


def test_inline_runs_at_once_without_redis() -> None:
    app = offline_app()

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    with testing.inline(app):
        job = add.enqueue(1, 2)
        assert job.result() == 3
        info = job.info()
        assert info.state == conveyor.JobState.SUCCEEDED
        assert (info.attempts, info.max_attempts, info.result) == (1, 4, 3)
        assert info.task == add.name and info.queue == "default"
        assert info.started_at is not None and info.finished_at is not None
        assert [j.result() for j in add.options(delay=60).enqueue_many([(1, 1), (2, 2)])] \
            == [2, 4]
    with pytest.raises(Exception, match=r"(?i)connect|refused"):
        add.enqueue(1, 2)  # outside the block: Redis again, and there is none


def test_inline_uses_the_real_encoder() -> None:
    app = offline_app()

    @app.task
    def ship(order: Any) -> Any:
        return order

    @app.task
    def opaque() -> Any:
        return Order(2)

    with testing.inline(app):
        with pytest.raises(conveyor.SerializationError, match="ship"):
            ship.enqueue(Order(1))
        # Values come back as a worker would see them: JSON, so a tuple is a list.
        assert ship.enqueue({"items": (1, 2)}).result() == {"items": [1, 2]}
        with pytest.raises(conveyor.JobFailed, match="cannot encode"):
            opaque.enqueue().result()


def test_inline_retries_at_once_then_dead() -> None:
    app = offline_app()
    calls: list[int] = []
    dead: list[conveyor.JobInfo] = []
    app.on_dead(dead.append)

    @app.task(retries=3, backoff=60.0)
    def flaky(n: int) -> str:
        calls.append(n)
        if len(calls) < 3:
            raise ValueError(f"attempt {len(calls)} failed")
        return "ok"

    @app.task(retries=1, backoff=60.0)
    def broken() -> None:
        raise RuntimeError("always")

    started = time.monotonic()
    with testing.inline(app):
        job = flaky.enqueue(7)
        assert job.result() == "ok"
        assert job.info().attempts == 3
        doomed = broken.enqueue()
        with pytest.raises(conveyor.JobFailed, match="always"):
            doomed.result()
        info = doomed.info()
        assert (info.state, info.attempts) == (conveyor.JobState.DEAD, 2)
    assert time.monotonic() - started < 5  # no backoff sleeps (60 s base)
    assert calls == [7, 7, 7]
    assert [d.id for d in dead] == [doomed.id]


def test_inline_runs_nested_enqueues_and_async_tasks() -> None:
    app = offline_app()
    seen: list[str] = []

    @app.task(queue="emails")
    async def send(user: int) -> str:
        await asyncio.sleep(0)
        seen.append(f"sent {user}")
        return f"sent {user}"

    @app.task
    def signup(user: int) -> str:
        seen.append(f"signup {user}")
        return send.enqueue(user).id

    with testing.inline(app):
        job_id = signup.enqueue(5).result()
        assert app.job(job_id).result() == "sent 5"
        assert app.job(job_id).info().queue == "emails"

        async def from_async_code() -> str:
            job = await send.aenqueue(6)
            nested = signup.enqueue(8)  # a sync enqueue inside a running loop
            assert (await app.job(nested.result()).ainfo()).result == "sent 8"
            return await job.aresult()

        assert asyncio.run(from_async_code()) == "sent 6"
    assert seen == ["signup 5", "sent 5", "sent 6", "signup 8", "sent 8"]


def test_drain_runs_ready_jobs_in_process(app: conveyor.Conveyor) -> None:
    ran: list[int] = []

    @app.task
    def square(n: int) -> int:
        ran.append(n)
        if n == 3:
            follow_up.enqueue(n)
        return n * n

    @app.task(queue="later")
    def follow_up(n: int) -> int:
        return -n

    jobs = square.enqueue_many([1, 2, 3])
    late = square.options(delay=3600).enqueue(4)
    infos = testing.drain(app, timeout=60)
    assert sorted(ran) == [1, 2, 3]
    by_id = {i.id: i for i in infos}
    assert {j.id for j in jobs} <= set(by_id)
    assert all(by_id[j.id].state == conveyor.JobState.SUCCEEDED for j in jobs)
    assert [by_id[j.id].result for j in jobs] == [1, 4, 9]
    nested = [i for i in infos if i.task == follow_up.name]
    assert len(nested) == 1 and nested[0].result == -3  # the job a task enqueued ran too
    assert late.info().state == conveyor.JobState.SCHEDULED
    assert testing.drain(app, timeout=60) == []  # nothing ready any more


def test_drain_include_scheduled_runs_delayed_jobs_and_retries(app: conveyor.Conveyor) -> None:
    @app.task(retries=2, backoff=600.0)
    def fails() -> None:
        raise ValueError("nope")

    @app.task
    def later(x: str) -> str:
        return x.upper()

    bad = fails.enqueue()
    delayed = later.options(delay=3600).enqueue("hi")
    first = testing.drain(app, timeout=60)
    assert [i.id for i in first] == [bad.id]
    assert first[0].state == conveyor.JobState.RETRYING  # its retry is 10 minutes away
    infos = testing.drain(app, include_scheduled=True, timeout=60)
    by_id = {i.id: i for i in infos}
    assert by_id[delayed.id].result == "HI"
    assert by_id[bad.id].state == conveyor.JobState.DEAD
    assert by_id[bad.id].attempts == 3
    with pytest.raises(conveyor.JobFailed, match="nope"):
        bad.result(timeout=1)


def test_drain_times_out(app: conveyor.Conveyor) -> None:
    @app.task
    def slow() -> None:
        time.sleep(0.5)

    slow.enqueue_many([()] * 20)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        testing.drain(app, timeout=1)
    assert time.monotonic() - started < 15


async def test_adrain_from_async_code(app: conveyor.Conveyor) -> None:
    @app.task
    async def double(x: int) -> int:
        return 2 * x

    job = await double.aenqueue(21)
    try:
        infos = await testing.adrain(app, timeout=60)
        assert [i.result for i in infos] == [42]
        assert await job.aresult(timeout=1) == 42
    finally:
        await app.aclose()  # this loop's client, made again after the drain closed it


def test_isolated_namespace_is_removed(app: conveyor.Conveyor) -> None:
    @app.task
    def noop() -> None:
        return None

    before = app.namespace
    with testing.isolated(app) as name:
        assert app.namespace == name != before
        noop.enqueue_many([()] * 5)
        assert any(True for _ in app.redis.scan_iter(match="{" + name + ":*"))
    assert app.namespace == before
    assert not any(True for _ in app.redis.scan_iter(match="*" + name + "*"))


def test_drain_raises_when_redis_is_unreachable() -> None:
    app = offline_app()

    @app.task
    def noop() -> None:
        return None

    started = time.monotonic()
    with pytest.raises(Exception, match=r"(?i)connect|refused"):
        testing.drain(app, timeout=20)
    assert time.monotonic() - started < 20
    assert app.hooks == []  # the drain's own hook is gone
