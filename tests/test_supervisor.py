"""The supervisor with real child processes against a real redis-server.

Every test checks the ledger the tasks write themselves: no job lost, and no job run
twice unless a fault the test injected explains it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apps import supervised
from apps.supervision import SupervisorProcess, children_of, conveyor_command
from helpers import RedisServer, env_with_src


@pytest.fixture
def launch(redis_server: RedisServer, namespace: str, tmp_path: Path
           ) -> Iterator[Any]:
    started: list[SupervisorProcess] = []

    def start(*args: str) -> SupervisorProcess:
        sup = SupervisorProcess(redis_server.url, namespace, tmp_path / "supervisor.log", *args)
        started.append(sup.start())
        return sup

    yield start
    for sup in started:
        sup.stop()


def succeeded(sup: SupervisorProcess, jobs: list[Any]) -> bool:
    return all(j.info().state.value == "succeeded" for j in jobs)


def test_sigkilled_child_is_replaced_and_its_jobs_come_back(launch: Any) -> None:
    sup = launch("-p", "2", "-c", "2")
    first = sup.wait_children(2)
    work = sup.app.tasks["supervised.work"]
    jobs = work.enqueue_many([(f"j{n}", 0.3) for n in range(24)])
    sup.wait(lambda: len(sup.runs()) >= 4, 15, "work to start")
    victim = first[0]
    os.kill(victim, signal.SIGKILL)
    after = sup.wait_children(2)
    assert victim not in after and first[1] in after
    sup.wait(lambda: succeeded(sup, jobs), 40, "every job to succeed", interval=0.1)
    counts = sup.counts()
    assert set(counts) == {f"j{n}" for n in range(24)}
    assert sum(counts.values()) - len(jobs) <= 2  # at most the victim's two leased jobs
    assert "killed by SIGKILL" in sup.log()
    assert any(d["kind"] == "restart" for d in sup.decisions())
    assert sup.stop() == 0
    assert children_of(sup.pid) == []
    # Stopped children left the registry; only the SIGKILLed one remains until it expires.
    assert sup.registered_pids() == {victim}


def test_child_stuck_past_its_timeout_is_replaced_then_the_job_dies(launch: Any) -> None:
    sup = launch("-p", "1", "-c", "3")
    (first,) = sup.wait_children(1)
    job = sup.app.tasks["supervised.stuck"].enqueue("stuck")
    others = sup.app.tasks["supervised.work"].enqueue_many([(f"w{n}", 0.05) for n in range(6)])

    def dead() -> bool:
        return job.info().state.value == "dead"

    sup.wait(dead, 40, "the stuck job to die", interval=0.1)
    info = job.info()
    assert info.attempts == 2 and "timeout" in (info.error or "")
    stuck_pids = [pid for label, pid in sup.runs() if label == "stuck"]
    assert len(stuck_pids) == 2 and stuck_pids[0] == first
    assert stuck_pids[1] != first, "the retry ran in the process that held the stuck thread"
    replaced = [d for d in sup.decisions() if d["kind"] == "replace"]
    assert replaced and "stuck" in replaced[-1]["text"]
    # The child knows it is supervised: its log does not ask to run under a supervisor.
    assert "overran its" in sup.log() and "the supervisor will replace this process" in sup.log()
    assert "run workers under the supervisor" not in sup.log()
    # Both processes that held a stuck thread are gone, replaced by fresh ones.
    sup.wait(lambda: not set(stuck_pids) & set(sup.children()), 40, "the stuck processes to exit")
    sup.wait_children(1)
    sup.wait(lambda: succeeded(sup, others), 20, "the other jobs")
    assert all(sup.counts()[f"w{n}"] == 1 for n in range(6))


def test_max_jobs_per_child_recycles_without_loss(launch: Any) -> None:
    sup = launch("-p", "2", "-c", "2", "--max-jobs-per-child", "5")
    sup.wait_children(2)
    jobs = sup.app.tasks["supervised.work"].enqueue_many([(f"r{n}", 0.02) for n in range(40)])
    sup.wait(lambda: succeeded(sup, jobs), 60, "every job to succeed", interval=0.1)
    counts = sup.counts()
    assert counts == {f"r{n}": 1 for n in range(40)}, "a job was lost or ran twice"
    assert all(j.info().attempts == 1 for j in jobs)
    pids = {pid for _, pid in sup.runs()}
    assert len(pids) >= 8  # 40 jobs, at most 5 per process
    per_pid: dict[int, int] = {}
    for _, pid in sup.runs():
        per_pid[pid] = per_pid.get(pid, 0) + 1
    assert max(per_pid.values()) <= 5
    sup.wait_children(2)


def test_second_signal_stops_children_at_once(launch: Any) -> None:
    sup = launch("-p", "2", "-c", "1", "--grace", "60")
    sup.wait_children(2)
    jobs = sup.app.tasks["supervised.work"].enqueue_many([(f"s{n}", 30) for n in range(2)])
    sup.wait(lambda: len(sup.runs()) == 2, 15, "both long jobs to start")
    sup.signal(signal.SIGTERM)
    sup.wait(lambda: "draining 1 running job(s) for up to 60 s" in sup.log(), 10,
             "the children to start draining")
    assert sup.process is not None and sup.process.poll() is None  # the jobs take 30 s
    began = time.monotonic()
    sup.signal(signal.SIGINT)
    assert sup.process.wait(20) == 0
    assert time.monotonic() - began < 15
    # The interrupted jobs are retried, not lost.
    for job in jobs:
        assert job.info().state.value in ("retrying", "ready", "scheduled")


@pytest.mark.slow
def test_autoscale_grows_on_a_burst_and_shrinks_when_idle(launch: Any) -> None:
    sup = launch("--autoscale", "1:4", "-c", "2", "--target-wait", "2")
    sup.wait_children(1)
    counts_key = sup.app.keys("supervised").counts
    # 300 jobs of 0.2 s: one child (2 at a time) would need 30 s.
    jobs = sup.app.tasks["supervised.work"].enqueue_many([(f"b{n}", 0.2) for n in range(300)])
    began = time.monotonic()

    def grown() -> int | None:
        if len(sup.children()) != 4:
            return None
        return int(sup.client.hget(counts_key, "ready") or 0)

    backlog_at_max = sup.wait(grown, 15, "4 children while jobs wait")
    reached = time.monotonic() - began
    assert backlog_at_max > 100, "reached the maximum only as the burst was draining"
    sup.wait(lambda: succeeded(sup, jobs), 40, "every job to succeed", interval=0.2)
    sup.wait_children(1, timeout=40)
    kinds = [d["kind"] for d in sup.decisions()]
    assert kinds.count("scale in") == 3 and "scale out" in kinds
    assert sup.counts() == {f"b{n}": 1 for n in range(300)}, "a job was lost or ran twice"
    # A child stopped mid-job would have run that job twice: the ledger above rules it out.
    # (attempts may read 2 for a job whose lease ran out before it started, once, on a
    # loaded machine: a lost lease, not a stop mid-job; the job still ran once.)
    infos = [j.info() for j in jobs]
    assert all(i.state.value == "succeeded" for i in infos)
    retried = [(i.id, i.attempts, i.error) for i in infos
               if i.attempts != 1 and "lease expired" not in (i.error or "")]
    assert not retried, f"retried for another reason than a lost lease: {retried}"
    log = sup.log()
    assert "killed by" not in log and "did not stop in time" not in log
    shown = subprocess.run(
        [*conveyor_command(), "info", "--url", sup.url, "--namespace", sup.namespace],
        capture_output=True, text=True, timeout=30, env=env_with_src(), check=True).stdout
    assert "workers (1 live)" in shown and "autoscaling 1..4" in shown
    assert "scale out: 1 -> 4" in shown and "scale in: 2 -> 1" in shown
    print(f"reached 4 children {reached:.1f} s after the burst with {backlog_at_max} jobs ready")


def test_max_memory_per_child_recycles_without_loss(launch: Any) -> None:
    # Every process is over 1 MiB: each one is drained and replaced soon after it starts.
    sup = launch("-p", "1", "-c", "2", "--max-memory-per-child", "1M")
    jobs = sup.app.tasks["supervised.work"].enqueue_many([(f"m{n}", 0.3) for n in range(12)])
    sup.wait(lambda: succeeded(sup, jobs), 60, "every job to succeed", interval=0.1)
    recycled = sup.wait(lambda: [d for d in sup.decisions() if d["kind"] == "recycle"], 20,
                        "a recycle decision")
    assert "MiB" in recycled[0]["text"]
    assert sup.counts() == {f"m{n}": 1 for n in range(12)}, "a job was lost or ran twice"
    assert len({pid for _, pid in sup.runs()}) >= 2


def test_burst_supervisor_exits_once_the_work_is_done(launch: Any, redis_server: RedisServer,
                                                      namespace: str) -> None:
    app = supervised.build(redis_server.url, namespace)  # enqueue before the workers start
    jobs = app.tasks["supervised.work"].enqueue_many([(f"u{n}", 0.05) for n in range(20)])
    app.close()
    sup = launch("-p", "2", "-c", "2", "--burst")
    assert sup.process is not None
    assert sup.process.wait(60) == 0, sup.log()
    unfinished = [(j.id, i.state.value, i.attempts, i.error) for j in jobs
                  if (i := j.info()).state.value != "succeeded"]
    assert not unfinished, f"the burst ended before these jobs succeeded: {unfinished}"
    assert sup.counts() == {f"u{n}": 1 for n in range(20)}
