"""New jobs handed to an idle worker by the enqueue itself (scripts/include/handoff.lua).

The scripts alone, through their wrappers: what a hand-off leases and pushes, and when it
must not (paused, limits, a lapsed or mangled registration, a second enqueue). Then real
worker processes (``apps.flow_app``): an idle worker starts a new job with no fetch in
between, a job handed to a worker killed while registered runs elsewhere once its lease
ends, limits and pause hold for hand-offs, and a stopping worker unregisters.
"""

from __future__ import annotations

import hashlib
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import conveyor
from apps.flow_app import VT, make_app, max_overlap, read_ledger
from conveyor.scripts import calls, source
from conveyor.worker.handoff import WAITER_TTL_MS
from helpers import RedisServer, WorkerProcesses, running_worker, wait_until

Q = "q"


def enqueue(app: conveyor.Conveyor, *ids: str, now: float | None = None,
            queue: str = Q, **options: object) -> None:
    spec = calls.JobSpec(task="t", **options)  # type: ignore[arg-type]
    jobs = [(short, b"[[],{}]") for short in ids]
    app.scripts.run(calls.enqueue(app.keys(queue), spec, jobs, app.limits, now=now))


def register(app: conveyor.Conveyor, worker: str, slots: int, now: float | None = None) -> None:
    app.scripts.run(calls.register_waiter(app.keys(Q), worker, slots, WAITER_TTL_MS, now=now))


def handed(app: conveyor.Conveyor, worker: str) -> list[calls.Fetched]:
    k = app.keys(Q)
    entries = app.redis.lrange(k.handoff(worker), 0, -1)
    return [calls.parse_handoff(e) for e in entries]


def state(app: conveyor.Conveyor, short: str) -> str:
    return app.redis.hget(app.keys(Q).job(short), "s").decode()


# -- the scripts ---------------------------------------------------------------------------


def test_an_enqueue_leases_up_to_the_offered_slots_to_the_waiter(app: conveyor.Conveyor) -> None:
    k = app.keys(Q)
    register(app, "w1", 2)
    enqueue(app, "a", "b", "c", tenant="acme")
    [entry] = handed(app, "w1")
    assert [j.short_id for j in entry.jobs] == ["a", "b"]
    assert all(j.attempts == 1 and j.task == "t" and j.args == b"[[],{}]" for j in entry.jobs)
    assert len({j.token for j in entry.jobs}) == 2
    assert [state(app, s) for s in "abc"] == ["active", "active", "ready"]
    # The same books as a fetch: leases, running counts, the ready count.
    assert {m.decode() for m in app.redis.zrange(k.leases, 0, -1)} == {"a", "b"}
    assert app.redis.hget(k.counts, "running") == b"2"
    assert app.redis.hget(k.running, "acme") == b"2"
    assert app.redis.hget(k.counts, "ready") == b"1"
    assert app.redis.hget(k.active, "t") == b"2"
    # A registration serves one enqueue; the job left over wakes another worker.
    assert app.redis.zcard(k.waiters) == 0 and app.redis.hlen(k.waiter_offers) == 0
    assert app.redis.llen(k.wake) == 1
    # A token it hands out is the lease's: finishing with it is accepted.
    a = entry.jobs[0]
    done = app.scripts.run(calls.finish(k, [calls.Outcome("a", a.token, "ok", time.time())],
                                        app.limits))
    assert done.codes == [calls.FINISH_SUCCEEDED]


def test_two_enqueues_race_for_one_waiter(app: conveyor.Conveyor) -> None:
    register(app, "w1", 8)
    enqueue(app, "a")
    enqueue(app, "b")
    assert [[j.short_id for j in e.jobs] for e in handed(app, "w1")] == [["a"]]
    assert state(app, "b") == "ready"
    assert app.redis.llen(app.keys(Q).wake) == 1


def test_a_paused_queue_or_a_binding_limit_hands_nothing_over(app: conveyor.Conveyor) -> None:
    k = app.keys(Q)
    register(app, "w1", 4)
    app.queue(Q).pause()
    enqueue(app, "a")
    assert handed(app, "w1") == [] and state(app, "a") == "ready"
    assert app.redis.zscore(k.waiters, "w1") is not None  # still waiting
    app.queue(Q).resume()
    app.queue(Q).set_limits(concurrency=1)
    enqueue(app, "b")  # the claim takes 'a' first (FIFO), within the cap
    [entry] = handed(app, "w1")
    assert [j.short_id for j in entry.jobs] == ["a"]
    register(app, "w1", 4)
    enqueue(app, "c")  # at the cap: nothing, and the waiter stays
    assert len(handed(app, "w1")) == 1
    assert state(app, "b") == "ready" and state(app, "c") == "ready"
    assert app.redis.zscore(k.waiters, "w1") is not None
    assert app.redis.hget(k.counts, "running") == b"1"


def test_a_delayed_job_is_not_handed_over(app: conveyor.Conveyor) -> None:
    register(app, "w1", 4)
    enqueue(app, "a", delay_ms=60_000.0)
    assert handed(app, "w1") == [] and state(app, "a") == "scheduled"


def test_lapsed_and_mangled_registrations_are_skipped_and_removed(
    app: conveyor.Conveyor,
) -> None:
    k = app.keys(Q)
    t0 = time.time() * 1000
    register(app, "gone", 4, now=t0 - WAITER_TTL_MS - 1)
    enqueue(app, "a", now=t0)
    assert handed(app, "gone") == [] and state(app, "a") == "ready"
    app.redis.zadd(k.waiters, {"bad": t0 + 60_000})
    app.redis.hset(k.waiter_offers, "bad", "lots:of")
    enqueue(app, "b", now=t0)
    assert handed(app, "bad") == [] and state(app, "b") == "ready"
    assert app.redis.zscore(k.waiters, "bad") is None
    register(app, "w1", 1, now=t0)  # drops lapsed registrations on the way
    assert app.redis.zscore(k.waiters, "gone") is None
    assert app.redis.hget(k.waiter_offers, "gone") is None


def test_a_fetch_replaces_the_registration_with_the_slots_it_leaves_free(
    app: conveyor.Conveyor,
) -> None:
    k = app.keys(Q)
    app.queue(Q).pause()
    enqueue(app, "a", "b")
    app.queue(Q).resume()
    fetched = app.scripts.run(calls.fetch(k, 5, app.limits, worker="w1",
                                          waiter_ttl_ms=WAITER_TTL_MS))
    assert len(fetched.jobs) == 2 and fetched.offered == 3
    assert app.redis.hget(k.waiter_offers, "w1").decode().startswith("3:")
    enqueue(app, "c", "d")
    fetched = app.scripts.run(calls.fetch(k, 0, app.limits, worker="w1",
                                          waiter_ttl_ms=WAITER_TTL_MS))
    assert app.redis.zscore(k.waiters, "w1") is None  # no free slot: no offer
    [entry] = handed(app, "w1")
    assert [j.short_id for j in entry.jobs] == ["c", "d"]


def test_a_hand_off_entry_carries_any_bytes() -> None:
    args = b"\x00:12:\xff\x93[1,2]"
    fields = [b"1800000000000.000", b"1800000005000", b"1", b"dead1", b"0",
              b"a", b"1.x", b"t", args, b"1", b"4", b"1.5", b"", b"30000", b""]
    entry = b"".join(b"%d:%s" % (len(f), f) for f in fields)
    parsed = calls.parse_handoff(entry)
    assert parsed.dead == ["dead1"] and parsed.trimmed == []
    assert parsed.next_due_ms == 1800000005000.0  # the soonest deadline of its jobs
    assert parsed.jobs[0].args == args and parsed.jobs[0].visibility_ms == 30000
    with pytest.raises(ValueError):
        calls.parse_handoff(entry[:-3])


# -- real worker processes -----------------------------------------------------------------


@pytest.fixture
def fapp(redis_server: RedisServer, namespace: str) -> Iterator[conveyor.Conveyor]:
    application = make_app(redis_server.url, namespace)
    yield application
    application.close()


@pytest.fixture
def workers(fapp: conveyor.Conveyor, tmp_path: Path) -> Iterator[WorkerProcesses]:
    w = WorkerProcesses(fapp, tmp_path, "apps.flow_app:app", "FLOW_NAMESPACE", ("-c", "4"))
    yield w
    w.stop()


def waiters(app: conveyor.Conveyor) -> list[str]:
    return [m.decode() for m in app.redis.zrange(app.keys("flow").waiters, 0, -1)]


def work(app: conveyor.Conveyor) -> conveyor.Task:
    return app.tasks["flow.work"]


def sha(name: str) -> str:
    return hashlib.sha1(source(name).encode()).hexdigest()


def test_an_idle_worker_starts_a_new_job_without_a_fetch(
    fapp: conveyor.Conveyor, workers: WorkerProcesses
) -> None:
    workers.start()
    wait_until(lambda: waiters(fapp), timeout=30, message="the idle worker registered")
    port = fapp.url.rsplit(":", 1)[1].split("/")[0]
    monitor = subprocess.Popen(["redis-cli", "-p", port, "monitor"], stdout=subprocess.PIPE)
    try:
        time.sleep(0.3)  # MONITOR is listening
        job = work(fapp).enqueue("first", 0.0)
        assert job.result(timeout=10) == "first"
    finally:
        monitor.terminate()
    lines = monitor.communicate(timeout=10)[0].decode(errors="replace").splitlines()
    sent = [line for line in lines if "[0 lua]" not in line]
    enqueued = next(i for i, line in enumerate(sent) if sha("enqueue") in line)
    started = next(i for i, line in enumerate(sent) if "flow-ledger" in line and "start" in line)
    between = sent[enqueued:started]
    assert enqueued < started
    assert not [line for line in between if sha("fetch") in line], between
    runs = read_ledger(fapp.redis, fapp.namespace)
    assert [r.label for r in runs] == ["first"]


def test_plain_single_enqueues_hand_over_once_they_see_an_idle_worker(
    fapp: conveyor.Conveyor, workers: WorkerProcesses
) -> None:
    """The script-free single enqueue cannot hand a job over; it counts the live waiters
    instead, and while it finds some the next enqueues take the script, which does. Once
    the workers are gone, the count sends enqueues back to the cheap path."""
    worker = workers.start()
    task = work(fapp)
    wait_until(lambda: waiters(fapp), timeout=30, message="the idle worker registered")
    for label in ("warm", "warmer"):  # the queue is registered, then the clock read
        assert task.enqueue(label, 0.0).result(timeout=10) == label
    port = fapp.url.rsplit(":", 1)[1].split("/")[0]
    monitor = subprocess.Popen(["redis-cli", "-p", port, "monitor"], stdout=subprocess.PIPE)
    try:
        time.sleep(0.3)  # MONITOR is listening
        for i in range(5):
            wait_until(lambda: waiters(fapp), timeout=10, message="the worker registered")
            assert task.enqueue(f"job{i}", 0.0).result(timeout=10) == f"job{i}"
    finally:
        monitor.terminate()
    lines = monitor.communicate(timeout=10)[0].decode(errors="replace").splitlines()
    sent = [line for line in lines if "[0 lua]" not in line]
    paths = [("script" if sha("enqueue") in line else "plain", i) for i, line in enumerate(sent)
             if sha("enqueue") in line or '"MULTI"' in line.upper()]
    starts = [i for i, line in enumerate(sent) if "flow-ledger" in line and "start job" in line]
    assert [p for p, _ in paths] == ["plain", "script", "script", "script", "script"], paths
    for (_, at), started in zip(paths[1:], starts[1:], strict=True):
        between = sent[at:started]
        assert not [line for line in between if sha("fetch") in line], between  # handed over
    worker.send_signal(signal.SIGTERM)
    worker.wait(30)
    wait_until(lambda: not waiters(fapp), timeout=10, message="the worker unregistered")
    runner, k = fapp.scripts, fapp.keys("flow")
    task.enqueue("after", 0.0)  # the script's count finds no waiter ...
    assert not runner._plain.hand_off(k)  # ... so the next single enqueue is plain again


def test_a_job_handed_to_a_killed_worker_runs_elsewhere_once_its_lease_ends(
    fapp: conveyor.Conveyor, workers: WorkerProcesses
) -> None:
    doomed = workers.start()
    [worker_id] = wait_until(lambda: waiters(fapp), timeout=30, message="a registered worker")
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(10)
    sent = time.time()
    job = work(fapp).enqueue("orphan", 0.0)
    k = fapp.keys("flow")
    assert fapp.redis.llen(k.handoff(worker_id)) == 1  # handed to the dead worker
    assert job.info().state == "active"
    rescuer = workers.start()
    assert job.result(timeout=30) == "orphan"
    [run] = read_ledger(fapp.redis, fapp.namespace)
    assert run.pid == rescuer.pid
    assert run.start >= sent + VT * 0.9  # not before the lease ended
    # Never taken off the dead worker's hand-off list: the lease used no attempt.
    assert job.info().attempts == 1 and job.info().error is None
    assert int(fapp.redis.hget(k.counts, "running") or 0) == 0


def test_hand_offs_obey_the_cap_and_the_pause(
    fapp: conveyor.Conveyor, workers: WorkerProcesses
) -> None:
    q = fapp.queue("flow")
    q.set_limits(concurrency=1)
    workers.start()
    wait_until(lambda: waiters(fapp), timeout=30, message="the idle worker registered")
    first = work(fapp).enqueue("one", 1.0)
    wait_until(lambda: read_ledger(fapp.redis, fapp.namespace), timeout=10,
               message="the first run")
    second = work(fapp).enqueue("two", 0.0)
    time.sleep(0.3)
    assert second.info().state == "ready"  # the cap holds it while 'one' runs
    assert second.result(timeout=20) == "two" and first.result(timeout=5) == "one"
    runs = read_ledger(fapp.redis, fapp.namespace)
    assert max_overlap(runs) == 1 and runs[1].start >= runs[0].end - 0.01
    q.clear_limits()
    q.pause()
    wait_until(lambda: waiters(fapp), timeout=10, message="the worker waiting again")
    held = work(fapp).enqueue("three", 0.0)
    time.sleep(0.5)
    assert held.info().state == "ready"
    q.resume()
    assert held.result(timeout=20) == "three"


def test_a_stopping_worker_unregisters(fapp: conveyor.Conveyor, workers: WorkerProcesses) -> None:
    proc = workers.start()
    wait_until(lambda: waiters(fapp), timeout=30, message="the idle worker registered")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert waiters(fapp) == []
    assert fapp.redis.hlen(fapp.keys("flow").waiter_offers) == 0


def test_a_worker_handed_more_than_its_free_slots_hands_the_rest_back(
    app: conveyor.Conveyor,
) -> None:
    gate = threading.Event()

    @app.task(name="hold", queue=Q)
    def hold() -> None:
        gate.wait(20)

    @app.task(name="quick", queue=Q)
    def quick() -> str:
        return "done"

    with running_worker(app, queues=[Q], concurrency=1) as worker:
        held = hold.enqueue()
        wait_until(lambda: held.info().state == "active", 10, message="the slot taken")
        # An offer gone stale (as when a fetch and a registration cross): 2 slots offered
        # by a worker with none free.
        register(app, worker.id, 2)
        extra = quick.enqueue()
        wait_until(lambda: extra.info().state == "ready", 10, message="the job handed back")
        assert extra.info().attempts == 0  # a hand-back costs no attempt
        gate.set()
        assert extra.result(timeout=20) == "done"
        assert extra.info().attempts == 1
