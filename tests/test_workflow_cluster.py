"""Workflows on a real Redis Cluster: nodes on three queues whose slots live on three
different primaries, so every hand-over crosses nodes (no script spans two slots)."""

from __future__ import annotations

import pytest

import conveyor
from helpers import RedisCluster, running_worker
from test_cluster import spread_queues


def test_nodes_on_three_queues_of_three_primaries(
    capp: conveyor.Conveyor, cluster: RedisCluster
) -> None:
    q0, q1, q2 = spread_queues(capp, cluster)
    nodes = {cluster.node_of(capp.keys(q).tag) for q in (q0, q1, q2)}
    assert len(nodes) == 3

    @capp.task(name="split", queue=q0)
    def split(n: int) -> list[int]:
        return list(range(n))

    @capp.task(name="square", queue=q1, retries=0)
    def square(i: int) -> int:
        if i < 0:
            raise ValueError("negative")
        return i * i

    @capp.task(name="total", queue=q2)
    def total(label: str) -> str:
        return label

    @capp.task(name="cleanup", queue=q0)
    def cleanup() -> str:
        return "cleaned"

    wf = capp.workflow()
    root = wf.add(split, 5, name="split")
    squares = [wf.add(square, i, name=f"sq{i}", after=[root]) for i in range(5)]
    wf.add(total, "sum", name="total", after=squares)
    bad = wf.add(square, -1, name="bad", after=[root])
    doomed = wf.add(total, "never", name="doomed", after=[bad])
    wf.add(cleanup, name="cleanup", after=[doomed, *squares], run_if="finished")
    handle = wf.enqueue()
    assert handle.queue == q0
    with running_worker(capp, queues=[q0, q1, q2], concurrency=4):
        with pytest.raises(conveyor.JobFailed, match="negative"):
            handle.result(timeout=60)
        info = handle.info()
    assert info.state == "failed"
    assert info.nodes["total"].result == "sum"
    assert [info.nodes[f"sq{i}"].result for i in range(5)] == [0, 1, 4, 9, 16]
    assert info.nodes["doomed"].state == conveyor.JobState.CANCELLED
    assert "parent 'bad'" in (info.nodes["doomed"].error or "")
    assert info.nodes["cleanup"].result == "cleaned"
    assert info.nodes["split"].queue == q0 and info.nodes["total"].queue == q2
    for q in (q0, q1, q2):
        assert capp.redis.llen(capp.keys(q).handover) == 0


def test_cancel_on_the_cluster(capp: conveyor.Conveyor, cluster: RedisCluster) -> None:
    q0, q1, q2 = spread_queues(capp, cluster)
    tasks = [capp.task(name=f"t.{q}", queue=q)(lambda: None) for q in (q0, q1, q2)]
    wf = capp.workflow()
    conveyor.chain(wf, *tasks)
    handle = wf.enqueue()
    assert handle.info().counts == {"ready": 1, "scheduled": 2}
    assert handle.cancel() == 3
    with pytest.raises(conveyor.JobCancelled):
        handle.result(timeout=5)
