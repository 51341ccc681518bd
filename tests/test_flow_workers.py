"""Flow control end to end: real worker processes, a ledger of start and end times.

Each test starts `conveyor worker apps.flow_app:app` processes against its own namespace,
sets limits through the public API, and checks the ledger the tasks wrote: never more
runs at once than a cap, never more starts in a window than a rate allows, and limits
changed at runtime obeyed at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import conveyor
from apps.flow_app import make_app, max_overlap, most_starts_in_window, read_ledger
from helpers import FlowFleet, RedisServer, start_told, wait_until

pytestmark = pytest.mark.xdist_group("flow-workers")


@pytest.fixture
def fapp(redis_server: RedisServer, namespace: str) -> Iterator[conveyor.Conveyor]:
    application = make_app(redis_server.url, namespace)
    yield application
    application.close()


@pytest.fixture
def fleet(fapp: conveyor.Conveyor, tmp_path: Path) -> Iterator[FlowFleet]:
    f = FlowFleet(fapp, tmp_path)
    yield f
    f.stop()


def work(app: conveyor.Conveyor) -> conveyor.Task:
    return app.tasks["flow.work"]


def running_now(app: conveyor.Conveyor) -> int:
    return int(app.redis.hget(app.keys("flow").counts, "running") or 0)


def test_queue_cap_holds_across_workers(fapp: conveyor.Conveyor, fleet: FlowFleet) -> None:
    fapp.queue("flow").set_limits(concurrency=5)
    fleet.start(3, concurrency=8)
    jobs = work(fapp).enqueue_many([(f"j{i}", 0.2) for i in range(40)])
    t0 = time.time()
    for job in jobs:
        job.result(timeout=60)
    elapsed = time.time() - t0
    runs = read_ledger(fapp.redis, fapp.namespace)
    assert len(runs) == 40
    assert max_overlap(runs) == 5  # the cap, used, never passed (24 slots were free)
    assert elapsed >= 40 / 5 * 0.2 * 0.9  # throughput at most 5 / job time ...
    assert elapsed < 40 / 5 * 0.2 * 3  # ... and near it
    assert running_now(fapp) == 0


def test_tenant_cap_never_blocks_another_tenant(fapp: conveyor.Conveyor, fleet: FlowFleet) -> None:
    fapp.queue("flow").set_limits(tenant_concurrency=2)
    fleet.start(3, concurrency=8)
    work(fapp).options(tenant="A").enqueue_many([(f"A{i}", 2.0) for i in range(30)])
    wait_until(lambda: len(read_ledger(fapp.redis, fapp.namespace)) >= 2, timeout=20,
               message="A's first runs")
    sent = time.time()
    b_jobs = work(fapp).options(tenant="B").enqueue_many([(f"B{i}", 0.02) for i in range(20)])
    for job in b_jobs:
        job.result(timeout=30)
    runs = read_ledger(fapp.redis, fapp.namespace)
    a_runs = [r for r in runs if r.label.startswith("A")]
    b_runs = [r for r in runs if r.label.startswith("B")]
    assert max_overlap(a_runs, until=time.time()) <= 2
    assert max_overlap(b_runs) <= 2
    first_b = min(r.start for r in b_runs)
    # B does not wait behind A's backlog (15 rounds of 2 s): it starts at once, and its 20
    # jobs (10 rounds of 20 ms at its cap of 2) are done in well under one of A's jobs.
    assert first_b - sent < 1.0
    assert max(r.end or 0 for r in b_runs) - sent < 2.0


def test_queue_rate_is_used_and_never_passed(fapp: conveyor.Conveyor, fleet: FlowFleet) -> None:
    fapp.queue("flow").set_limits(rate="50/s")
    fleet.start(3, concurrency=16)
    jobs = work(fapp).enqueue_many([(f"r{i}", 0.0) for i in range(300)])
    for job in jobs:
        job.result(timeout=60)
    starts = sorted(r.start for r in read_ledger(fapp.redis, fapp.namespace))
    assert len(starts) == 300
    assert most_starts_in_window(starts, 1.0) <= 100  # rate x (T + 1) with T = 1 s
    span = starts[-1] - starts[0]  # 50 at once (the bucket), then 250 at 50/s: 5 s
    assert 4.5 <= span <= 5.5, span


def test_tenant_rates_with_a_queue_rate(fapp: conveyor.Conveyor, fleet: FlowFleet) -> None:
    fapp.queue("flow").set_limits(rate="15/s", tenant_rate="10/s")
    fleet.start(2, concurrency=16)
    jobs = []
    for tenant in "abc":
        jobs += work(fapp).options(tenant=tenant).enqueue_many(
            [(f"{tenant}{i}", 0.0) for i in range(20)])
    for job in jobs:
        job.result(timeout=60)
    runs = read_ledger(fapp.redis, fapp.namespace)
    starts = sorted(r.start for r in runs)
    assert most_starts_in_window(starts, 1.0) <= 30  # the queue's 15/s
    for tenant in "abc":
        mine = [r.start for r in runs if r.label.startswith(tenant)]
        assert most_starts_in_window(mine, 1.0) <= 20  # each tenant's 10/s
    span = starts[-1] - starts[0]  # 15 at once, then 45 at 15/s: 3 s
    assert 2.6 <= span <= 4.0, span


def test_a_killed_workers_slots_come_back_with_its_leases(
    fapp: conveyor.Conveyor, fleet: FlowFleet
) -> None:
    fapp.queue("flow").set_limits(concurrency=3)
    fleet.start(1, concurrency=8)
    victim = fleet.procs[0]
    held = work(fapp).enqueue_many([(f"k{i}", 2.0) for i in range(3)])
    wait_until(lambda: running_now(fapp) == 3, timeout=20, message="3 slots taken")
    wait_until(lambda: all(start_told(fapp, j.id) for j in held), 10, message="starts told")
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(10)
    killed_at = time.time()
    later = work(fapp).enqueue_many([(f"n{i}", 0.05) for i in range(6)])
    fleet.start(1, concurrency=8)
    for job in held + later:
        job.result(timeout=30)
    runs = read_ledger(fapp.redis, fapp.namespace)
    # The slots came back when the leases expired (1.5 s): the killed jobs ran again
    # first (front of the queue, 2 s), then the others; never more than 3 at once.
    assert max(r.end or 0 for r in runs) - killed_at < 15
    assert {job.info().attempts for job in held} == {2}
    assert max_overlap([r for r in runs if r.pid != victim.pid]) <= 3
    wait_until(lambda: running_now(fapp) == 0, timeout=5, message="no slot leaked")


def test_limits_changed_at_runtime_hold_within_a_second(
    fapp: conveyor.Conveyor, fleet: FlowFleet
) -> None:
    q = fapp.queue("flow")
    q.set_limits(concurrency=1)
    fleet.start(2, concurrency=8)
    work(fapp).enqueue_many([(f"c{i}", 0.3) for i in range(200)])
    wait_until(lambda: running_now(fapp) == 1, timeout=20, message="one running")
    time.sleep(0.5)
    assert running_now(fapp) == 1
    raised = time.time()
    q.set_limits(concurrency=6)
    wait_until(lambda: running_now(fapp) == 6, timeout=5, interval=0.01, message="6 running")
    assert time.time() - raised < 1.0
    cleared = time.time()
    q.clear_limits()
    wait_until(lambda: running_now(fapp) >= 12, timeout=5, interval=0.01, message="all slots")
    assert time.time() - cleared < 1.0
    q.set_limits(concurrency=2)
    wait_until(lambda: running_now(fapp) <= 2, timeout=5, message="back to 2")
    fleet.stop()
    with contextlib.suppress(Exception):
        assert running_now(fapp) == 0


def test_an_idle_worker_does_not_poll_a_queue_held_by_its_limits(
    fapp: conveyor.Conveyor, fleet: FlowFleet, redis_server: RedisServer
) -> None:
    """Nothing eligible (a cap of 0 over 100 ready jobs): the worker blocks on its wake key
    and looks at the queue once per quiet spell, never in a loop."""
    fapp.queue("flow").set_limits(concurrency=0)
    work(fapp).enqueue_many([(f"i{i}", 0.0) for i in range(100)])
    fleet.start(1, concurrency=8)
    time.sleep(2)
    port = fapp.url.rsplit(":", 1)[1].split("/")[0]
    monitor = subprocess.Popen(["redis-cli", "-p", port, "monitor"], stdout=subprocess.PIPE)
    window = 22.0
    time.sleep(window)
    monitor.terminate()
    lines = monitor.communicate(timeout=10)[0].decode(errors="replace").splitlines()
    ns = fapp.namespace
    sent = [line for line in lines if "[0 lua]" not in line and ns in line]
    scripts = [line for line in sent if '"evalsha"' in line.lower()]
    # One fetch per quiet spell (20 s): the limits cost 0.05 commands/s; everything the
    # worker sends (registry heartbeats included) stays near the idle budget.
    assert len(scripts) <= 2, scripts
    assert len(sent) / window <= 0.7, sent
    assert running_now(fapp) == 0


def test_a_rate_raised_at_runtime_is_used_within_a_second(
    fapp: conveyor.Conveyor, fleet: FlowFleet
) -> None:
    q = fapp.queue("flow")
    q.set_limits(rate="4/s")
    fleet.start(2, concurrency=16)
    work(fapp).enqueue_many([(f"s{i}", 0.0) for i in range(400)])
    wait_until(lambda: len(read_ledger(fapp.redis, fapp.namespace)) >= 8, timeout=20,
               message="the slow rate at work")
    time.sleep(1.0)
    raised = time.time()
    q.set_limits(rate="100/s")
    time.sleep(2.0)
    starts = [r.start for r in read_ledger(fapp.redis, fapp.namespace)]
    before = [t for t in starts if t < raised]
    first = [t for t in starts if raised <= t < raised + 1.0]
    second = [t for t in starts if raised + 1.0 <= t < raised + 2.0]
    assert most_starts_in_window(before, 1.0) <= 8  # 4/s: at most rate x (T + 1)
    assert len(first) >= 50 and len(second) >= 50, (len(first), len(second))  # ~100/s
    q.clear_limits()
    wait_until(lambda: len(read_ledger(fapp.redis, fapp.namespace)) == 400, timeout=30,
               message="the rest at once")
