"""Batch tasks with real worker processes: a worker SIGKILLed in the middle of a call.
Every item of that call runs again elsewhere and ends succeeded exactly once."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import conveyor
from apps.batch_app import hold_key, ledger_key, make_app
from conveyor import JobState
from helpers import RedisServer, env_with_src, stop_processes, wait_until

CONVEYOR = str(Path(sys.executable).with_name("conveyor"))
HERE = Path(__file__).parent


@pytest.fixture
def bapp(redis_server: RedisServer, namespace: str) -> Iterator[conveyor.Conveyor]:
    application = make_app(redis_server.url, namespace)
    yield application
    application.close()


@pytest.mark.timeout(90)
def test_a_worker_killed_mid_call_leaves_every_item_to_run_again_once(
        bapp: conveyor.Conveyor, tmp_path: Path) -> None:
    ns, procs = bapp.namespace, []
    env = env_with_src() | {"CONVEYOR_REDIS_URL": bapp.url, "BATCH_NAMESPACE": ns}

    def start() -> subprocess.Popen[bytes]:
        log = (tmp_path / f"worker-{len(procs)}.log").open("wb")
        proc = subprocess.Popen([CONVEYOR, "worker", "apps.batch_app:app", "-q", "index",
                                 "-c", "2"], env=env, cwd=HERE, stdout=log,
                                stderr=subprocess.STDOUT)
        log.close()
        procs.append(proc)
        return proc

    def ledger() -> list[str]:
        return [e.decode() for e in bapp.redis.lrange(ledger_key(ns), 0, -1)]

    try:
        bapp.redis.set(hold_key(ns), 1)
        jobs = bapp.tasks["batch.index"].enqueue_many(range(30))
        first = start()
        wait_until(lambda: any(e.startswith("start") for e in ledger()), 20,
                   message="a call under way")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        killed_mid_call = {e.split()[1] for e in ledger() if e.startswith("start")}
        assert killed_mid_call and not any(e.startswith("done") for e in ledger())
        bapp.redis.delete(hold_key(ns))
        start()
        wait_until(lambda: all(j.info().state == JobState.SUCCEEDED for j in jobs), 40,
                   message="every job succeeded")
    finally:
        stop_processes(procs)
    done = Counter(e.split()[1] for e in ledger() if e.startswith("done"))
    assert done == Counter({str(n): 1 for n in range(30)})
    for n, job in enumerate(jobs):
        assert job.result(timeout=1) == f"indexed {n}"
        info = job.info()
        assert info.attempts == (2 if str(n) in killed_mid_call else 1), (n, info.attempts)
