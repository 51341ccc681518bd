"""End-to-end behaviour of the public API with a worker running in a thread."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time

import pytest

import conveyor
from helpers import run_async, running_worker, wait_until


def test_enqueue_and_result(app: conveyor.Conveyor) -> None:
    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    assert add.name.endswith("add")
    job = add.enqueue(1, 2)
    assert job.info().state == conveyor.JobState.READY
    with running_worker(app, concurrency=4):
        assert job.result(timeout=10) == 3
    info = job.info()
    assert info.state == conveyor.JobState.SUCCEEDED and info.attempts == 1
    assert info.enqueued_at <= info.started_at <= info.finished_at
    assert info.wait_time == pytest.approx(info.started_at - info.enqueued_at)
    assert info.run_time == pytest.approx(info.finished_at - info.started_at)


def test_kwargs_and_async_tasks(app: conveyor.Conveyor) -> None:
    @app.task(name="greet", queue="q2")
    async def greet(name: str, *, punct: str = "!") -> str:
        await asyncio.sleep(0.001)
        return f"hi {name}{punct}"

    job = greet.enqueue("ann", punct="?")
    assert job.id.startswith("q2~")
    with running_worker(app, concurrency=2):
        assert job.result(timeout=10) == "hi ann?"


def test_unencodable_argument_fails_at_enqueue_and_writes_nothing(app: conveyor.Conveyor) -> None:
    @app.task
    def f(x: object) -> None: ...

    class Thing:
        pass

    with pytest.raises(conveyor.SerializationError, match="Thing"):
        f.enqueue(Thing())
    with pytest.raises(TypeError, match="object"):
        f.enqueue(x=object())
    assert app.redis.keys(f"*{app.namespace}*") == []


def test_payload_over_the_limit_is_refused(redis_server, namespace) -> None:
    app = conveyor.Conveyor(redis_server.url, namespace=namespace, max_payload=100)

    @app.task
    def f(x: str) -> None: ...

    with pytest.raises(conveyor.PayloadTooLarge, match="over the limit of 100 bytes"):
        f.enqueue("x" * 200)


def test_options_are_validated(app: conveyor.Conveyor) -> None:
    @app.task
    def f() -> None: ...

    with pytest.raises(ValueError, match="priority"):
        f.options(priority=10)
    with pytest.raises(ValueError, match="either delay= or at="):
        f.options(delay=1, at=time.time())
    with pytest.raises(ValueError, match="aware datetime"):
        f.options(at=dt.datetime.now())
    with pytest.raises(ValueError, match="unknown job option"):
        f.options(prio=3)
    assert f.options(delay=5).options(at=1.0).job_options.delay is None


def test_unknown_task_and_corrupt_payload_go_dead_and_worker_continues(
    app: conveyor.Conveyor,
) -> None:
    @app.task(name="known")
    def known(x: int) -> int:
        return x

    ghost = conveyor.Conveyor(app.url, namespace=app.namespace)

    @ghost.task(name="ghost.task", queue="default")
    def ghost_task() -> None: ...

    lost = ghost_task.enqueue()
    corrupt = known.enqueue(1)
    app.redis.hset(app.keys("default").job(corrupt.short_id), "a", b"\xff{not json")
    fine = known.enqueue(7)
    with running_worker(app, concurrency=2):
        assert fine.result(timeout=10) == 7
        with pytest.raises(conveyor.JobFailed, match=r"unknown task 'ghost\.task'"):
            lost.result(timeout=10)
        with pytest.raises(conveyor.JobFailed, match="corrupt payload"):
            corrupt.result(timeout=10)
    assert lost.info().attempts == 1  # dead at once, no pointless retries


def test_retries_then_dead_letters_and_hook(app: conveyor.Conveyor) -> None:
    calls: list[int] = []
    seen: list[conveyor.JobInfo] = []

    @app.task(retries=2, backoff=0.01)
    def flaky(n: int) -> None:
        calls.append(n)
        raise RuntimeError(f"boom {n}")

    app.on_dead(seen.append)
    job = flaky.enqueue(1)
    with running_worker(app, concurrency=2):
        with pytest.raises(conveyor.JobFailed, match="boom 1"):
            job.result(timeout=10)
        wait_until(lambda: seen, 5, message="on_dead hook")
    assert calls == [1, 1, 1]
    info = job.info()
    assert info.attempts == 3 and info.max_attempts == 3
    assert seen[0].id == job.id and "RuntimeError: boom 1" in (seen[0].error or "")
    dl = app.dead_letters("default")
    assert [i.id for i in dl.list()] == [job.id]
    assert dl.requeue() == 1
    assert job.info().state == conveyor.JobState.READY and job.info().attempts == 0
    with running_worker(app, concurrency=2), pytest.raises(conveyor.JobFailed):
        job.result(timeout=10)
    assert dl.purge() == 1
    with pytest.raises(conveyor.JobNotFound):
        job.info()


def test_cancel_scheduled_job_never_runs(app: conveyor.Conveyor) -> None:
    ran = threading.Event()

    @app.task
    def f() -> None:
        ran.set()

    job = f.options(delay=0.3).enqueue()
    assert job.info().state == conveyor.JobState.SCHEDULED
    assert job.cancel() is True
    with running_worker(app, concurrency=1):
        with pytest.raises(conveyor.JobCancelled):
            job.result(timeout=2)
        other = f.options(delay=0.4).enqueue()
        other.result(timeout=5)
    assert job.info().state == conveyor.JobState.CANCELLED


def test_dedupe_key_via_options(app: conveyor.Conveyor) -> None:
    @app.task
    def f(x: int) -> int:
        return x

    first = f.options(key="order-17").enqueue(1)
    second = f.options(key="order-17").enqueue(2)
    assert first == second
    with running_worker(app, concurrency=1):
        assert first.result(timeout=10) == 1
    third = f.options(key="order-17").enqueue(3)
    assert third != first


def test_async_twins(app: conveyor.Conveyor) -> None:
    @app.task
    def mul(x: int, y: int) -> int:
        return x * y

    async def scenario() -> tuple[conveyor.Job, list[conveyor.Job]]:
        one = await mul.aenqueue(2, 3)
        many = await mul.options(tenant="t").aenqueue_many([(1, 1), (2, 2)])
        info = await one.ainfo()
        assert info.state == conveyor.JobState.READY
        return one, many

    one, many = run_async(app, scenario())
    with running_worker(app, concurrency=2):
        assert one.result(timeout=10) == 6
        assert [j.result(timeout=10) for j in many] == [1, 4]
    assert many[0].info().tenant == "t"


def test_async_timeout_cancels_and_retries(app: conveyor.Conveyor) -> None:
    @app.task(timeout=0.05, retries=1, backoff=0.01)
    async def slow() -> None:
        await asyncio.sleep(5)

    job = slow.enqueue()
    with running_worker(app, concurrency=1), pytest.raises(conveyor.JobFailed, match="timeout"):
        job.result(timeout=10)
    assert job.info().attempts == 2


def test_sync_timeout_is_failed_and_retried(app: conveyor.Conveyor) -> None:
    release = threading.Event()

    @app.task(timeout=0.05, retries=0)
    def stuck() -> None:
        release.wait(5)

    job = stuck.enqueue()
    with running_worker(app, concurrency=2, grace=0.1):
        with pytest.raises(conveyor.JobFailed, match="timeout"):
            job.result(timeout=10)
        release.set()


def test_enqueue_many_is_one_round_trip_and_keeps_options(app: conveyor.Conveyor) -> None:
    @app.task
    def f(x: int) -> int:
        return x

    before = app.redis.info("stats")["total_commands_processed"]
    jobs = f.options(priority=7, tenant="acme").enqueue_many([(i,) for i in range(1500)])
    after = app.redis.info("stats")["total_commands_processed"]
    assert len(jobs) == 1500 and len(set(jobs)) == 1500
    info = jobs[-1].info()
    assert info.priority == 7 and info.tenant == "acme"
    # evalsha + sadd + the scripts' own redis.call()s; no per-job client round trips
    assert app.redis.llen(app.keys("default").ready_prefix + "7:acme") == 1500
    assert after > before


def test_worker_burst_exits_when_nothing_is_ready(app: conveyor.Conveyor) -> None:
    @app.task
    def f(x: int) -> int:
        return x

    jobs = f.enqueue_many(list(range(50)))
    later = f.options(delay=60).enqueue(0)
    app.worker(concurrency=8).run(burst=True)
    assert all(j.info().state == conveyor.JobState.SUCCEEDED for j in jobs)
    assert later.info().state == conveyor.JobState.SCHEDULED


def test_result_timeout(app: conveyor.Conveyor) -> None:
    @app.task
    def f() -> None: ...

    with pytest.raises(conveyor.ResultTimeout):
        f.enqueue().result(timeout=0.05)


def test_pause_and_resume(app: conveyor.Conveyor) -> None:
    @app.task
    def f(x: int) -> int:
        return x

    app.pause("default")
    assert app.is_paused("default")
    job = f.enqueue(5)
    with running_worker(app, concurrency=1):
        with pytest.raises(conveyor.ResultTimeout):
            job.result(timeout=0.3)
        app.resume("default")
        assert job.result(timeout=5) == 5
    assert not app.is_paused("default")


def test_a_mangled_record_does_not_stop_the_queue(app: conveyor.Conveyor) -> None:
    @app.task(name="ok")
    def ok(x: int) -> int:
        return x

    mangled = ok.enqueue(1)
    key = app.keys("default").job(mangled.short_id)
    app.redis.hset(key, mapping={"attempts": "many", "e": "yesterday"})
    app.redis.hdel(key, "t")
    fine = ok.enqueue_many([(i,) for i in range(20)])
    with running_worker(app, concurrency=4):
        assert [j.result(timeout=10) for j in fine] == list(range(20))
        with pytest.raises(conveyor.JobFailed, match="field 'attempts' is not an integer"):
            mangled.result(timeout=10)


def test_sync_tasks_share_the_app_client_beyond_a_hundred_threads(
    app: conveyor.Conveyor,
) -> None:
    barrier = threading.Barrier(150, timeout=20)

    @app.task(name="crowd", retries=0)
    def crowd(i: int) -> int:
        barrier.wait()  # 150 threads at once, each holding a connection for a while
        app.redis.blpop(f"{app.namespace}:nothing", timeout=0.3)
        return int(app.redis.incr(f"{app.namespace}:crowd"))

    jobs = crowd.enqueue_many([(i,) for i in range(150)])
    with running_worker(app, concurrency=150):
        results = [j.result(timeout=30) for j in jobs]
    assert sorted(results) == list(range(1, 151))
