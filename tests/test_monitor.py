"""Active and idle per task type, through real workers (threads and a SIGKILLed process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import conveyor
from helpers import RedisServer, env_with_src, running_worker, start_told, wait_until
from monitor_app import make_app

CONVEYOR = str(Path(sys.executable).with_name("conveyor"))


@pytest.fixture
def mapp(redis_server: RedisServer, namespace: str) -> Iterator[conveyor.Conveyor]:
    application = make_app(redis_server.url, namespace)
    yield application
    application.close()


def raw_active(app: conveyor.Conveyor, task: str) -> int:
    return int(app.redis.hget(app.keys("default").active, task) or 0)


def test_active_goes_up_with_blocked_jobs_and_back_to_zero(mapp: conveyor.Conveyor) -> None:
    gate = f"{mapp.namespace}:gate"
    block = mapp.tasks["block"]
    assert mapp.monitor.active("block") == 0
    assert mapp.monitor.idle_since("block") is None
    assert mapp.monitor.is_idle("block") and mapp.monitor.is_idle("never.seen")
    jobs = block.enqueue_many([(gate,)] * 5)
    with running_worker(mapp, concurrency=8):
        wait_until(lambda: mapp.monitor.active("block") == 5, message="5 active")
        assert not mapp.monitor.is_idle("block", threshold=0)
        activity = {a.task: a for a in mapp.monitor.activity()}
        assert activity["block"].active == 5 and not activity["block"].idle
        mapp.redis.set(gate, 1)
        for job in jobs:
            assert job.result(timeout=10) == "released"
        wait_until(lambda: mapp.monitor.active("block") == 0, message="0 active")
    since = mapp.monitor.idle_since("block")
    assert since is not None and since == pytest.approx(max(j.info().finished_at for j in jobs))
    assert not mapp.monitor.is_idle("block", threshold=3600)
    assert mapp.monitor.is_idle("block", threshold=0)


def test_active_never_negative_after_the_counter_hash_is_deleted(mapp: conveyor.Conveyor) -> None:
    gate = f"{mapp.namespace}:gate"
    jobs = mapp.tasks["block"].enqueue_many([(gate,)] * 3)
    with running_worker(mapp, concurrency=4):
        wait_until(lambda: mapp.monitor.active("block") == 3, message="3 active")
        mapp.redis.delete(mapp.keys("default").active)  # an operator's mistake
        mapp.redis.set(gate, 1)
        for job in jobs:
            job.result(timeout=10)
    assert raw_active(mapp, "block") == 0
    assert mapp.monitor.active("block") == 0


def test_active_stays_non_negative_when_a_worker_is_killed_mid_job(
    mapp: conveyor.Conveyor, tmp_path: Path
) -> None:
    gate = f"{mapp.namespace}:gate-{uuid.uuid4().hex[:6]}"
    jobs = mapp.tasks["block"].enqueue_many([(gate,)] * 4)
    env = env_with_src() | {"CONVEYOR_REDIS_URL": mapp.url,
                            "MONITOR_APP_NAMESPACE": mapp.namespace}
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen([CONVEYOR, "worker", "monitor_app:app", "-c", "8"], env=env,
                            cwd=Path(__file__).parent, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: mapp.monitor.active("block") == 4, timeout=20,
                   message="4 active in the worker process")
        wait_until(lambda: all(start_told(mapp, j.id) for j in jobs), timeout=10,
                   message="the worker told Redis that the runs began")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        # The dead worker's leases still stand: its jobs count as active until reclaimed.
        assert mapp.monitor.active("block") == 4
        mapp.redis.set(gate, 1)
        seen: list[int] = []

        def settled() -> bool:
            seen.append(raw_active(mapp, "block"))
            return all(j.info().state == conveyor.JobState.SUCCEEDED for j in jobs)

        with running_worker(mapp, concurrency=8):  # reclaims the expired leases, reruns
            wait_until(settled, timeout=20, interval=0.02, message="jobs rerun after SIGKILL")
        assert min(seen) >= 0
        assert raw_active(mapp, "block") == 0 and mapp.monitor.active("block") == 0
        assert {j.info().attempts for j in jobs} == {2}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()


def test_activity_lists_registered_and_seen_types(mapp: conveyor.Conveyor) -> None:
    mapp.redis.hset(mapp.keys("other").idle, "legacy.task", 1.0)
    mapp.redis.sadd(f"{mapp.namespace}:queues", "other")
    rows = {(a.queue, a.task): a for a in mapp.monitor.activity()}
    assert ("default", "nap") in rows and rows[("default", "nap")].idle
    legacy = rows[("other", "legacy.task")]
    assert legacy.idle_since == 1.0 and legacy.idle and legacy.active == 0
