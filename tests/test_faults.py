"""Fault injection against real worker processes and real redis-server processes.

Each test counts executions in a ledger the tasks write themselves (see ``apps.ledger``)
and compares it with the job records: nothing may be lost, and re-executions must be
explained by the faults injected.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from apps.ledger import LEDGER_CLIENT_NAME, LedgerApp, build
from apps.ledger_fleet import Fleet, WorkerProcess, kill_storm
from conveyor.sink import stream_events
from helpers import RedisServer, record_field, start_told, wait_until

CONCURRENCY = 4


@pytest.fixture
def server(make_server: type[RedisServer]) -> RedisServer:
    """A private durable server: these tests kill clients and restart it."""
    return make_server(durable=True).start()


@pytest.fixture
def ledger(server: RedisServer) -> Iterator[LedgerApp]:
    app = build(server.url, f"f{uuid.uuid4().hex[:8]}")
    yield app
    app.close()


@pytest.fixture
def spawn(ledger: LedgerApp, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Make worker processes (not started); any left running are killed afterwards."""
    made: list[WorkerProcess] = []

    def make(name: str = "w", concurrency: int = CONCURRENCY, grace: float = 10.0
             ) -> WorkerProcess:
        made.append(WorkerProcess(ledger, tmp_path, name, concurrency, grace))
        return made[-1]

    yield make
    for worker in made:
        worker.kill()


@pytest.fixture
def fleet_of(ledger: LedgerApp, tmp_path: Path) -> Iterator[Callable[..., Fleet]]:
    """Make fleets of worker processes (started); any left running are killed afterwards."""
    made: list[Fleet] = []

    def make(size: int, concurrency: int = CONCURRENCY) -> Fleet:
        made.append(Fleet(ledger, tmp_path, size, concurrency).start())
        return made[-1]

    yield make
    for fleet in made:
        for worker in fleet.workers:
            worker.kill()


@pytest.mark.slow
def test_kill_storm_loses_nothing(ledger: LedgerApp, fleet_of: Callable[..., Fleet]) -> None:
    jobs = ledger.record.enqueue_many([(n, 0.02) for n in range(1500)])
    fleet = fleet_of(2)
    try:
        storm = kill_storm(fleet, seconds=10.5, interval=0.5, min_kills=20, max_seconds=20,
                           work_left=lambda: not ledger.all_succeeded(jobs))
        wait_until(lambda: ledger.all_succeeded(jobs), 60, interval=0.2,
                   message=f"every job to succeed: {ledger.census(jobs)}\n{fleet.logs()}")
    finally:
        fleet.stop()
    counts = ledger.counts()
    assert set(counts) == {str(n) for n in range(1500)}, "a job never ran"
    reexecutions = sum(counts.values()) - len(jobs)
    working = storm.kills_of_working(ledger)
    print(f"jobs={len(jobs)} kills={storm.kills} during work={storm.kills_during_work}"
          f" of working processes={working} re-executions={reexecutions}")
    # On a quiet machine 20 kills land in 10.5 s; a loaded one starts workers slower.
    assert storm.kills_during_work >= 10 and working >= 5
    assert reexecutions <= storm.kills_during_work * CONCURRENCY
    assert ledger.queue_sizes() == {"leases": 0, "delayed": 0, "dead": 0, "ready": 0}


def test_poison_job_ends_dead_with_a_reason(
        ledger: LedgerApp, fleet_of: Callable[..., Fleet]) -> None:
    poison = ledger.poison.enqueue("poison")
    others = ledger.record.enqueue_many([(n, 0.005) for n in range(100)])
    fleet = fleet_of(2)
    try:
        def settled() -> bool:
            fleet.revive()  # what a supervisor does for a worker that died
            return poison.info().state == "dead" and ledger.all_succeeded(others)

        wait_until(settled, 40, interval=0.05,
                   message=f"poison dead, others done: {poison.info()}\n{fleet.logs()}")
    finally:
        fleet.stop()
    info = poison.info()
    attempts = ledger.poison.max_attempts
    assert info.attempts == attempts
    assert info.error is not None and "lease expired" in info.error
    # Its first run killed its worker before the worker told Redis that it began: that
    # lease was given back. Every later run told its start first, so was charged: it ran
    # once per attempt and once more, then never again.
    assert ledger.counts()["poison"] == attempts + 1
    assert fleet.deaths == attempts + 1
    assert [i.id for i in ledger.app.dead_letters("ledger").list()] == [poison.id]


@pytest.mark.slow
def test_idle_worker_takes_over_a_killed_workers_job(
        ledger: LedgerApp, fleet_of: Callable[..., Fleet]) -> None:
    """Nobody enqueues anything after the kill: the surviving worker, idle since before the
    job was leased, must still notice the expired lease (within one quiet spell of its wake
    listener, 20 s) and run the job."""
    fleet = fleet_of(2)
    try:
        wait_until(lambda: all(w.serving() for w in fleet.workers), 20, message="workers up")
        job = ledger.hold.enqueue("held", 0.2)
        first = wait_until(ledger.runs, 10, message="the job to start")[0][1]
        holder = next(w for w in fleet.workers if w.pid == first)
        holder.kill()
        assert job.result(timeout=50) != first
    finally:
        fleet.stop()
    info = job.info()
    # The worker was killed at once, before it told Redis that the run began: the lost
    # lease gave its attempt back, and the record counts it. The success that followed
    # leaves no error behind.
    assert info.attempts == 1 and info.error is None
    assert record_field(ledger.app, job.id, "lost") == record_field(ledger.app, job.id,
                                                                   "lu") == b"1"
    assert ledger.counts() == {"held": 2}


def test_long_job_keeps_its_lease_and_its_worker_stays_quiet(
        ledger: LedgerApp, fleet_of: Callable[..., Fleet]) -> None:
    """A run three times its visibility timeout is kept alive by heartbeats (no second run
    anywhere), and the worker does not spin while it is full and its last due time passed."""
    fleet = fleet_of(2, concurrency=1)
    try:
        wait_until(lambda: all(w.serving() for w in fleet.workers), 20, message="workers up")
        job = ledger.hold.enqueue("long", 3 * ledger.hold.visibility_timeout)
        pid = wait_until(ledger.runs, 10, message="the job to start")[0][1]
        holder = next(w for w in fleet.workers if w.pid == pid)
        cpu = holder.cpu_seconds()
        assert job.result(timeout=20) == pid
        cpu = holder.cpu_seconds() - cpu
    finally:
        fleet.stop()
    assert job.info().attempts == 1
    assert ledger.counts() == {"long": 1}
    assert cpu < 0.5, f"the worker used {cpu:.2f} s of CPU while its one job slept"


def test_paused_worker_late_acknowledgement_is_refused(
        ledger: LedgerApp, spawn: Callable[..., WorkerProcess]) -> None:
    stream_events(ledger.app, ledger.hold.queue)  # successes are counted in the stream
    first = spawn("paused", concurrency=1).start()
    second = spawn("other", concurrency=1)
    try:
        wait_until(first.serving, 20, message="first worker up")
        job = ledger.hold.enqueue("job", 1.5)
        wait_until(ledger.runs, 10, message="the job to start")
        wait_until(lambda: start_told(ledger.app, job.id), 10, message="the start told")
        first.signal(signal.SIGSTOP)  # no heartbeat from here on: its lease runs out
        second.start()
        wait_until(lambda: job.info().state == "succeeded", 20,
                   message=f"the second worker to finish the job: {job.info()}")
        taken_over = job.info()
        first.signal(signal.SIGCONT)  # its run ends and it tries to record a success
        wait_until(lambda: "refused" in first.log(), 20,
                   message=f"the late acknowledgement:\n{first.log()}")
        assert first.alive() and second.alive()
    finally:
        first.stop()
        second.stop()
    info = job.info()
    assert info == taken_over  # the late outcome changed nothing
    assert info.state == "succeeded" and info.attempts == 2
    assert info.result == second.pid
    assert [pid for _, pid in ledger.runs()] == [first.pid, second.pid]  # it ran twice...
    assert ledger.succeeded_events([job.short_id]) == {job.short_id: 1}  # ...recorded once


def test_sigterm_lets_running_jobs_finish_and_loses_nothing(
        ledger: LedgerApp, spawn: Callable[..., WorkerProcess]) -> None:
    worker = spawn(grace=15).start()
    jobs = ledger.hold.enqueue_many([(f"h{i}", 1.0) for i in range(3 * CONCURRENCY)])
    wait_until(lambda: ledger.total_runs() == CONCURRENCY, 20, message="a full worker")
    worker.signal(signal.SIGTERM)
    assert worker.process is not None and worker.process.wait(20) == 0
    census = ledger.census(jobs)
    assert census == {"succeeded": CONCURRENCY, "ready": 2 * CONCURRENCY}, census
    assert ledger.queue_sizes() == {"leases": 0, "delayed": 0, "dead": 0,
                                    "ready": 2 * CONCURRENCY}
    assert ledger.app.monitor.active("ledger.hold") == 0
    # Nothing was lost: another worker runs the rest, each exactly once.
    rest = spawn("rest", concurrency=2 * CONCURRENCY).start()
    try:
        wait_until(lambda: ledger.all_succeeded(jobs), 30, message="the rest to run")
    finally:
        rest.stop()
    assert ledger.counts() == {f"h{i}": 1 for i in range(3 * CONCURRENCY)}


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_sigterm_past_the_grace_period_hands_jobs_back(
        ledger: LedgerApp, spawn: Callable[..., WorkerProcess], kind: str) -> None:
    worker = spawn(concurrency=2, grace=0.5).start()
    task = ledger.hold if kind == "sync" else ledger.ahold
    jobs = task.enqueue_many([("slow0", 3.0), ("slow1", 3.0)])
    wait_until(lambda: ledger.total_runs() == 2, 20, message="both jobs running")
    worker.signal(signal.SIGTERM)
    # Within the grace period plus a little, the jobs are handed back (their threads may
    # keep the process alive until they end, but they no longer hold the jobs).
    wait_until(lambda: ledger.queue_sizes()["leases"] == 0, 5, message="leases released")
    assert set(ledger.states(jobs)) <= {"retrying", "ready"}
    assert all("interrupted" in (j.info().error or "") for j in jobs)
    assert worker.process is not None and worker.process.wait(20) == 0
    rest = spawn("rest", concurrency=2).start()
    try:
        wait_until(lambda: ledger.all_succeeded(jobs), 30, message="the jobs to run again")
    finally:
        rest.stop()
    assert ledger.counts() == {"slow0": 2, "slow1": 2}
    assert ledger.queue_sizes()["leases"] == 0


def test_redis_restart_between_enqueue_and_work_loses_nothing(
        server: RedisServer, ledger: LedgerApp, spawn: Callable[..., WorkerProcess]) -> None:
    ready = ledger.record.enqueue_many(list(range(300)))
    delayed = ledger.record.options(delay=3).enqueue_many(list(range(300, 330)))
    server.stop(save=False)  # SHUTDOWN NOSAVE: only the append-only file keeps the jobs
    server.start()
    assert ledger.census(ready) == {"ready": 300}
    assert ledger.census(delayed) == {"scheduled": 30}
    worker = spawn().start()
    try:
        wait_until(lambda: ledger.all_succeeded(ready + delayed), 30,
                   message=f"every job: {ledger.census(ready + delayed)}\n{worker.log()}")
    finally:
        worker.stop()
    assert ledger.counts() == {str(n): 1 for n in range(330)}
    for job in delayed:
        info = job.info()
        assert info.run_at is not None and info.started_at is not None
        assert info.started_at >= info.run_at, "a delayed job ran before it was due"
        assert info.started_at - info.run_at < 5, "a delayed job waited long past its due time"


@pytest.mark.slow
def test_redis_restart_under_a_running_worker(
        server: RedisServer, ledger: LedgerApp, spawn: Callable[..., WorkerProcess]) -> None:
    worker = spawn().start()
    try:
        wait_until(worker.serving, 20, message="worker up")
        ready = ledger.record.enqueue_many([(n, 0.01) for n in range(300)])
        delayed = ledger.record.options(delay=4).enqueue_many(list(range(300, 320)))
        wait_until(lambda: ledger.total_runs() >= 50, 20, message="work under way")
        server.stop(save=False)
        server.start()  # same port and folder, after a moment of absence
        wait_until(lambda: ledger.all_succeeded(ready + delayed), 40, interval=0.1,
                   message=f"every job: {ledger.census(ready + delayed)}\n{worker.log()}")
        assert worker.alive(), worker.log()
    finally:
        worker.stop()
    counts = ledger.counts()
    assert set(counts) == {str(n) for n in range(320)}
    for job in delayed:
        info = job.info()
        assert info.started_at is not None and info.run_at is not None
        assert info.run_at <= info.started_at < info.run_at + 5
    assert ledger.queue_sizes()["leases"] == 0


def kill_other_clients(server: RedisServer) -> int:
    """CLIENT KILL every connection but this one and the ledger's; how many were killed."""
    client = server.client()
    try:
        me = client.client_id()
        ids = [c["id"] for c in client.client_list(_type="normal")
               if c["name"] != LEDGER_CLIENT_NAME and int(c["id"]) != me]
        return sum(int(client.client_kill_filter(_id=i)) for i in ids)
    finally:
        client.close()


def test_worker_reconnects_after_its_connections_are_killed(
        server: RedisServer, ledger: LedgerApp, spawn: Callable[..., WorkerProcess]) -> None:
    worker = spawn().start()
    try:
        wait_until(worker.serving, 20, message="worker up")
        jobs = ledger.record.enqueue_many([(n, 0.01) for n in range(400)])
        wait_until(lambda: ledger.total_runs() >= 40, 20, message="work under way")
        killed = 0
        for _ in range(4):
            killed += kill_other_clients(server)
            runs = ledger.total_runs()
            wait_until(lambda: ledger.total_runs() >= runs + 20, 20,  # noqa: B023
                       message=f"work to go on after the kill\n{worker.log()}")
        assert killed >= 8  # its fetch, wake and script connections, every time
        wait_until(lambda: ledger.all_succeeded(jobs), 30, interval=0.1,
                   message=f"every job: {ledger.census(jobs)}\n{worker.log()}")
        assert worker.alive(), worker.log()
    finally:
        worker.stop()
    assert set(ledger.counts()) == {str(n) for n in range(400)}
    assert ledger.queue_sizes()["leases"] == 0
