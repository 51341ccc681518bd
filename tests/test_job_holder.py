"""A running job says since when it runs and which worker holds it.

The lease write of a fetch (and of a hand-off to an idle worker) records both, in the same
script call: ``JobInfo.started_at`` and ``JobInfo.worker`` while the job is active, and
``worker`` is None once it has ended. The CLI's job view (through the real console
script) and the dashboard's job page show them.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
import warnings
from pathlib import Path

import conveyor
from conveyor.clock import server_now
from conveyor.scripts import calls
from conveyor.web import create_app
from helpers import RedisServer, env_with_src, running_worker, wait_until

with warnings.catch_warnings():  # starlette nudges towards httpx2; httpx is what we have
    warnings.filterwarnings("ignore", "Using `httpx`")
    from starlette.testclient import TestClient

CONVEYOR = str(Path(sys.executable).with_name("conveyor"))


def _blocking_task(app: conveyor.Conveyor, name: str) -> tuple[conveyor.Task[[], str],
                                                                threading.Event]:
    release = threading.Event()

    @app.task(name=name, queue="q")
    def hold() -> str:
        release.wait(20)
        return "done"

    return hold, release


def test_an_active_job_has_its_start_and_worker_and_loses_the_worker_when_it_ends(
        app: conveyor.Conveyor) -> None:
    hold, release = _blocking_task(app, "hold")
    with running_worker(app, queues=["q"]) as worker:
        before = server_now(app.redis)
        job = hold.enqueue()
        info = wait_until(lambda: (i := job.info()).state == "active" and i, 10,
                          message="the job to run")
        assert info.worker == worker.id
        assert info.started_at is not None
        assert before - 0.01 <= info.started_at <= server_now(app.redis)
        assert info.wait_time is not None and info.run_time is None
        release.set()
        assert job.result(timeout=20) == "done"
    done = job.info()
    assert done.worker is None
    assert done.started_at is not None and done.finished_at is not None
    assert done.started_at >= info.started_at and done.run_time is not None


def test_a_job_handed_to_an_idle_worker_names_it_too(app: conveyor.Conveyor) -> None:
    hold, release = _blocking_task(app, "handed")
    k = app.keys("q")
    with running_worker(app, queues=["q"]) as worker:
        wait_until(lambda: app.redis.zscore(k.waiters, worker.id) is not None, 10,
                   message="the worker to wait for a hand-off")
        job = hold.enqueue()
        info = wait_until(lambda: (i := job.info()).state == "active" and i, 10,
                          message="the job to run")
        assert int(app.redis.hget(k.counts, "handed") or 0) == 1  # it came by hand-off
        assert info.worker == worker.id and info.started_at is not None
        release.set()
        job.result(timeout=20)
    assert job.info().worker is None


def test_the_fetch_script_writes_the_holder_only_when_named(app: conveyor.Conveyor) -> None:
    @app.task(name="plain", queue="q", visibility_timeout=5)
    def plain() -> None:
        pass

    k = app.keys("q")
    a, b = plain.enqueue(), plain.enqueue()
    [leased] = app.scripts.run(calls.fetch(k, 1, app.limits, worker="w-7")).jobs
    [other] = app.scripts.run(calls.fetch(k, 1, app.limits)).jobs
    held = a if leased.short_id == a.short_id else b
    anonymous = b if held is a else a
    assert other.short_id == anonymous.short_id
    assert held.info().worker == "w-7" and held.info().started_at is not None
    assert anonymous.info().worker is None and anonymous.info().started_at is not None
    assert app.redis.hget(k.job(held.short_id), "w") == b"w-7"
    assert app.redis.zscore(k.waiters, "w-7") is None  # no waiter_ttl_ms: not registered
    # Its lease lapses: the job is ready again, held by nobody.
    later = (server_now(app.redis) + 10) * 1000
    app.scripts.run(calls.fetch(k, 0, app.limits, now=later))
    assert held.info().state == "ready" and held.info().worker is None


def test_cli_and_dashboard_show_how_long_and_where_a_job_runs(
        redis_server: RedisServer) -> None:
    namespace = f"t{uuid.uuid4().hex[:10]}"
    app = conveyor.Conveyor(redis_server.url, namespace=namespace)
    hold, release = _blocking_task(app, "shown")
    try:
        with running_worker(app, queues=["q"]) as worker:
            job = hold.enqueue()
            info = wait_until(lambda: (i := job.info()).state == "active" and i, 10,
                              message="the job to run")
            wait_until(lambda: server_now(app.redis) > (info.started_at or 0) + 0.01, 5,
                       message="the run to last a moment")
            shown = subprocess.run([CONVEYOR, "job", job.id, "--namespace", namespace],
                                   env={**env_with_src(), "CONVEYOR_REDIS_URL": redis_server.url},
                                   capture_output=True, text=True, timeout=60)
            with TestClient(create_app(app, cache_seconds=0)) as web:
                page = web.get(f"/jobs/{job.id}").text
                detail = web.get(f"/api/jobs/{job.id}").json()
                release.set()
                job.result(timeout=20)
                after = web.get(f"/api/jobs/{job.id}").json()
        assert shown.returncode == 0, shown.stderr
        assert f"on worker {worker.id}" in shown.stdout and "running" in shown.stdout
        assert "Running for" in page and worker.id in page
        assert detail["worker"] == worker.id
        assert detail["running_for"] is not None and detail["running_for"] > 0
        assert after["worker"] is None and after["running_for"] is None
    finally:
        app.close()


def test_a_lease_handed_back_unstarted_leaves_no_start_behind(app: conveyor.Conveyor) -> None:
    @app.task(name="plain", queue="q")
    def plain() -> None:
        pass

    k = app.keys("q")
    job = plain.enqueue()
    [leased] = app.scripts.run(calls.fetch(k, 1, app.limits, worker="w-8")).jobs
    assert job.info().started_at is not None
    assert app.scripts.run(calls.release(k, [(leased.short_id, leased.token)])) == 1
    info = job.info()
    assert (info.state, info.attempts, info.started_at, info.worker) == ("ready", 0, None, None)
