"""The core commands through the real console script: worker, job, dead, info."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conveyor.cli.inspect import when
from conveyor.clock import ServerClock
from conveyor.schedule import Scheduler
from helpers import RedisServer, env_with_src, running_worker, wait_until

CONVEYOR = str(Path(sys.executable).with_name("conveyor"))


@pytest.fixture
def cli(redis_server: RedisServer):  # type: ignore[no-untyped-def]
    namespace = f"cli{uuid.uuid4().hex[:8]}"
    env = env_with_src()
    env.update(CONVEYOR_REDIS_URL=redis_server.url, CLI_TEST_NAMESPACE=namespace)

    def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([CONVEYOR, *args], env=env, capture_output=True, text=True,
                              timeout=60, cwd=Path(__file__).parent)
        if ok:
            assert done.returncode == 0, done.stderr
        return done

    import os

    os.environ["CLI_TEST_NAMESPACE"] = namespace
    os.environ["CONVEYOR_REDIS_URL"] = redis_server.url
    sys.path.insert(0, str(Path(__file__).parent))
    import importlib

    import apps.cli_app as module

    module = importlib.reload(module)
    yield run, module
    module.app.close()


def test_worker_burst_job_and_dead_commands(cli) -> None:  # type: ignore[no-untyped-def]
    run, module = cli
    good = module.double.enqueue(21)
    bad = module.double.enqueue(-1)
    run("worker", "apps.cli_app:app", "-q", "cli", "-c", "4", "--burst")
    assert good.info().result == 42

    shown = json.loads(run("job", good.id, "--json", "--app", "apps.cli_app:app").stdout)
    assert shown["state"] == "succeeded" and shown["result"] == 42 and shown["attempts"] == 1
    text = run("job", good.id, "--app", "apps.cli_app:app").stdout
    assert "succeeded" in text and "1 of 1" in text

    missing = run("job", "cli~nosuchjob", "--app", "apps.cli_app:app", ok=False)
    assert missing.returncode != 0 and "no job cli~nosuchjob" in missing.stderr

    dead = json.loads(run("dead", "list", "cli", "--json", "--app", "apps.cli_app:app").stdout)
    assert [d["id"] for d in dead] == [bad.id]
    assert "ValueError: negative input -1" in dead[0]["error"]
    assert "requeued 1 job(s)" in run("dead", "requeue", "cli", "--yes",
                                            "--app", "apps.cli_app:app").stdout
    assert bad.info().state.value == "ready"
    run("worker", "apps.cli_app:app", "-q", "cli", "--burst")
    assert bad.info().state.value == "dead"
    assert "purged 1 job(s)" in run("dead", "purge", "cli", "--yes",
                                    "--app", "apps.cli_app:app").stdout
    assert run("dead", "list", "cli", "--json", "--app", "apps.cli_app:app").stdout.strip() == "[]"


def test_info_lists_queues_and_schedules(cli) -> None:  # type: ignore[no-untyped-def]
    run, module = cli
    module.double.enqueue_many([(1,), (2,), (3,)])
    out = run("info", "--app", "apps.cli_app:app").stdout
    assert "cli" in out and "3" in out
    assert "cli.rollup" in out and "*/5 * * * *" in out and "never" in out


def test_info_shows_a_periodic_as_never_fired_until_a_tick_fires(cli) -> None:  # type: ignore[no-untyped-def]
    """A worker's first start records the current tick without firing: ``info`` still says
    the periodic never fired; once a tick fires, it shows that tick."""
    run, module = cli
    app = module.app
    cursor = app.keys("cron").schedule("cli.rollup")
    with running_worker(app, queues=["cron"], concurrency=1):
        wait_until(lambda: app.redis.exists(cursor), 10, message="the first start's cursor")

    def rollup_row() -> str:
        out = run("info", "--app", "apps.cli_app:app").stdout
        return out[out.index("cli.rollup"):].split("\n\n")[0]

    def rollup_json() -> dict[str, object]:
        shown = json.loads(run("info", "--json", "--app", "apps.cli_app:app").stdout)
        (row,) = [r for r in shown["schedules"] if r["task"] == "cli.rollup"]
        return row  # type: ignore[no-any-return]

    armed = int(app.redis.get(cursor)) / 1000
    assert "never" in rollup_row() and when(armed, "seconds") not in rollup_row()
    assert rollup_json()["last"] is None

    (periodic,) = app.periodics
    tick = periodic.next_after(armed)

    async def fire() -> bool:
        try:
            return await Scheduler(app, ["cron"], ServerClock()).fire(periodic, tick)
        finally:
            await app.aclose()

    assert asyncio.run(fire())
    assert when(tick, "seconds") in rollup_row() and "never" not in rollup_row()
    assert rollup_json()["last"] == tick


def test_bad_app_spec_is_explained(cli) -> None:  # type: ignore[no-untyped-def]
    run, _ = cli
    done = run("worker", "apps.nosuchmodule:app", ok=False)
    assert done.returncode == 2 and "cannot import 'apps.nosuchmodule'" in done.stderr
    done = run("worker", "apps.cli_app:nothing", ok=False)
    assert "has no conveyor.Conveyor named 'nothing'" in done.stderr


def test_python_dash_m_and_help(cli) -> None:  # type: ignore[no-untyped-def]
    done = subprocess.run([sys.executable, "-m", "conveyor", "--help"], capture_output=True,
                          text=True, timeout=60, env=env_with_src())
    assert done.returncode == 0
    for command in ("worker", "demo", "info", "job", "dead", "stats", "dashboard"):
        assert command in done.stdout
