"""Workflows end to end on a real Redis with a real worker: order, results passed on,
failure and cancellation cascades, run_if="finished", idempotent hand-overs."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import conveyor
from conveyor.scripts import calls
from conveyor.workflow import batch, parent_results
from conveyor.workflow.release import drain_sync
from helpers import running_worker, wait_until


def test_a_cycle_is_refused_before_anything_is_stored(app: conveyor.Conveyor) -> None:
    @app.task
    def f() -> None: ...

    wf = app.workflow()
    wf.add(f, name="a", after=["c"])
    wf.add(f, name="b", after=["a"])
    wf.add(f, name="c", after=["b"])
    cycle = r"cycle: (a -> b -> c -> a|b -> c -> a -> b|c -> a -> b -> c)"
    with pytest.raises(conveyor.ConfigurationError, match=cycle):
        wf.enqueue()
    assert not list(app.redis.scan_iter(match=f"*{app.namespace}*"))
    wf2 = app.workflow()
    wf2.add(f, name="x", after=["nope"])
    with pytest.raises(conveyor.ConfigurationError, match="'nope'"):
        wf2.enqueue()
    with pytest.raises(conveyor.ConfigurationError, match="already has a node"):
        wf2.add(f, name="x")
    with pytest.raises(conveyor.ConfigurationError, match="run_if"):
        wf2.add(f, run_if="sometimes")


def test_default_names_and_waiting_nodes_are_not_ready(app: conveyor.Conveyor) -> None:
    @app.task(name="t.f")
    def f(x: int) -> int:
        return x

    wf = app.workflow()
    a = wf.add(f, 1)
    b = wf.add(f, 2, after=[a])
    assert (a.name, b.name) == ("t.f#1", "t.f#2")
    handle = wf.enqueue()
    info = handle.info()
    assert info.state == "running"
    assert info.nodes["t.f#1"].state == conveyor.JobState.READY
    assert info.nodes["t.f#2"].state == conveyor.JobState.SCHEDULED  # waiting: not ready
    assert app.redis.hget(app.keys("default").counts, "ready") == b"1"
    assert app.redis.zcard(app.keys("default").delayed) == 0
    assert app.workflow_handle(handle.id).info().counts == {"ready": 1, "scheduled": 1}
    assert handle.id == wf.id and handle.info().nodes["t.f#2"].id == b.id
    with pytest.raises(conveyor.ConfigurationError, match="enqueued already"):
        wf.enqueue()


def test_diamond_runs_in_dependency_order_with_results_passed(app: conveyor.Conveyor) -> None:
    order: list[str] = []

    @app.task
    def step(label: str, job_hint: str) -> str:
        order.append(label)
        return label.upper()

    @app.task
    def join(label: str) -> dict[str, Any]:
        order.append(label)
        return {"seen": sorted(order)}

    wf = app.workflow()
    top = wf.add(step, "top", "", name="top")
    left = wf.add(step, "left", "", name="left", after=[top])
    right = wf.add(step, "right", "", name="right", after=[top])
    wf.add(join, "bottom", name="bottom", after=[left, right])
    with running_worker(app, concurrency=4):
        results = wf.enqueue().result(timeout=30)
    assert order[0] == "top" and order[-1] == "bottom"
    assert set(order[1:3]) == {"left", "right"}
    assert results["top"] == "TOP"
    bottom = app.job(wf.node("bottom").id).info()
    assert bottom.run_at is not None and bottom.enqueued_at is not None
    assert bottom.run_at > bottom.enqueued_at  # runnable once its parents were done
    assert bottom.wait_time is not None and bottom.started_at is not None
    assert bottom.wait_time == pytest.approx(bottom.started_at - bottom.run_at)
    assert results["bottom"] == {"seen": ["bottom", "left", "right", "top"]}


def test_fan_in_reads_its_parents_results(app: conveyor.Conveyor) -> None:
    seen: dict[str, Any] = {}

    @app.task
    def part(i: int) -> int:
        return i * i

    @app.task
    def total() -> int:
        results = conveyor.current_job().parent_results()
        seen.update(results)
        return sum(results.values())

    @app.task
    async def atotal() -> int:
        return sum((await conveyor.current_job().aparent_results()).values())

    wf = app.workflow()
    parts = [wf.add(part, i, name=f"part{i}") for i in range(10)]
    fan_in = wf.add(total, name="total", after=parts)
    wf.add(atotal, name="atotal", after=parts)
    handle = wf.enqueue()
    with running_worker(app, concurrency=4):
        results = handle.result(timeout=30)
    assert results["atotal"] == sum(i * i for i in range(10))
    assert results["total"] == sum(i * i for i in range(10))
    assert seen == {f"part{i}": i * i for i in range(10)}
    assert fan_in.name == "total"


def test_a_dead_parent_cancels_descendants_with_the_reason(app: conveyor.Conveyor) -> None:
    ran: list[str] = []

    @app.task(retries=0)
    def boom() -> None:
        raise RuntimeError("kaput")

    @app.task
    def after(label: str) -> str:
        ran.append(label)
        return label

    wf = app.workflow()
    b = wf.add(boom, name="boom")
    child = wf.add(after, "child", name="child", after=[b])
    wf.add(after, "grandchild", name="grandchild", after=[child])
    wf.add(after, "cleanup", name="cleanup", after=[b], run_if="finished")
    handle = wf.enqueue()
    with running_worker(app, concurrency=2), pytest.raises(conveyor.JobFailed, match="kaput"):
        handle.result(timeout=30)
    info = handle.info()
    assert info.state == "failed"
    assert info.nodes["child"].state == conveyor.JobState.CANCELLED
    assert "parent 'boom'" in (info.nodes["child"].error or "")
    assert "kaput" in (info.nodes["child"].error or "")
    assert info.nodes["grandchild"].state == conveyor.JobState.CANCELLED
    assert "parent 'child'" in (info.nodes["grandchild"].error or "")
    assert info.nodes["cleanup"].state == conveyor.JobState.SUCCEEDED
    assert ran == ["cleanup"]
    assert info.counts == {"dead": 1, "cancelled": 2, "succeeded": 1}


def test_cancel_mid_workflow_stops_what_has_not_ended(app: conveyor.Conveyor) -> None:
    gate = threading.Event()
    ran: list[str] = []

    @app.task
    def slow() -> str:
        gate.wait(20)
        return "slow"

    @app.task
    def later(label: str) -> None:
        ran.append(label)

    wf = app.workflow()
    s = wf.add(slow, name="slow")
    a = wf.add(later, "a", name="a", after=[s])
    wf.add(later, "b", name="b", after=[a])
    handle = wf.enqueue()
    with running_worker(app, concurrency=2):
        wait_until(lambda: handle.info().nodes["slow"].state == conveyor.JobState.ACTIVE, 10)
        assert handle.cancel() == 3  # the running node, and the two waiting for it
        gate.set()
        with pytest.raises(conveyor.JobCancelled):
            handle.result(timeout=30)
        time.sleep(0.3)
    info = handle.info()
    assert info.nodes["slow"].state == conveyor.JobState.CANCELLED  # its result refused
    assert info.state == "cancelled" and ran == []
    # every hand-over was drained and nothing is left waiting
    k = app.keys("default")
    wait_until(lambda: app.redis.llen(k.handover) == 0, 10)
    assert not list(app.redis.scan_iter(match=k.waiting_prefix + "*"))


def test_hand_overs_are_idempotent(app: conveyor.Conveyor) -> None:
    """A repeated hand-over (a retry, a second drainer, a restarted worker) counts once."""
    @app.task
    def f() -> None: ...

    wf = app.workflow()
    a, b = wf.add(f, name="a"), wf.add(f, name="b")
    wf.add(f, name="c", after=[a, b])
    handle = wf.enqueue()
    ids = {n: i.id for n, i in handle.info().nodes.items()}
    k = app.keys("default")
    c_short = ids["c"].split("~")[1]
    release = calls.workflow_release(k, [(c_short, ids["a"], "")] * 3, app.limits)
    assert app.scripts.run(release) == (0, 0)
    assert handle.info().nodes["c"].state == conveyor.JobState.SCHEDULED
    release = calls.workflow_release(k, [(c_short, ids["b"], ""), (c_short, ids["a"], "")],
                                     app.limits)
    assert app.scripts.run(release) == (1, 0)
    assert app.scripts.run(release) == (1, 0)  # the same request sent again: its reply
    again = calls.workflow_release(k, [(c_short, ids["b"], ""), (c_short, ids["a"], "")],
                                   app.limits)
    assert app.scripts.run(again) == (0, 0)  # a new request: nothing left to release
    assert handle.info().nodes["c"].state == conveyor.JobState.READY
    assert app.redis.hget(k.counts, "ready") == b"3"
    assert app.redis.llen(k.ready_prefix + "5:") == 3


def test_a_child_stored_after_its_parent_ended_is_settled_on_store(
    app: conveyor.Conveyor,
) -> None:
    """Nodes of different queues are stored one queue at a time: a parent may end first."""
    @app.task(queue="first")
    def parent() -> None: ...

    @app.task(queue="second")
    def child() -> None: ...

    wf = app.workflow()
    p = wf.add(parent, name="p")
    wf.add(child, name="c", after=[p])
    from conveyor.workflow.store import plan

    planned = plan(app, wf)
    (q1, call1, shorts1), (q2, call2, shorts2) = planned.calls
    assert (q1, q2) == ("first", "second")
    app.scripts.run(call1)
    # the parent ran and ended before the second queue was stored
    c_short = shorts2[0]
    p_id = f"first~{shorts1[0]}"
    app.scripts.run(calls.workflow_release(app.keys("second"), [(c_short, p_id, "")],
                                           app.limits))
    assert app.redis.ttl(app.keys("second").waiting(c_short)) > 0  # kept, not for ever
    app.scripts.run(call2)
    handle = app.workflow_handle(planned.id)
    assert handle.info().nodes["c"].state == conveyor.JobState.READY
    assert not app.redis.exists(app.keys("second").waiting(c_short))


def test_batch_helper_and_chain(app: conveyor.Conveyor) -> None:
    @app.task
    def send(i: int) -> int:
        return i

    @app.task
    def report() -> str:
        return "done"

    handle = app.batch(send, [(i,) for i in range(20)], then=report)
    wf = app.workflow()
    nodes = conveyor.chain(wf, (send, 1), (send, 2), report)
    assert [n.after for n in nodes[1:]] == [(nodes[0],), (nodes[1],)]
    wf2 = app.workflow()
    _sends, done = batch(wf2, send, [1, 2, 3], then=report)
    assert done is not None and len(done.after) == 3
    with running_worker(app, concurrency=8):
        results = handle.result(timeout=30)
        assert wf.enqueue().result(timeout=30)[f"{report.name}#1"] == "done"
    assert results[f"{report.name}#1"] == "done"
    assert [results[f"{send.name}#{i + 1}"] for i in range(20)] == list(range(20))


def test_records_expire_once_the_workflow_ended(app: conveyor.Conveyor) -> None:
    @app.task
    def f() -> None: ...

    wf = app.workflow()
    a = wf.add(f, name="a")
    wf.add(f, name="b", after=[a])
    handle = wf.enqueue()
    k = app.keys("default")
    assert app.redis.ttl(k.workflow(handle.short_id)) == -1  # running: kept
    with running_worker(app, concurrency=2):
        handle.result(timeout=30)
        wait_until(lambda: app.redis.ttl(k.workflow(handle.short_id)) > 0, 15)
    assert app.redis.ttl(k.workflow_ended(handle.short_id)) > 0
    assert app.redis.llen(k.handover) == 0
    assert not list(app.redis.scan_iter(match=k.waiting_prefix + "*"))


def test_handover_key_derived_in_lua_matches_keys_module(app: conveyor.Conveyor) -> None:
    @app.task(queue="odd:name")
    def f() -> None: ...

    job = f.enqueue()
    job.cancel()
    k = app.keys("odd:name")
    assert app.redis.llen(k.handover) == 0  # not a workflow node: nothing handed over
    wf = app.workflow()
    wf.add(f, name="x", after=[wf.add(f, name="w")])
    handle = wf.enqueue()
    handle.cancel()
    assert app.redis.llen(k.handover) == 2
    drain_sync(app, ["odd:name"])
    assert app.redis.llen(k.handover) == 0


def test_a_node_delay_counts_from_when_its_parents_are_done(app: conveyor.Conveyor) -> None:
    @app.task
    def first() -> float:
        return time.time()

    @app.task
    def second() -> float:
        return time.time()

    wf = app.workflow()
    a = wf.add(first, name="first")
    wf.add(second.options(delay=0.6), name="second", after=[a])
    with running_worker(app, concurrency=2):
        handle = wf.enqueue()
        results = handle.result(timeout=30)
    info = handle.info()
    assert results["second"] - results["first"] >= 0.5
    assert info.nodes["second"].run_at is not None
    assert info.nodes["second"].run_at >= (info.nodes["first"].finished_at or 0) + 0.55


def test_a_parent_requeued_from_the_dead_letters_before_its_hand_over(
    app: conveyor.Conveyor,
) -> None:
    """Each end of a node is its own outbox entry: the dead one is dropped (the node is
    no longer dead when drained), the later success releases the child."""
    @app.task
    def f() -> None: ...

    wf = app.workflow()
    x = wf.add(f, name="x")
    wf.add(f, name="child", after=[x])
    handle = wf.enqueue()
    k = app.keys("default")

    def run_once(outcome: str) -> None:
        (leased,) = app.scripts.run(calls.fetch(k, 1, app.limits)).jobs
        assert leased.short_id == x.id.split("~")[1]
        app.scripts.run(calls.finish(k, [calls.Outcome(
            leased.short_id, leased.token, outcome, 0.0,
            app.codec.encode_result(None) if outcome == "ok" else "boom")], app.limits))

    run_once("dead")
    assert app.dead_letters("default").requeue(x.id) == 1
    run_once("ok")
    entries = app.redis.lrange(k.handover, 0, -1)
    assert len(entries) == 2 and len(set(entries)) == 2
    drain_sync(app, ["default"])
    assert handle.info().nodes["child"].state == conveyor.JobState.READY
    assert app.redis.llen(k.handover) == 0


def test_a_partly_stored_workflow_is_cancelled_and_named(app: conveyor.Conveyor) -> None:
    @app.task(queue="qa")
    def a() -> None: ...

    @app.task(queue="qb")
    def b() -> None: ...

    wf = app.workflow()
    first = wf.add(a, name="first")
    wf.add(b, name="other-root")
    wf.add(b, name="after-first", after=[first])
    app.redis.set(app.keys("qb").priorities, "not a sorted set")  # qb's call will fail
    with pytest.raises(conveyor.PartialEnqueue, match="queue\\(s\\) qa") as raised:
        wf.enqueue()
    assert [j.id for j in raised.value.jobs] == [first.id]
    assert app.job(first.id).info().state == conveyor.JobState.CANCELLED


def test_async_twins(app: conveyor.Conveyor) -> None:
    import asyncio

    from conveyor.workflow import aparent_results

    @app.task(queue="qa")
    def one() -> int:
        return 1

    @app.task(queue="qb")
    def two() -> int:
        return 2

    wf = app.workflow()
    a = wf.add(one, name="one")
    b = wf.add(two, name="two", after=[a])

    async def go() -> tuple[dict[str, Any], dict[str, Any], str]:
        try:
            handle = await wf.aenqueue()
            info = await handle.ainfo()
            assert set(info.nodes) == {"one", "two"}  # (a worker runs: states move on)
            return await handle.aresult(timeout=30), await aparent_results(app, b.id), \
                (await handle.ainfo()).state
        finally:
            await app.aclose()

    with running_worker(app, queues=["qa", "qb"], concurrency=2):
        results, parents, state = asyncio.run(go())
    assert results == {"one": 1, "two": 2} and parents == {"one": 1} and state == "succeeded"
    assert parent_results(app, a.id) == {}

    wf2 = app.workflow()
    wf2.add(two, name="x", after=[wf2.add(one, name="w")])

    async def cancel() -> int:
        try:
            return await (await wf2.aenqueue()).acancel()
        finally:
            await app.aclose()

    assert asyncio.run(cancel()) == 2
