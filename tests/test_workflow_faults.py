"""Workflows under faults: real worker processes SIGKILLed at random, acknowledgements
repeated, hand-overs interrupted. Every node must succeed once and start only after its
parents; a fan-in must be made ready exactly once."""

from __future__ import annotations

import collections
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import conveyor
from apps.ledger import OTHER_QUEUES, QUEUE, LedgerApp, build
from apps.ledger_fleet import Fleet, kill_storm
from conveyor.scripts import calls
from conveyor.sink import stream_events
from conveyor.workflow.release import drain_sync
from helpers import RedisServer, record_field, running_worker, wait_until
from injection import ERRORS, FaultPlan

FANOUT = 1000


@pytest.fixture
def ledger(make_server: type[RedisServer]) -> Iterator[LedgerApp]:
    server = make_server(durable=True).start()
    app = build(server.url, f"w{uuid.uuid4().hex[:8]}")
    yield app
    app.close()


@pytest.fixture
def fleet_of(ledger: LedgerApp, tmp_path: Path) -> Iterator[Callable[..., Fleet]]:
    made: list[Fleet] = []

    def make(size: int, concurrency: int = 4) -> Fleet:
        made.append(Fleet(ledger, tmp_path, size, concurrency).start())
        return made[-1]

    yield make
    for fleet in made:
        for worker in fleet.workers:
            worker.kill()


def fan_out_fan_in(ledger: LedgerApp, n: int, spread: bool = False
                   ) -> conveyor.WorkflowHandle:
    """root -> n sends -> fan-in; with ``spread``, the sends alternate between two other
    queues and the fan-in sits on a third."""
    tasks = [ledger.record_on[q] for q in OTHER_QUEUES] if spread else [ledger.record]
    wf = ledger.app.workflow()
    root = wf.add(ledger.record, -1, name="root")
    sends = [wf.add(tasks[i % len(tasks)], i, 0.01, name=f"send{i}", after=[root])
             for i in range(n)]
    wf.add(tasks[-1], -2, name="fanin", after=sends)
    return wf.enqueue()


@pytest.mark.slow
@pytest.mark.parametrize("spread", [False, True], ids=["one-queue", "three-queues"])
def test_fan_out_fan_in_under_a_kill_storm(
    ledger: LedgerApp, fleet_of: Callable[..., Fleet], spread: bool
) -> None:
    for queue in (QUEUE, *OTHER_QUEUES):  # successes are counted in the events streams
        stream_events(ledger.app, queue)
    handle = fan_out_fan_in(ledger, FANOUT, spread)
    fleet = fleet_of(2)

    def finished() -> bool:
        return handle.info().state != "running"

    try:
        storm = kill_storm(fleet, seconds=8.0, interval=0.5, min_kills=10, max_seconds=20,
                           work_left=lambda: not finished())
        wait_until(finished, 90, interval=0.3,
                   message=f"workflow to end: {handle.info().counts}\n{fleet.logs()}")
    finally:
        fleet.stop()
    info = handle.info()
    assert info.state == "succeeded", info.counts
    assert info.counts == {"succeeded": FANOUT + 2}
    counts = ledger.counts()
    assert set(counts) == {str(i) for i in range(-2, FANOUT)}, "a node never ran"
    # One success recorded per node (the events stream holds every terminal transition).
    shorts = [job.id.split("~")[1] for job in info.nodes.values()]
    successes = ledger.succeeded_events(shorts, (QUEUE, *OTHER_QUEUES))
    assert all(successes[s] == 1 for s in shorts), "a node succeeded twice"
    # Every run started was a counted attempt (a lease lost with a killed worker) or a
    # lease given back because its worker died before it told Redis the run began
    # (counted as 'lu'): a node made ready a second time would run beyond them both.
    for name, job in info.nodes.items():
        label = {"root": "-1", "fanin": "-2"}.get(name, name.removeprefix("send"))
        unstarted = int(record_field(ledger.app, job.id, "lu") or 0)
        assert 1 <= counts[label] <= job.attempts + unstarted, (
            name, counts[label], job.attempts, unstarted)
    assert ledger.queue_sizes() == {"leases": 0, "delayed": 0, "dead": 0, "ready": 0}
    for queue in OTHER_QUEUES:
        k = ledger.app.keys(queue)
        assert ledger.app.redis.zcard(k.leases) == 0
        assert int(ledger.app.redis.hget(k.counts, "ready") or 0) == 0
    if spread:
        assert {info.nodes[n].queue for n in ("send0", "send1", "fanin")} == set(OTHER_QUEUES)
    # The fan-in started after the last run of every send (and the sends after the root).
    runs = [label for label, _ in ledger.runs()]
    assert runs.index("-2") > max(i for i, label in enumerate(runs) if label not in ("-1", "-2"))
    assert runs.index("-1") < min(i for i, label in enumerate(runs) if label not in ("-1", "-2"))
    print(f"nodes={FANOUT + 2} kills={storm.kills} during work={storm.kills_during_work}"
          f" re-executions={sum(counts.values()) - FANOUT - 2} fan-in runs={counts['-2']}")
    assert storm.kills_during_work >= 5


def test_a_killed_workers_hand_over_is_completed_by_the_next_worker(
    ledger: LedgerApp,
) -> None:
    """The parent's acknowledgement is recorded, then the worker dies before telling the
    children: the entry waits in the outbox; a worker that starts later hands it over."""
    app = ledger.app
    wf = app.workflow()
    root = wf.add(ledger.record, -1, name="root")
    wf.add(ledger.record, 1, name="child", after=[root])
    handle = wf.enqueue()
    k = app.keys(QUEUE)
    fetched = app.scripts.run(calls.fetch(k, 1, app.limits))
    (leased,) = fetched.jobs
    ack = calls.finish(k, [calls.Outcome(leased.short_id, leased.token, "ok", 0.0,
                                         app.codec.encode_result(-1))], app.limits)
    assert app.scripts.run(ack).handed_over == 1
    # ... and the worker is gone: nothing told the child.
    assert handle.info().nodes["child"].state == conveyor.JobState.SCHEDULED
    # An acknowledgement sent again after a lost reply answers as the first time, and a
    # new one with the same token is refused; neither hands over anything more.
    assert app.scripts.run(ack).codes == [calls.FINISH_SUCCEEDED]
    again = calls.finish(k, [calls.Outcome(leased.short_id, leased.token, "ok", 0.0,
                                           app.codec.encode_result(-1))], app.limits)
    assert app.scripts.run(again).codes == [calls.FINISH_REFUSED]
    assert app.redis.llen(k.handover) == 1
    with running_worker(app, queues=[QUEUE], concurrency=2):
        result = handle.result(timeout=30)
    assert result == {"root": -1, "child": 1}
    assert ledger.counts() == {"1": 1}  # the root was "run" by hand above
    assert app.redis.llen(k.handover) == 0


def test_a_lease_lost_on_the_last_attempt_cancels_the_children(ledger: LedgerApp) -> None:
    """A node that dies inside ``fetch`` (its worker died on its last attempt) is handed
    over like one that died in ``finish``."""
    app = ledger.app
    wf = app.workflow()
    poison = wf.add(ledger.poison.options(), "p", name="poison")
    wf.add(ledger.record, 1, name="child", after=[poison])
    handle = wf.enqueue()
    k = app.keys(QUEUE)
    p_short = handle.info().nodes["poison"].id.split("~")[1]
    app.redis.hset(k.job(p_short), "attempts", ledger.poison.max_attempts - 1)
    now = app.redis.time()
    now_ms = now[0] * 1000 + now[1] / 1000
    fetched = app.scripts.run(calls.fetch(k, 1, app.limits, now=now_ms))
    assert [j.short_id for j in fetched.jobs] == [p_short]
    (leased,) = fetched.jobs  # its run began (the worker said so), then the worker died
    app.scripts.run(calls.heartbeat(k, [(p_short, leased.token, 1000, True)], now=now_ms))
    later = now_ms + 60_000  # the lease expired
    fetched = app.scripts.run(calls.fetch(k, 1, app.limits, now=later))
    assert fetched.dead == [p_short]
    drain_sync(app, [QUEUE])
    child = handle.info().nodes["child"]
    assert child.state == conveyor.JobState.CANCELLED
    assert "lease expired" in (child.error or "")
    assert handle.info().state == "failed"


@pytest.mark.parametrize("kind", sorted(ERRORS))
def test_hand_overs_survive_each_redis_error(app: conveyor.Conveyor, kind: str) -> None:
    """Every call of the hand-over (the outbox read, the release and settle scripts, the
    pipelines) fails a few times: the workflow still completes, each node once."""
    runs: collections.Counter[str] = collections.Counter()

    @app.task(name="step", queue="q")
    def step(label: str) -> str:
        runs[label] += 1
        return label

    wf = app.workflow()
    root = wf.add(step, "root", name="root")
    mids = [wf.add(step, f"mid{i}", name=f"mid{i}", after=[root]) for i in range(3)]
    wf.add(step, "end", name="end", after=mids)
    with running_worker(app, queues=["q"], concurrency=4), FaultPlan() as plan:
        for target in ("LRANGE", "script:workflow_release", "script:workflow_settle",
                       "pipeline"):
            plan.fail(target, kind, times=2)
        handle = wf.enqueue()
        assert handle.result(timeout=30)["end"] == "end"
        assert plan.injected["script:workflow_release"] >= 1
    assert runs == {"root": 1, "mid0": 1, "mid1": 1, "mid2": 1, "end": 1}


def test_mangled_node_records_and_entries_never_stop_a_drain(app: conveyor.Conveyor) -> None:
    @app.task(queue="q")
    def f() -> None: ...

    wf = app.workflow()
    a = wf.add(f, name="a")
    b = wf.add(f, name="b", after=[a])
    wf.add(f, name="c", after=[b])
    handle = wf.enqueue()
    k = app.keys("q")
    a_short, b_short = a.id.split("~")[1], b.id.split("~")[1]
    app.redis.hset(k.job(a_short), mapping={"s": "succeeded", "wfc": b"\xff{not json"})
    app.redis.hset(k.job(b_short), mapping={"s": "dead", "wf": "no-separator"})
    app.redis.rpush(k.handover, a_short, b_short, "nonsense entry", b"\xff\xfe")
    drain_sync(app, ["q"])  # never raises
    assert app.redis.llen(k.handover) == 0
    info = handle.info()
    assert info.nodes["c"].state == conveyor.JobState.CANCELLED  # b is dead: c learnt it
    assert "parent 'b'" in (info.nodes["c"].error or "")
    assert info.state == "failed"
