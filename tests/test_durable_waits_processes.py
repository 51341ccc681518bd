"""Durable waits with real worker processes: a signal sent from another process a minute
later, a parent waiting for a child on another queue, and workers SIGKILLed while jobs are
suspended and while one is resuming. Every wait resumes once, and the code after it runs
once per completed run."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import conveyor
from apps.waits_app import ledger, make_app
from conveyor import JobState
from helpers import CONVEYOR, RedisServer, WorkerProcesses, start_told, wait_until


@pytest.fixture
def wapp(redis_server: RedisServer, namespace: str) -> Iterator[conveyor.Conveyor]:
    application = make_app(redis_server.url, namespace)
    yield application
    application.close()


@pytest.fixture
def workers(wapp: conveyor.Conveyor, tmp_path: Path) -> Iterator[WorkerProcesses]:
    w = WorkerProcesses(wapp, tmp_path, "apps.waits_app:app", "WAITS_NAMESPACE",
                        ("-q", "orders", "-q", "images", "-c", "4"))
    yield w
    w.stop()


def _suspended(job: conveyor.Job) -> bool:
    return job.info().state == JobState.SUSPENDED


@pytest.mark.timeout(150)
def test_a_signal_sent_from_another_process_a_minute_later_resumes_the_job(
        wapp: conveyor.Conveyor, workers: WorkerProcesses) -> None:
    workers.start()
    job = wapp.tasks["waits.approval"].enqueue("a")
    wait_until(lambda: _suspended(job), 20, message=f"suspended\n{workers.logs()}")
    time.sleep(60)  # the point of the test: a minute with the job suspended, no slot held
    assert _suspended(job) and wapp.monitor.backlog("orders").active == 0
    sent = subprocess.run([CONVEYOR, "signal", job.id, "go", "--data", json.dumps("ok"),
                           "--url", wapp.url, "--namespace", wapp.namespace],
                          env=workers.env, capture_output=True, text=True, timeout=30)
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert job.result(timeout=20) == "a:ok"
    seen = ledger(wapp.redis, wapp.namespace)
    assert seen[("top", "a")] == 2 and seen[("after", "a")] == 1


@pytest.mark.timeout(120)
def test_suspended_jobs_outlive_a_sigkilled_worker(
        wapp: conveyor.Conveyor, workers: WorkerProcesses) -> None:
    first = workers.start()
    jobs = [wapp.tasks["waits.approval"].enqueue(f"j{i}") for i in range(6)]
    wait_until(lambda: wapp.monitor.backlog("orders").suspended == 6, 20,
               message=f"6 suspended\n{workers.logs()}")
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    # Signals while no worker runs are recorded; the jobs wait in the ready lists.
    for i, job in enumerate(jobs):
        assert job.signal("go", i) is True
    assert wapp.monitor.backlog("orders").suspended == 0
    workers.start()
    assert [job.result(timeout=30) for job in jobs] == [f"j{i}:{i}" for i in range(6)]
    seen = ledger(wapp.redis, wapp.namespace)
    assert all(seen[("after", f"j{i}")] == 1 for i in range(6)), seen


@pytest.mark.timeout(120)
def test_a_worker_sigkilled_while_a_job_resumes_leaves_the_wait_recorded(
        wapp: conveyor.Conveyor, workers: WorkerProcesses) -> None:
    first = workers.start()
    job = wapp.tasks["waits.approval"].enqueue("r", 30.0)
    wait_until(lambda: _suspended(job), 20, message=f"suspended\n{workers.logs()}")
    assert job.signal("go", "yes") is True
    wait_until(lambda: ledger(wapp.redis, wapp.namespace)[("resumed", "r")] == 1, 20,
               message="resumed")
    wait_until(lambda: start_told(wapp, job.id), 10, message="the start told")
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    # Shorter hold for the run that takes the job over: its lease lapsed with the worker.
    wapp.redis.hset(wapp.keys("orders").job(job.short_id), "a",
                    wapp.codec.encode_args("waits.approval", ("r", 0.0), {}))
    workers.start()
    assert job.result(timeout=30) == "r:yes"  # the recorded payload: no second wait
    seen = ledger(wapp.redis, wapp.namespace)
    assert seen[("resumed", "r")] == 2 and seen[("after", "r")] == 1
    assert job.info().attempts == 2  # the run the kill cut short is counted


@pytest.mark.timeout(120)
def test_a_parent_waits_for_its_child_on_another_queue_across_a_sigkill(
        wapp: conveyor.Conveyor, workers: WorkerProcesses) -> None:
    first = workers.start()
    parent = wapp.tasks["waits.publish"].enqueue("p", 3.0)
    wait_until(lambda: ledger(wapp.redis, wapp.namespace)[("child", "p")] == 1, 20,
               message=f"child running\n{workers.logs()}")
    assert _suspended(parent)
    first.send_signal(signal.SIGKILL)  # the child's run dies with it
    first.wait(10)
    workers.start()
    assert parent.result(timeout=40) == "published p@small"
    seen = ledger(wapp.redis, wapp.namespace)
    assert seen[("child", "p")] == 2  # run again after its lease lapsed: one child job
    assert seen[("after", "p")] == 1
    assert len(wapp.redis.keys(wapp.keys("images").job("*"))) == 1
