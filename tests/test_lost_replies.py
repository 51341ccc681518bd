"""Every mutating call survives a reply lost after Redis applied it.

Each test loses the reply of one request on one path (``lost_reply.LoseReplies``: the
real server runs it, the client sees a reset) and checks that the call's effect happens
once and that the caller learns what it was: the same request sent again returns its
first reply instead of applying a second time.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

import conveyor
from conveyor import testing
from conveyor.scripts import KEPT_REPLY_MS, calls
from helpers import run_async
from lost_reply import LoseReplies, script


def _ready_entries(app: conveyor.Conveyor, queue: str) -> int:
    """Ids in the queue's ready lists (a job stored twice shows twice)."""
    k = app.keys(queue)
    return sum(app.redis.llen(key) for key in app.redis.scan_iter(f"{k.ready_prefix}*")
               if app.redis.type(key) == b"list")


def test_a_bulk_enqueue_whose_reply_was_lost_stores_each_job_once(
    app: conveyor.Conveyor,
) -> None:
    @app.task(queue="bulk")
    def noop(i: int) -> int:
        return i

    with LoseReplies(script("enqueue")) as lost:
        jobs = noop.enqueue_many([(i,) for i in range(50)])
    assert lost.lost == 1
    assert len({j.id for j in jobs}) == 50
    assert _ready_entries(app, "bulk") == 50
    assert app.monitor.stats(queue="bulk").backlog.ready == 50


def test_an_async_bulk_enqueue_whose_reply_was_lost_stores_each_job_once(
    app: conveyor.Conveyor,
) -> None:
    @app.task(queue="abulk")
    def noop(i: int) -> int:
        return i

    async def go() -> list[Any]:
        with LoseReplies(script("enqueue")) as lost:
            jobs = await noop.aenqueue_many([(i,) for i in range(30)])
        assert lost.lost == 1
        return jobs

    jobs = run_async(app, go())
    assert len(jobs) == 30
    assert _ready_entries(app, "abulk") == 30


def test_a_workflow_whose_reply_was_lost_is_stored_once(app: conveyor.Conveyor) -> None:
    @app.task(queue="wfq")
    def step(i: int) -> int:
        return i

    wf = app.workflow()
    first = wf.add(step, 1, name="first")
    wf.add(step, 2, name="second", after=[first])
    with LoseReplies(script("workflow_enqueue")) as lost:
        handle = wf.enqueue()
    assert lost.lost == 1
    assert _ready_entries(app, "wfq") == 1
    assert handle.info().counts.get("ready") == 1
    testing.drain(app, queues=["wfq"])
    testing.drain(app, queues=["wfq"])
    assert handle.result(timeout=10) == {"first": 1, "second": 2}


def test_a_fetch_whose_reply_was_lost_runs_its_job_without_charging_an_attempt(
    app: conveyor.Conveyor,
) -> None:
    @app.task(queue="fq", retries=0)
    def once() -> str:
        return "ran"

    job = once.enqueue()
    with LoseReplies(script("fetch")) as lost:
        testing.drain(app, queues=["fq"], timeout=20)
    assert lost.lost == 1
    info = job.info()
    assert info.state == conveyor.JobState.SUCCEEDED, info.error
    assert info.attempts == 1
    assert job.result(timeout=5) == "ran"


def test_a_finish_whose_reply_was_lost_fires_the_dead_hook_once(
    app: conveyor.Conveyor,
) -> None:
    dead: list[str] = []
    app.on_dead(lambda info: dead.append(info.id))

    @app.task(queue="dq", retries=0)
    def broken() -> None:
        raise RuntimeError("boom")

    job = broken.enqueue()
    with LoseReplies(script("finish")) as lost:
        testing.drain(app, queues=["dq"], timeout=20)
    assert lost.lost == 1
    assert job.info().state == conveyor.JobState.DEAD
    assert dead == [job.id]


def test_a_step_whose_record_reply_was_lost_does_not_run_again(
    app: conveyor.Conveyor,
) -> None:
    charged: list[int] = []

    @app.task(queue="sq", retries=2)
    def pay(order: int) -> int:
        ctx = conveyor.current_job()
        value = ctx.step("charge", lambda: charged.append(order) or order)
        if ctx.attempt == 1:
            raise RuntimeError("after the charge")
        return value

    job = pay.enqueue(7)
    with LoseReplies(script("step")) as lost:
        testing.drain(app, queues=["sq"], include_scheduled=True, timeout=20)
    assert lost.lost == 1
    assert job.result(timeout=5) == 7
    assert charged == [7]


@pytest.mark.parametrize("path", ["cancel", "requeue_dead", "purge_dead", "set_limits"])
def test_an_operators_call_whose_reply_was_lost_answers_what_it_did(
    app: conveyor.Conveyor, path: str,
) -> None:
    @app.task(queue="oq", retries=0)
    def fail() -> None:
        raise RuntimeError("no")

    job = fail.enqueue()
    if path == "cancel":
        with LoseReplies(script("cancel")) as lost:
            assert job.cancel() is True
        assert job.info().state == conveyor.JobState.CANCELLED
    elif path == "set_limits":
        with LoseReplies(script("set_limits")) as lost:
            app.queue("oq").set_limits(concurrency=3)
        assert app.queue("oq").limits().concurrency == 3
    else:
        testing.drain(app, queues=["oq"])
        assert job.info().state == conveyor.JobState.DEAD
        letters = app.dead_letters("oq")
        with LoseReplies(script(path)) as lost:
            done = letters.requeue() if path == "requeue_dead" else letters.purge()
        assert done == 1  # the kept reply: one job, not "none left"
        assert _ready_entries(app, "oq") == (1 if path == "requeue_dead" else 0)
    assert lost.lost == 1


def test_a_call_sent_again_returns_its_first_reply_and_a_new_one_applies(
    app: conveyor.Conveyor,
) -> None:
    @app.task(queue="rq", retries=0)
    def fail() -> None:
        raise RuntimeError("no")

    fail.enqueue()
    testing.drain(app, queues=["rq"])
    k = app.keys("rq")
    purge = calls.purge_dead(k)
    assert app.scripts.run(purge) == 1
    assert app.scripts.run(purge) == 1  # the same request: its reply, nothing applied
    assert app.scripts.run(calls.purge_dead(k)) == 0  # a new request applies
    # Replies a runner has read are deleted by its next call to the same queue.
    last = calls.purge_dead(k)
    app.scripts.run(last)
    kept = {key.decode() for key in app.redis.scan_iter(f"{k.replies_prefix}*")}
    assert k.replies_prefix + purge.request not in kept
    assert k.replies_prefix + last.request in kept
    assert 0 < app.redis.pttl(k.replies_prefix + last.request) <= KEPT_REPLY_MS


def test_a_bulk_enqueue_that_never_hears_back_names_the_jobs_it_cannot_confirm(
    app: conveyor.Conveyor, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import conveyor.producer.send as send_module

    monkeypatch.setattr(send_module, "RESOLVE_SECONDS", 0.5)

    @app.task(queue="never")
    def noop(i: int) -> int:
        return i

    with LoseReplies(script("enqueue"), times=1000), \
            pytest.raises(conveyor.PartialEnqueue) as caught:
        noop.enqueue_many([(i,) for i in range(10)])
    assert caught.value.jobs == []
    unsure = caught.value.unconfirmed
    assert len(unsure) == 10
    # Sent several times, stored once: every one of them exists, each in the list once.
    assert {job.info().state for job in unsure} == {conveyor.JobState.READY}
    assert _ready_entries(app, "never") == 10


def test_a_step_whose_record_was_refused_for_a_moment_is_recorded_without_a_retry(
    app: conveyor.Conveyor,
) -> None:
    """An out-of-memory reply (nothing written) while a step is recorded: the record is
    sent again while the lease holds, instead of failing the attempt (whose retry would
    call the step's function a second time)."""
    from injection import FaultPlan

    charged: list[int] = []

    async def charge(order: int) -> int:
        charged.append(order)
        return order

    @app.task(queue="soom", retries=2)
    async def pay(order: int) -> int:
        return await conveyor.current_job().astep("charge", charge, order)

    job = pay.enqueue(9)
    with FaultPlan().fail("script:step", "oom") as plan:
        testing.drain(app, queues=["soom"], include_scheduled=True, timeout=20)
    assert plan.injected["script:step"] == 1
    assert job.result(timeout=5) == 9
    assert charged == [9]
    assert job.info().attempts == 1


def test_a_workflow_that_never_hears_back_is_cancelled_and_says_so(
    app: conveyor.Conveyor, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its store was sent again and again, never answered: whether it ran is unknown, so
    its nodes are cancelled by their planned ids (a cancel of a node that is not there
    changes nothing), and no node of it ever runs; a new workflow can take its place."""
    import conveyor.producer.send as send_module

    monkeypatch.setattr(send_module, "RESOLVE_SECONDS", 0.5)

    @app.task(queue="wfnever")
    def step(i: int) -> int:
        return i

    wf = app.workflow()
    first = wf.add(step, 1, name="first")
    wf.add(step, 2, name="second", after=[first])
    with LoseReplies(script("workflow_enqueue"), times=1000), \
            pytest.raises(conveyor.PartialEnqueue) as caught:
        wf.enqueue()
    assert caught.value.unconfirmed == []  # the cancels went through: nothing in doubt
    assert testing.drain(app, queues=["wfnever"]) == []
    for node in wf.nodes:
        with contextlib.suppress(conveyor.JobNotFound):  # else never stored
            assert app.job(node.id).info().state == conveyor.JobState.CANCELLED


@pytest.mark.parametrize("path", ["plain", "script"])
def test_a_single_enqueue_whose_every_send_lost_its_reply_returns_the_stored_job(
    app: conveyor.Conveyor, path: str,
) -> None:
    """Both sends of a single enqueue broke after Redis ran the first: the job's record,
    looked up once Redis answers, says it is stored, and the call returns it (raising
    would make a careful caller enqueue it a second time)."""
    @app.task(queue=f"one-{path}")
    def noop(i: int) -> int:
        return i

    noop.enqueue(0)  # the queue is known and the clock read: the next goes the short way
    noop.enqueue(0)
    # Every send of the call loses its reply (a sent-again plain enqueue looks for the
    # record first: those replies are lost too), then the connection heals.
    if path == "plain":
        with LoseReplies(b"MULTI", times=5) as lost, LoseReplies(b"EXISTS", times=5):
            job = noop.enqueue(1)
    else:  # a key takes the script path
        with LoseReplies(script("enqueue"), times=5) as lost:
            job = noop.options(key="k1").enqueue(1)
    assert lost.lost >= 1
    assert job.info().state == conveyor.JobState.READY
    assert _ready_entries(app, f"one-{path}") == 3
