"""The monitoring commands through the real ``conveyor`` console script."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import conveyor
from conveyor.sink import stream_events
from helpers import RedisServer, env_with_src, free_port, running_worker, wait_until
from monitor_app import make_app

CONVEYOR = str(Path(sys.executable).with_name("conveyor"))


@pytest.fixture
def busy(redis_server: RedisServer, namespace: str) -> Iterator[conveyor.Conveyor]:
    """An app that has run some jobs: 20 naps and 2 dead, and has 5 naps waiting."""
    app = make_app(redis_server.url, namespace)
    stream_events(app, "default")  # as if a sink had read the queue before
    jobs = app.tasks["nap"].enqueue_many([(0.01,)] * 20) + \
        app.tasks["doomed"].enqueue_many([(1,), (2,)])
    with running_worker(app, concurrency=8):
        wait_until(lambda: all(j.info().state.finished for j in jobs), 20, message="jobs done")
    app.tasks["nap"].enqueue_many([(0.01,)] * 5)
    yield app
    app.close()


def cli(app: conveyor.Conveyor, *args: str, cwd: Path | None = None) -> str:
    done = subprocess.run([CONVEYOR, *args, "--url", app.url, "--namespace", app.namespace]
                          if args[0] != "report" else [CONVEYOR, *args],
                          env=env_with_src(), capture_output=True, text=True, timeout=60,
                          cwd=cwd)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_stats_json_and_table(busy: conveyor.Conveyor) -> None:
    data = json.loads(cli(busy, "stats", "--json"))
    assert data["total"]["succeeded"] == 20 and data["total"]["dead"] == 2
    assert data["total"]["backlog"]["ready"] == 5
    naps = next(t for t in data["tasks"] if t["task"] == "nap")
    assert naps["run"]["p50"] == pytest.approx(0.01, abs=0.02)
    table = cli(busy, "stats", "--task", "nap")
    assert "nap" in table and "backlog" in table


def test_top_draws_a_frame(busy: conveyor.Conveyor) -> None:
    out = cli(busy, "top", "-n", "1")
    assert "conveyor top" in out and "nap" in out and "doomed" in out and "idle" in out


def test_advice_json_for_autoscalers(busy: conveyor.Conveyor) -> None:
    data = json.loads(cli(busy, "advice", "default", "--target-wait", "5", "--deadline",
                          "+1h", "--json"))
    assert data["workers_needed"] == 1 and data["assumed_workers"] is True
    assert data["backlog"]["ready"] == 5 and data["deadline"] is not None
    assert any("before the deadline" in r for r in data["reasons"])
    text = cli(busy, "advice", "default")
    assert "worker(s) needed" in text


def test_sink_then_report(busy: conveyor.Conveyor, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'jobs.db'}"
    assert "wrote 22 job(s)" in cli(busy, "sink", "--db", db, "--until-idle")
    assert "wrote 0 job(s)" in cli(busy, "sink", "--db", db, "--until-idle")
    rows = {r["task"]: r for r in json.loads(cli(busy, "report", "--db", db, "--json"))}
    assert rows["nap"]["jobs"] == 20 and rows["doomed"]["dead"] == 2
    assert rows["nap"]["run_p95"] == pytest.approx(0.01, abs=0.03)
    assert "nap" in cli(busy, "report", "--db", db, "--since", "1h")


def test_metrics_endpoint(busy: conveyor.Conveyor, tmp_path: Path) -> None:
    port = free_port()
    log = (tmp_path / "metrics.log").open("wb")
    proc = subprocess.Popen([CONVEYOR, "metrics", "--port", str(port), "--addr", "127.0.0.1",
                             "--url", busy.url, "--namespace", busy.namespace],
                            env=env_with_src(), stdout=log, stderr=subprocess.STDOUT)

    def scrape() -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return str(r.read().decode())
        except OSError:
            return None

    try:
        body = wait_until(scrape, 20, 0.1, "metrics endpoint")
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
    assert 'conveyor_jobs_succeeded_total{queue="default",task="nap"} 20.0' in body
    assert 'conveyor_jobs_dead_total{queue="default",task="doomed"} 2.0' in body
    assert 'conveyor_queue_jobs{queue="default",state="ready"} 5.0' in body
    assert 'conveyor_job_run_seconds_count{queue="default",task="nap"} 20.0' in body
    assert 'conveyor_job_run_seconds_bucket{le="+Inf",queue="default",task="nap"} 20.0' in body
    assert 'conveyor_task_active{queue="default",task="nap"} 0.0' in body
