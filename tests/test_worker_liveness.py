"""No job waits on a worker that is gone, and no finished job waits on a lapsed lease.

An idle worker is registered as a waiter of its queues: the next enqueue leases its jobs
to it and pushes them onto the worker's hand-off list (``worker/handoff.py``). The
registration lapses within seconds of the worker's death or stop, so new jobs go to a
worker that is alive; a job handed over before that, and never taken off the list, comes
back when its lease ends without using up an attempt (it never ran).

A job whose run has ended keeps its lease, by heartbeat, until Redis has acknowledged its
outcome: while Redis refuses writes (out of memory) or a key that only the acknowledgement
reads is written over, the outcome waits in the worker and the job is not run again.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import conveyor
from apps.flow_app import VT, make_app, read_ledger
from conveyor.scripts import calls
from conveyor.worker.handoff import WAITER_TTL_MS
from helpers import RedisServer, WorkerProcesses, running_worker, wait_until

Q = "q"
# A registration outlives its worker by at most this (its lifetime, with room for a
# loaded machine).
LAPSE_BOUND_S = 12.0


# -- the scripts: what a lease handed over and never taken costs --------------------------


def _enqueue(app: conveyor.Conveyor, short: str, now: float, **options: object) -> None:
    spec = calls.JobSpec(task="t", **options)  # type: ignore[arg-type]
    app.scripts.run(calls.enqueue(app.keys(Q), spec, [(short, b"[[],{}]")], app.limits,
                                  now=now))


def _record(app: conveyor.Conveyor, short: str) -> dict[str, str]:
    raw = app.redis.hgetall(app.keys(Q).job(short))
    return {k.decode(): v.decode() for k, v in raw.items() if k != b"a"}


def test_a_job_handed_over_and_never_taken_comes_back_without_using_an_attempt(
    app: conveyor.Conveyor,
) -> None:
    k = app.keys(Q)
    t0 = float(app.redis.time()[0]) * 1000
    app.scripts.run(calls.register_waiter(k, "gone", 2, WAITER_TTL_MS, now=t0))
    _enqueue(app, "once", t0 + 1, max_attempts=1, visibility_ms=1000)  # retries=0
    assert app.redis.llen(k.handoff("gone")) == 1  # handed over; its worker died
    assert _record(app, "once")["attempts"] == "1"
    # Another worker's fetch after the lease ended: the job is leased again, on the
    # attempt the hand-off took and gave back (it used to end dead, "lease expired").
    fetched = app.scripts.run(calls.fetch(k, 5, app.limits, now=t0 + 5000))
    assert [(j.short_id, j.attempts) for j in fetched.jobs] == [("once", 1)]
    assert fetched.dead == []
    record = _record(app, "once")
    assert record["s"] == "active" and "error" not in record
    assert int(app.redis.hget(k.counts, "running") or 0) == 1
    # The entry left the list with its refund: a worker that was only slow (its pop held
    # up on the way) cannot pop it later and run the job a second time, unleased.
    assert app.redis.llen(k.handoff("gone")) == 0


def test_a_job_taken_off_its_hand_off_list_uses_its_attempt_when_its_lease_ends(
    app: conveyor.Conveyor,
) -> None:
    k = app.keys(Q)
    t0 = float(app.redis.time()[0]) * 1000
    app.scripts.run(calls.register_waiter(k, "taker", 2, WAITER_TTL_MS, now=t0))
    _enqueue(app, "taken", t0 + 1, visibility_ms=1000)
    entry = app.redis.lpop(k.handoff("taker"))  # the worker took it, then died running it
    (leased,) = calls.parse_handoff(entry).jobs
    app.scripts.run(calls.heartbeat(k, [("taken", leased.token, 1000, True)], now=t0 + 2))
    fetched = app.scripts.run(calls.fetch(k, 5, app.limits, now=t0 + 5000))
    assert [(j.short_id, j.attempts) for j in fetched.jobs] == [("taken", 2)]
    assert "lease expired" in _record(app, "taken")["error"]


# -- real worker processes ----------------------------------------------------------------


@pytest.fixture
def fapp(redis_server: RedisServer, namespace: str) -> Iterator[conveyor.Conveyor]:
    application = make_app(redis_server.url, namespace)
    yield application
    application.close()


@pytest.fixture
def workers(fapp: conveyor.Conveyor, tmp_path: Path) -> Iterator[WorkerProcesses]:
    w = WorkerProcesses(fapp, tmp_path, "apps.flow_app:app", "FLOW_NAMESPACE", ("-c", "2"))
    yield w
    w.stop()


def _waiters(app: conveyor.Conveyor) -> dict[str, float]:
    """Registered waiters of the flow queue -> when each registration lapses (ms)."""
    pairs = app.redis.zrange(app.keys("flow").waiters, 0, -1, withscores=True)
    return {member.decode(): score for member, score in pairs}


def _live_waiters(app: conveyor.Conveyor) -> set[str]:
    now_ms = float(app.redis.time()[0]) * 1000
    return {w for w, lapses in _waiters(app).items() if lapses > now_ms}


def _two_idle_workers(fapp: conveyor.Conveyor, workers: WorkerProcesses
                      ) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes], str]:
    """Two registered idle workers: (the one the next enqueue goes to, the other, the
    first one's worker id)."""
    procs = [workers.start(), workers.start()]
    wait_until(lambda: len(_live_waiters(fapp)) == 2, 30,
               message=f"two idle workers registered\n{workers.logs()}")
    [first] = fapp.redis.zrevrange(fapp.keys("flow").waiters, 0, 0)
    first_id = first.decode()
    by_pid = {p.pid: p for p in procs}
    chosen = by_pid[int(first_id.split(":")[-2])]
    other = next(p for p in procs if p is not chosen)
    return chosen, other, first_id


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "stopped"])
def test_an_idle_worker_killed_or_stopped_is_handed_nothing_after_a_few_seconds(
    fapp: conveyor.Conveyor, workers: WorkerProcesses, sig: int,
) -> None:
    gone, healthy, gone_id = _two_idle_workers(fapp, workers)
    gone.send_signal(sig)
    wait_until(lambda: gone_id not in _live_waiters(fapp), LAPSE_BOUND_S, interval=0.1,
               message=f"the registration of the {signal.Signals(sig).name} worker to lapse"
                       f" (it lapses at {_waiters(fapp).get(gone_id)})")
    sent = time.time()
    job = fapp.tasks["flow.work"].enqueue("next", 0.0)
    assert job.result(timeout=10) == "next"
    [run] = read_ledger(fapp.redis, fapp.namespace)
    assert run.pid == healthy.pid
    assert run.start - sent < 1.0, f"started {run.start - sent:.2f} s after its enqueue"
    assert job.info().attempts == 1


def test_a_job_handed_to_a_killed_worker_runs_elsewhere_on_its_first_attempt(
    fapp: conveyor.Conveyor, workers: WorkerProcesses,
) -> None:
    gone, healthy, gone_id = _two_idle_workers(fapp, workers)
    gone.kill()
    gone.wait(10)
    task = fapp.tasks["flow.work"]
    orphan = task.enqueue("orphan", 0.0)
    assert fapp.redis.llen(fapp.keys("flow").handoff(gone_id)) == 1  # handed to the dead
    time.sleep(VT + 0.5)  # its lease ends
    # The next job goes to the live worker, which then looks at the queue again and
    # finds the orphan's lease over.
    assert task.enqueue("nudge", 0.0).result(timeout=10) == "nudge"
    assert orphan.result(timeout=30) == "orphan"
    runs = {r.label: r for r in read_ledger(fapp.redis, fapp.namespace)}
    assert set(runs) == {"orphan", "nudge"} and runs["orphan"].pid == healthy.pid
    info = orphan.info()
    assert info.attempts == 1, "an attempt was charged for a run that never started"
    assert info.error is None


# -- a finished job's lease -----------------------------------------------------------------


def _counting_task(app: conveyor.Conveyor, seconds: float, vt: float
                   ) -> tuple[conveyor.Task[[], str], Counter[str]]:
    runs: Counter[str] = Counter()
    lock = threading.Lock()

    @app.task(name="brief", queue=Q, visibility_timeout=vt, retries=3)
    def brief() -> str:
        with lock:
            runs[conveyor.current_job().id] += 1
        time.sleep(seconds)
        return "done"

    return brief, runs


def test_a_finished_job_keeps_its_lease_while_a_key_only_finish_reads_is_written_over(
    app: conveyor.Conveyor,
) -> None:
    brief, runs = _counting_task(app, 0.0, vt=0.6)
    k = app.keys(Q)
    app.redis.set(k.idle, "written over by hand")  # finish refuses: WRONGTYPE
    with running_worker(app, queues=[Q], concurrency=2):
        job = brief.enqueue()
        wait_until(lambda: runs[job.id] == 1, 10, message="the run")
        time.sleep(3.0)  # five leases long
        info = job.info()
        assert (info.state, info.attempts, runs[job.id]) == ("active", 1, 1)
        app.redis.delete(k.idle)  # put back (no hash is an empty hash)
        assert job.result(timeout=10) == "done"
    assert runs[job.id] == 1 and job.info().attempts == 1


def test_jobs_that_finish_while_redis_refuses_writes_do_not_run_again(
    make_server: type[RedisServer],
) -> None:
    """Times from the runs' start (leases of 1 s): from 0.5 s to 6.2 s every write is
    refused (out of memory). The worker's fetch, due when the leases would end, fails from
    1 s on, its retries 1.6 s and then 3.2 s apart; the runs end at 2 s, and the outcomes'
    retries follow the same back-off one second behind. So once Redis is back, a fetch
    comes first (at about 7.3 s), and reclaims every lease that has lapsed."""
    server = make_server().start()
    app = conveyor.Conveyor(server.url)
    client = server.client()
    try:
        brief, runs = _counting_task(app, 2.0, vt=1.0)
        with running_worker(app, queues=[Q], concurrency=8):
            jobs = brief.enqueue_many([()] * 4)
            wait_until(lambda: sum(runs.values()) == 4, 10, message="four runs")
            began = time.monotonic()
            time.sleep(0.5)
            client.config_set("maxmemory", 1)  # every write refused: out of memory
            time.sleep(6.2 - (time.monotonic() - began))
            client.config_set("maxmemory", 0)
            for job in jobs:
                assert job.result(timeout=20) == "done"
        assert sorted(runs.values()) == [1, 1, 1, 1], runs
        assert [job.info().attempts for job in jobs] == [1, 1, 1, 1]
    finally:
        client.close()
        app.close()
