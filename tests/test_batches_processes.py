"""Batch tasks with real worker processes: a worker SIGKILLed in the middle of a call
(every item of that call runs again elsewhere and ends succeeded exactly once), and one
SIGSTOPped until another took its items over (its late outcomes are refused, each by its
item's token)."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import conveyor
from apps.batch_app import hold_key, ledger_key, make_app
from conveyor import JobState
from helpers import RedisServer, WorkerProcesses, start_told, stop_processes, wait_until


@pytest.fixture
def bapp(redis_server: RedisServer, namespace: str) -> Iterator[conveyor.Conveyor]:
    application = make_app(redis_server.url, namespace)
    yield application
    application.close()


def _ledger(app: conveyor.Conveyor) -> list[str]:
    return [e.decode() for e in app.redis.lrange(ledger_key(app.namespace), 0, -1)]


@pytest.fixture
def workers(bapp: conveyor.Conveyor, tmp_path: Path) -> Iterator[WorkerProcesses]:
    w = WorkerProcesses(bapp, tmp_path, "apps.batch_app:app", "BATCH_NAMESPACE",
                        ("-q", "index", "-c", "2"))
    yield w
    w.stop()


@pytest.mark.timeout(90)
def test_a_worker_killed_mid_call_leaves_every_item_to_run_again_once(
        bapp: conveyor.Conveyor, workers: WorkerProcesses) -> None:
    ns, start = bapp.namespace, workers.start
    try:
        bapp.redis.set(hold_key(ns), 1)
        jobs = bapp.tasks["batch.index"].enqueue_many(range(30))
        first = start()
        # Two calls (max=20, -c 2) both under way: every job is in a call when killed.
        wait_until(lambda: len([e for e in _ledger(bapp) if e.startswith("start")]) == 30, 20,
                   message="both calls under way")
        # Once told that the runs began, Redis charges the lost leases an attempt each.
        wait_until(lambda: all(start_told(bapp, j.id) for j in jobs), 10,
                   message="the starts told")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert not any(e.startswith("done") for e in _ledger(bapp))
        bapp.redis.delete(hold_key(ns))
        start()
        wait_until(lambda: all(j.info().state == JobState.SUCCEEDED for j in jobs), 40,
                   message="every job succeeded")
    finally:
        stop_processes(workers.procs)
    done = Counter(e.split()[1] for e in _ledger(bapp) if e.startswith("done"))
    assert done == Counter({str(n): 1 for n in range(30)})
    for n, job in enumerate(jobs):
        assert job.result(timeout=1).startswith(f"indexed {n} by ")
        assert job.info().attempts == 2  # the lost run counted, as for any job


@pytest.mark.timeout(90)
def test_a_stalled_workers_late_outcomes_are_refused_item_by_item(
        bapp: conveyor.Conveyor, workers: WorkerProcesses) -> None:
    ns = bapp.namespace
    bapp.redis.set(hold_key(ns), 1)
    jobs = bapp.tasks["batch.index"].enqueue_many(range(10))
    stalled = workers.start()
    wait_until(lambda: len([e for e in _ledger(bapp) if e.startswith("start")]) == 10, 20,
               message="the call under way")
    wait_until(lambda: all(start_told(bapp, j.id) for j in jobs), 10, message="the starts told")
    stalled.send_signal(signal.SIGSTOP)  # its heartbeats stop: the leases run out
    bapp.redis.delete(hold_key(ns))
    other = workers.start()
    wait_until(lambda: all(j.info().state == JobState.SUCCEEDED for j in jobs), 30,
               message="every job succeeded on the other worker")
    stalled.send_signal(signal.SIGCONT)  # its call ends now, long after its leases
    wait_until(lambda: "10 outcome(s) refused" in workers.log(stalled), 20,
               message=f"the stalled worker's outcomes refused\n{workers.log(stalled)}")
    for n, job in enumerate(jobs):
        assert job.result(timeout=1) == f"indexed {n} by {other.pid}"
        assert job.info().attempts == 2
    done = [e for e in _ledger(bapp) if e.startswith("done")]
    assert Counter(e.split()[2] for e in done) == {str(stalled.pid): 10, str(other.pid): 10}
