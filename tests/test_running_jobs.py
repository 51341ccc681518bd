"""Control over running jobs: current_job(), cancel from another process, snooze, steps that
a retry does not repeat, progress; and the fencing of everything a run records.

Cancels and steps go through real worker processes (``conveyor worker running_app:app``)
that are stopped with SIGSTOP or killed with SIGKILL; the tasks write what they do to a
ledger in Redis, which the tests read to prove what ran and how often.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import conveyor
from conveyor.context import JobContext
from conveyor.scripts import calls
from conveyor.worker.executor import Held
from helpers import RedisServer, env_with_src, running_worker, start_told, wait_until
from running_app import make_app

CONVEYOR = str(Path(sys.executable).with_name("conveyor"))
CANCEL_WITHIN = 2.0  # seconds from cancel() to state 'cancelled' (the promise)


@pytest.fixture
def rapp(redis_server: RedisServer, namespace: str) -> Iterator[conveyor.Conveyor]:
    application = make_app(redis_server.url, namespace)
    yield application
    application.close()


class WorkerProcess:
    """``conveyor worker running_app:app`` in its own process, output to a file."""

    def __init__(self, app: conveyor.Conveyor, log: Path, concurrency: int = 4) -> None:
        env = env_with_src() | {"CONVEYOR_REDIS_URL": app.url,
                                "RUNNING_APP_NAMESPACE": app.namespace}
        self._log = log.open("ab")
        self.proc = subprocess.Popen(
            [CONVEYOR, "worker", "running_app:app", "-c", str(concurrency)], env=env,
            cwd=Path(__file__).parent, stdout=self._log, stderr=subprocess.STDOUT)

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def close(self) -> None:
        if self.proc.poll() is None:
            with_stop = self.proc.pid
            os.kill(with_stop, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(10)
        self._log.close()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.close()


def ledger(app: conveyor.Conveyor) -> list[str]:
    return [e.decode() for e in app.redis.lrange(f"{app.namespace}:ledger", 0, -1)]


def state_of(job: conveyor.Job) -> str:
    return job.info().state.value


# -- current_job() ---------------------------------------------------------------------------

def test_current_job_outside_a_run_raises() -> None:
    with pytest.raises(RuntimeError, match="outside a running job"):
        conveyor.current_job()


def test_current_job_in_sync_and_async_tasks(app: conveyor.Conveyor) -> None:
    seen: list[dict[str, Any]] = []

    def describe(ctx: conveyor.JobContext) -> dict[str, Any]:
        return {"id": ctx.id, "task": ctx.task, "queue": ctx.queue, "tenant": ctx.tenant,
                "attempt": ctx.attempt, "max_attempts": ctx.max_attempts,
                "key": ctx.idempotency_key}

    @app.task(name="sync_ctx", queue="q", retries=2, backoff=0.01)
    def sync_ctx() -> str:
        ctx = conveyor.current_job()
        seen.append(describe(ctx))
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")
        return ctx.id

    @app.task(name="async_ctx", queue="q")
    async def async_ctx() -> bool:
        ctx = conveyor.current_job()
        seen.append(describe(ctx))
        in_thread = await asyncio.to_thread(conveyor.current_job)  # follows onto the thread
        return in_thread is ctx

    with running_worker(app, queues=["q"], concurrency=4):
        sync_job = sync_ctx.options(tenant="acme").enqueue()
        assert sync_job.result(timeout=20) == sync_job.id
        async_job = async_ctx.enqueue()
        assert async_job.result(timeout=20) is True
    first, second, third = seen
    assert first == {"id": sync_job.id, "task": "sync_ctx", "queue": "q", "tenant": "acme",
                     "attempt": 1, "max_attempts": 3, "key": first["key"]}
    assert second["attempt"] == 2 and second["key"] == first["key"]  # same for every attempt
    assert third["id"] == async_job.id and third["tenant"] is None and third["attempt"] == 1
    assert third["key"] != first["key"]
    with pytest.raises(RuntimeError):
        conveyor.current_job()  # nothing leaks out of the runs


# -- cancel ----------------------------------------------------------------------------------

def test_cancel_of_a_running_job_fences_what_its_run_reports_later(
        app: conveyor.Conveyor) -> None:
    """Script level: once a cancel was asked, the holder's heartbeat says so, its progress
    and steps are refused, and its result turns into 'cancelled' (the result is not kept)."""
    k = app.keys("q")
    spec = calls.JobSpec(task="t", key="dedupe-me")
    app.scripts.run(calls.enqueue(k, spec, [("a", b"[[],{}]")], app.limits))
    leased = app.scripts.run(calls.fetch(k, 1, app.limits)).jobs[0]
    assert app.job("q~a").cancel(reason="runaway") is True
    info = app.job("q~a").info()
    assert info.state == "active"  # still running until its holder stops it
    lease = [(leased.short_id, leased.token, 30_000)]
    assert app.scripts.run(calls.heartbeat(k, lease)) == [calls.BEAT_CANCEL]
    assert app.scripts.run(calls.progress(k, [("a", leased.token, 0.5, "")])) == [0]
    assert app.scripts.run(calls.step(k, "a", leased.token, "s", b"1"))[0] == \
        calls.STEP_CANCELLING
    ok = calls.Outcome("a", leased.token, "ok", time.time(), b"42")
    assert app.scripts.run(calls.finish(k, [ok], app.limits)).codes == [calls.FINISH_CANCELLED]
    info = app.job("q~a").info()
    assert info.state == "cancelled" and info.result is None and info.progress is None
    assert info.error is not None and info.error.startswith("cancelled by ")
    assert info.error.endswith(": runaway")
    assert app.scripts.run(calls.finish(k, [ok], app.limits)).codes == [calls.FINISH_REFUSED]
    assert app.redis.zcard(k.leases) == 0 and int(app.redis.hget(k.active, "t")) == 0
    assert app.redis.exists(k.dedupe_prefix + "dedupe-me") == 0
    assert app.redis.ttl(k.job("a")) > 0


def test_cancel_of_a_running_async_job_from_another_process(
        rapp: conveyor.Conveyor, workers: list[WorkerProcess], tmp_path: Path) -> None:
    workers.append(WorkerProcess(rapp, tmp_path / "worker.log"))
    job = rapp.tasks["spin_async"].enqueue("a1")
    wait_until(lambda: "start:a1" in ledger(rapp), 30, message="the job started")
    began = time.monotonic()
    assert job.cancel() is True
    wait_until(lambda: state_of(job) == "cancelled", CANCEL_WITHIN, interval=0.01,
               message="state 'cancelled'")
    took = time.monotonic() - began
    wait_until(lambda: "cancelled:a1" in ledger(rapp), 5, message="the task was cancelled")
    with pytest.raises(conveyor.JobCancelled):
        job.result(timeout=1)
    assert job.info().attempts == 1 and took < CANCEL_WITHIN


def test_cancel_of_a_running_sync_job_with_the_cli_and_its_late_result_is_refused(
        rapp: conveyor.Conveyor, workers: list[WorkerProcess], tmp_path: Path) -> None:
    workers.append(WorkerProcess(rapp, tmp_path / "worker.log"))
    job = rapp.tasks["spin_sync"].enqueue("s1")
    wait_until(lambda: "start:s1" in ledger(rapp), 30, message="the job started")
    done = subprocess.run([CONVEYOR, "cancel", "--url", rapp.url, "--namespace",
                           rapp.namespace, job.id, "--reason", "operator"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert job.id in done.stdout
    wait_until(lambda: state_of(job) == "cancelled", CANCEL_WITHIN, interval=0.01,
               message="state 'cancelled'")
    # The task saw ctx.cancelled and returned a result: it is not recorded.
    wait_until(lambda: "saw-cancel:s1" in ledger(rapp), 5, message="the task saw the cancel")
    time.sleep(0.5)  # time for the late result to reach Redis, were it sent
    info = job.info()
    assert info.state == "cancelled" and info.result is None
    assert info.error is not None and info.error.endswith(": operator")
    again = subprocess.run([CONVEYOR, "cancel", "--url", rapp.url, "--namespace",
                            rapp.namespace, job.id], capture_output=True, text=True, timeout=30)
    assert again.returncode == 1 and "cancelled" in again.stdout


def test_cancel_while_the_holder_is_stopped_takes_effect_when_its_lease_expires(
        rapp: conveyor.Conveyor, workers: list[WorkerProcess], tmp_path: Path) -> None:
    stopped = WorkerProcess(rapp, tmp_path / "stopped.log")
    workers.append(stopped)
    job = rapp.tasks["hold"].enqueue("h1", 3.0)
    wait_until(lambda: "start:h1:1" in ledger(rapp), 30, message="the job started")
    wait_until(lambda: start_told(rapp, job.id), 10, message="the start told")
    stopped.signal(signal.SIGSTOP)
    assert job.cancel() is True
    assert state_of(job) == "active"  # nobody heartbeats: the cancel waits for the lease
    with running_worker(rapp, concurrency=2):  # reclaims the lease (2 s) as a cancel
        wait_until(lambda: state_of(job) == "cancelled", 15, message="cancelled at lease expiry")
        stopped.signal(signal.SIGCONT)  # the stale holder finishes its run: refused
        time.sleep(3.5)
    assert ledger(rapp).count("start:h1:1") == 1 and "start:h1:2" not in ledger(rapp)
    info = job.info()
    assert info.state == "cancelled" and info.result is None and info.attempts == 1
    assert int(rapp.redis.hget(rapp.keys("default").active, "hold") or 0) == 0


def test_cancel_of_an_unknown_or_finished_job_is_false(app: conveyor.Conveyor) -> None:
    @app.task(name="quick")
    def quick() -> int:
        return 1

    assert app.job("default~nope").cancel() is False
    with running_worker(app, concurrency=1):
        job = quick.enqueue()
        assert job.result(timeout=10) == 1
    assert job.cancel() is False and job.info().state == "succeeded"


# -- snooze ----------------------------------------------------------------------------------

def test_snooze_goes_back_to_scheduled_and_keeps_attempts(app: conveyor.Conveyor) -> None:
    runs: list[tuple[int, float]] = []

    @app.task(name="sleepy", retries=0)
    def sleepy() -> str:
        runs.append((conveyor.current_job().attempt, time.monotonic()))
        if len(runs) < 3:
            raise conveyor.Snooze(0.3)
        return "awake"

    with running_worker(app, concurrency=2):
        job = sleepy.enqueue()
        assert job.result(timeout=20) == "awake"
    assert [attempt for attempt, _ in runs] == [1, 1, 1]  # retries=0 and yet three runs
    assert runs[1][1] - runs[0][1] >= 0.25 and runs[2][1] - runs[1][1] >= 0.25
    info = job.info()
    assert info.attempts == 1 and info.state == "succeeded"
    assert int(app.redis.hget(app.keys("default").job(job.short_id), "snoozes")) == 2


def test_snoozing_past_the_cap_ends_dead_with_the_reason(redis_server: RedisServer,
                                                         namespace: str) -> None:
    app = conveyor.Conveyor(redis_server.url, namespace=namespace,
                            limits=calls.Limits(snooze_cap=3))
    runs: list[int] = []

    @app.task(name="insomniac")
    async def insomniac() -> None:
        runs.append(conveyor.current_job().attempt)
        raise conveyor.Snooze(0)

    try:
        with running_worker(app, concurrency=1):
            job = insomniac.enqueue()
            with pytest.raises(conveyor.JobFailed, match="snoozed 3 times"):
                job.result(timeout=20)
        assert runs == [1, 1, 1, 1]
    finally:
        app.close()


# -- steps -----------------------------------------------------------------------------------

def test_steps_resume_after_sigkill_and_steps_before_ran_once(
        rapp: conveyor.Conveyor, workers: list[WorkerProcess], tmp_path: Path) -> None:
    first = WorkerProcess(rapp, tmp_path / "first.log")
    workers.append(first)
    job = rapp.tasks["three_steps"].enqueue("k1")
    wait_until(lambda: "after-two:k1:1" in ledger(rapp), 30, message="steps 1-2 done")
    # Once the worker told Redis that the run began, its lost lease is charged an attempt
    # (the task sleeps on its first attempt only).
    wait_until(lambda: start_told(rapp, job.id), 10, message="the start told")
    first.signal(signal.SIGKILL)
    first.proc.wait(10)
    workers.append(WorkerProcess(rapp, tmp_path / "second.log"))
    assert job.result(timeout=30) == [10, 20, 30]
    entries = ledger(rapp)
    assert [entries.count(f"ran:{n}:k1") for n in (1, 2, 3)] == [1, 1, 1], entries
    assert "after-two:k1:2" in entries
    assert job.info().attempts == 2  # the lost lease is counted


def test_a_stale_holders_step_and_progress_are_refused(app: conveyor.Conveyor) -> None:
    k = app.keys("q")
    spec = calls.JobSpec(task="t", visibility_ms=1000)
    app.scripts.run(calls.enqueue(k, spec, [("a", b"[[],{}]")], app.limits, now=1_000_000))
    stale = app.scripts.run(calls.fetch(k, 1, app.limits, now=1_000_000)).jobs[0]
    fresh = app.scripts.run(calls.fetch(k, 1, app.limits, now=1_002_000)).jobs[0]
    assert stale.token != fresh.token
    assert app.scripts.run(calls.progress(k, [("a", stale.token, 0.9, "old")])) == [0]
    assert app.scripts.run(calls.step(k, "a", stale.token, "s", b"1"))[0] == calls.STEP_REFUSED
    assert app.scripts.run(calls.progress(k, [("a", fresh.token, 0.25, "new")])) == [1]
    info = app.job("q~a").info()
    assert (info.progress, info.progress_note) == (0.25, "new")

    ran: list[str] = []

    class NoProgress:
        def report(self, held: Any, fraction: float, note: str) -> None: ...

    ctx = JobContext(app, Held("q", stale), NoProgress())
    with pytest.raises(conveyor.LeaseLost, match="lost its lease"):
        ctx.step("charge", lambda: ran.append("charged") or 7)
    assert app.redis.hget(k.job("a"), "step:charge") is None
    current = JobContext(app, Held("q", fresh), NoProgress())
    assert current.step("charge", lambda: ran.append("charged") or 7) == 7
    assert current.step("charge", lambda: ran.append("charged") or 8) == 7  # recorded
    assert ran == ["charged", "charged"]  # the stale run's call, then the current one's


def test_async_steps_return_the_recorded_result(app: conveyor.Conveyor) -> None:
    calls_made: list[int] = []

    async def charge(n: int) -> dict[str, int]:
        calls_made.append(n)
        return {"charged": n}

    @app.task(name="pay", retries=2, backoff=0.01)
    async def pay(n: int) -> dict[str, int]:
        ctx = conveyor.current_job()
        result = await ctx.astep("charge", charge, n)
        if ctx.attempt == 1:
            raise RuntimeError("the mailer failed after the charge")
        return result

    with running_worker(app, concurrency=1):
        job = pay.enqueue(5)
        assert job.result(timeout=20) == {"charged": 5}
    assert calls_made == [5] and job.info().attempts == 2


# -- progress --------------------------------------------------------------------------------

def test_progress_from_200_threads_is_coalesced_and_correct(app: conveyor.Conveyor) -> None:
    jobs_n, reports = 200, 400
    gate = threading.Event()
    started = threading.Semaphore(0)

    @app.task(name="busy", visibility_timeout=60)
    def busy() -> None:
        ctx = conveyor.current_job()
        started.release()
        gate.wait(60)
        for i in range(1, reports + 1):
            ctx.progress(i / reports, note=f"{i} of {reports}")
            time.sleep(0.004)

    with running_worker(app, concurrency=jobs_n) as worker:
        jobs = busy.enqueue_many([()] * jobs_n)
        for _ in range(jobs_n):
            assert started.acquire(timeout=60), "every job runs at once"
        writes_before = worker.progress.writes
        began = time.monotonic()
        gate.set()
        # While they run, a report shows in JobInfo within a second.
        time.sleep(1.0)
        probe = jobs[17]
        shown = probe.info()
        assert shown.progress is not None and shown.progress > 0
        assert shown.progress_note is not None and shown.progress_note.endswith(f"of {reports}")
        for job in jobs:
            job.result(timeout=60)
        elapsed = time.monotonic() - began
        writes = worker.progress.writes - writes_before
    for job in jobs:
        info = job.info()
        assert (info.progress, info.progress_note) == (1.0, f"{reports} of {reports}")
    # One write per job per 250 ms: 4 a second, +1 for the write at the start of the
    # window and +1 for the last value, written just before the outcome.
    assert writes <= jobs_n * (4 * elapsed + 2), (writes, elapsed)
    assert writes >= jobs_n  # at least the last value of each job


def test_progress_refuses_values_outside_0_to_1(app: conveyor.Conveyor) -> None:
    errors: list[str] = []

    @app.task(name="bad_progress")
    def bad_progress() -> None:
        ctx = conveyor.current_job()
        for value in (-0.1, 1.5, float("nan")):
            try:
                ctx.progress(value)
            except ValueError as exc:
                errors.append(str(exc))

    with running_worker(app, concurrency=1):
        bad_progress.enqueue().result(timeout=10)
    assert len(errors) == 3


def test_conveyor_job_shows_progress(app: conveyor.Conveyor) -> None:
    k = app.keys("q")
    app.scripts.run(calls.enqueue(k, calls.JobSpec(task="t"), [("a", b"[[],{}]")], app.limits))
    leased = app.scripts.run(calls.fetch(k, 1, app.limits)).jobs[0]
    assert app.scripts.run(calls.progress(k, [("a", leased.token, 0.4, "400 of 1000")])) == [1]
    shown = subprocess.run([CONVEYOR, "job", "--url", app.url, "--namespace", app.namespace,
                            "q~a"], capture_output=True, text=True, timeout=30,
                           env=env_with_src() | {"COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    assert "40%  400 of 1000" in shown.stdout


def test_a_cancelled_sync_run_that_ignores_the_cancel_keeps_its_slot_then_counts_as_stuck(
        app: conveyor.Conveyor) -> None:
    release = threading.Event()

    @app.task(name="stubborn", timeout=1.0)
    def stubborn() -> str:
        release.wait(20)  # never looks at ctx.cancelled
        return "too late"

    with running_worker(app, concurrency=2) as worker:
        job = stubborn.enqueue()
        wait_until(lambda: job.info().state == "active", 10, message="started")
        assert job.cancel() is True
        wait_until(lambda: job.info().state == "cancelled", CANCEL_WITHIN + 1,
                   message="cancelled")
        assert worker.free_slots() == 1  # its thread still runs: its slot stays taken
        wait_until(lambda: worker.stuck == 1, 10, message="past its timeout: stuck")
        release.set()
        wait_until(lambda: worker.stuck == 0 and worker.free_slots() == 2, 10,
                   message="the slot back once the run returned")
    info = job.info()
    assert info.state == "cancelled" and info.result is None


@pytest.mark.parametrize("error", ["connection", "oom"])
def test_progress_and_cancel_polls_survive_redis_errors(app: conveyor.Conveyor,
                                                        error: str) -> None:
    """The progress writer and the heartbeat's look for cancels keep going when Redis
    refuses them for a while; the job still reports, and a cancel still lands."""
    from injection import FaultPlan

    @app.task(name="steady", visibility_timeout=30)
    async def steady() -> None:
        ctx = conveyor.current_job()
        for i in range(1, 2000):
            ctx.progress(min(1.0, i / 100), note=str(i))
            await asyncio.sleep(0.02)

    with running_worker(app, concurrency=2) as worker, FaultPlan() as plan:
        plan.fail("script:progress", error, times=4)
        plan.fail("ZMSCORE", error, times=3)
        job = steady.enqueue()
        wait_until(lambda: (job.info().progress or 0) >= 0.5, 15, message="progress written")
        wait_until(lambda: plan.pending() == 0, 15, message="every fault injected")
        assert job.cancel() is True
        wait_until(lambda: job.info().state == "cancelled", CANCEL_WITHIN + 1,
                   message="cancelled after the errors")
        assert worker.loops.fatal is None
