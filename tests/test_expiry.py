"""Expiry and deadlines on a real redis-server: a job past its ``expires`` never starts
and ends ``expired`` at its time, wherever it waits; a run past its ``deadline`` is
cancelled and the job ends ``expired``; ``on_expire`` hears of each."""

from __future__ import annotations

import threading
import time

import pytest

import conveyor
from conveyor import JobState
from conveyor.scripts import calls
from helpers import running_worker, wait_until

T0 = 1_800_000_000_000.0  # ms


def _state(job: conveyor.Job) -> JobState:
    return job.info().state


def _heard(app: conveyor.Conveyor) -> list[str]:
    heard: list[str] = []
    lock = threading.Lock()

    @app.on_expire
    def expired(info: conveyor.JobInfo) -> None:
        with lock:
            heard.append(info.id)

    return heard


def test_a_ready_job_expires_on_time_even_with_no_slot_for_it(app: conveyor.Conveyor) -> None:
    heard = _heard(app)

    @app.task(name="code", queue="x")
    def code(n: int) -> int:
        return n

    app.pause("x")  # no job of the queue starts; the timer still runs
    with running_worker(app, queues=["x"]):
        job = code.options(expires=0.5).enqueue(1)
        began = time.monotonic()
        wait_until(lambda: _state(job) == JobState.EXPIRED, 10, message="expired")
        took = time.monotonic() - began
        assert 0.4 <= took <= 2.0, took  # at its time, by the timer, not at a later fetch
        info = job.info()
        assert info.error is not None and info.error.startswith("expired: not started by")
        wait_until(lambda: heard == [job.id], 5, message="on_expire")
        assert app.monitor.backlog("x").ready == 0
        app.resume("x")
        time.sleep(0.3)  # the queue runs again: the expired job is dropped, never run
        assert _state(job) == JobState.EXPIRED
    with pytest.raises(conveyor.JobFailed, match="expired"):
        job.result(timeout=1)


@pytest.mark.parametrize("where", ["scheduled", "retrying", "suspended"])
def test_a_waiting_job_expires_where_it_waits(app: conveyor.Conveyor, where: str) -> None:
    runs: list[int] = []

    @app.task(name="flaky", queue="x", retries=3, backoff=30)
    def flaky() -> None:
        runs.append(1)
        raise RuntimeError("again later")

    @app.task(name="waiter", queue="x")
    def waiter() -> None:
        runs.append(1)
        conveyor.current_job().wait_for("never")

    @app.task(name="later", queue="x")
    def later() -> None:
        runs.append(1)

    task = {"scheduled": later.options(delay=30), "retrying": flaky, "suspended": waiter}[where]
    with running_worker(app, queues=["x"]):
        job = task.options(expires=1.0).enqueue()
        if where != "scheduled":
            wait_until(lambda: _state(job) == JobState(where), 5, message=where)
        wait_until(lambda: _state(job) == JobState.EXPIRED, 10, message="expired")
    assert len(runs) == (0 if where == "scheduled" else 1)
    backlog = app.monitor.backlog("x")
    assert (backlog.scheduled, backlog.suspended, backlog.ready) == (0, 0, 0)


def test_a_run_past_its_deadline_is_cancelled_and_the_job_expires(
        app: conveyor.Conveyor) -> None:
    heard = _heard(app)

    @app.task(name="slow", queue="x")
    async def slow() -> str:
        import asyncio
        await asyncio.sleep(30)
        return "late"

    with running_worker(app, queues=["x"]):
        job = slow.options(deadline=1.0).enqueue()
        wait_until(lambda: _state(job) == JobState.ACTIVE, 5, message="running")
        began = time.monotonic()
        wait_until(lambda: _state(job) == JobState.EXPIRED, 10, message="expired")
        assert time.monotonic() - began < 4.0
        assert "deadline passed" in (job.info().error or "")
        wait_until(lambda: heard == [job.id], 5, message="on_expire")
    assert app.monitor.stats(queue="x").expired >= 1


def test_a_job_past_its_expiry_is_never_leased_whatever_the_timer_did(
        app: conveyor.Conveyor) -> None:
    """The timer has not run (no fetch since): the lease itself refuses a job past its
    time, and ends it expired."""
    k = app.keys("x")
    spec = calls.JobSpec(task="t", expires="+1000")
    app.scripts.run(calls.enqueue(k, spec, [("a", b"[[]]")], app.limits, now=T0))
    assert app.redis.zscore(k.expiring, "a") == T0 + 1000
    # A fetch after the time: the lease meets it first (the timer looks first too, so
    # take the timer's entry away to see the lease refuse it on its own).
    app.redis.zrem(k.expiring, "a")
    fetched = app.scripts.run(calls.fetch(k, 5, app.limits, now=T0 + 1000))
    assert fetched.jobs == [] and fetched.expired == ["a"]
    assert app.redis.hget(k.job("a"), "s") == b"expired"
    assert int(app.redis.hget(k.counts, "ready")) == 0
    assert app.redis.ttl(k.job("a")) > 0


def test_a_job_started_in_time_keeps_running_and_a_retry_expires_later(
        app: conveyor.Conveyor) -> None:
    k = app.keys("x")
    spec = calls.JobSpec(task="t", expires="+1000")
    app.scripts.run(calls.enqueue(k, spec, [("a", b"[[]]")], app.limits, now=T0))
    held = app.scripts.run(calls.fetch(k, 5, app.limits, now=T0 + 500)).jobs[0]
    assert app.redis.zscore(k.expiring, "a") is None  # started in time: no timer to keep
    retry = calls.Outcome("a", held.token, "retry", (T0 + 500) / 1000, "boom", 5000)
    app.scripts.run(calls.finish(k, [retry], app.limits, now=T0 + 600))
    assert app.redis.zscore(k.expiring, "a") == T0 + 1000  # waits again: on the timer
    fetched = app.scripts.run(calls.fetch(k, 5, app.limits, now=T0 + 1000))
    assert fetched.expired == ["a"] and app.redis.hget(k.job("a"), "s") == b"expired"
    assert app.redis.zscore(k.delayed, "a") is None


def test_a_job_handed_back_by_a_stop_is_back_on_its_timer(app: conveyor.Conveyor) -> None:
    """A stop hands a leased job back (release): it waits again, so it ends expired when
    its time passes, even if the next fetch leases another job and never meets it."""
    k = app.keys("x")
    spec = calls.JobSpec(task="t", expires="+500")
    app.scripts.run(calls.enqueue(k, spec, [("a", b"[[]]")], app.limits, now=T0))
    held = app.scripts.run(calls.fetch(k, 5, app.limits, now=T0)).jobs[0]
    assert app.scripts.run(calls.release(k, [(held.short_id, held.token)])) == 1
    assert app.redis.zscore(k.expiring, "a") == T0 + 500
    other = calls.JobSpec(task="t", tenant="t2")  # its own tenant: the fetch may take it
    app.scripts.run(calls.enqueue(k, other, [("b", b"[[]]")], app.limits, now=T0 + 600))
    fetched = app.scripts.run(calls.fetch(k, 1, app.limits, now=T0 + 600))
    assert fetched.expired == ["a"] and app.redis.hget(k.job("a"), "s") == b"expired"
    assert [j.short_id for j in fetched.jobs] == ["b"]
    assert int(app.redis.hget(k.counts, "ready") or 0) == 0


def test_expiry_options_are_checked(app: conveyor.Conveyor) -> None:
    @app.task(name="t", queue="x")
    def t() -> None:
        return None

    for bad in (0, -1, "soon", True):
        with pytest.raises(conveyor.ConfigurationError, match="expires"):
            t.options(expires=bad)
    with pytest.raises(conveyor.ConfigurationError, match="deadline"):
        t.options(deadline=0)


def test_a_workflow_node_expires_while_it_waits_and_its_children_are_cancelled(
        app: conveyor.Conveyor) -> None:
    @app.task(name="first", queue="x")
    def first() -> str:
        time.sleep(1.5)
        return "done"

    @app.task(name="step", queue="x")
    def step() -> str:
        return "ran"

    wf = app.workflow()
    root = wf.add(first, name="root")
    middle = wf.add(step.options(expires=0.5), name="middle", after=[root])
    wf.add(step, name="last", after=[middle])
    with running_worker(app, queues=["x"]):
        handle = wf.enqueue()
        nodes = {n.name: app.job(n.id) for n in wf.nodes}
        wait_until(lambda: _state(nodes["middle"]) == JobState.EXPIRED, 10,
                   message="middle expired")
        wait_until(lambda: _state(nodes["last"]) == JobState.CANCELLED, 15,
                   message="last cancelled")
        assert _state(nodes["root"]) == JobState.SUCCEEDED
        assert "expired" in (nodes["last"].info().error or "")
    del handle
