"""``conveyor workflow ID`` through the click entry point: a tree of nodes with states."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import conveyor
from conveyor.cli import main
from helpers import RedisServer, env_with_src, running_worker


def test_workflow_command_shows_a_tree_with_states(app: conveyor.Conveyor) -> None:
    @app.task(name="wf.ok")
    def ok(x: int) -> int:
        return x

    @app.task(name="wf.boom", retries=0)
    def boom() -> None:
        raise RuntimeError("broken batch")

    wf = app.workflow()
    top = wf.add(ok, 1, name="top")
    left = wf.add(ok, 2, name="left", after=[top])
    bad = wf.add(boom, name="bad", after=[top])
    wf.add(ok, 3, name="bottom", after=[left, bad])
    handle = wf.enqueue()
    with running_worker(app, concurrency=2), pytest.raises(conveyor.JobFailed):
        handle.result(timeout=30)
    runner = CliRunner()
    base = ["--url", app.url, "--namespace", app.namespace]
    done = runner.invoke(main, ["workflow", handle.id, *base], terminal_width=200)
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert f"workflow {handle.id}" in lines[0] and "failed" in lines[0]
    assert "top" in lines[1] and "succeeded" in lines[1]
    bottom = next(line for line in lines if "bottom" in line)
    assert "cancelled" in bottom and "(after left, bad)" in bottom
    assert "dead" in next(line for line in lines if "bad " in line)
    # children are indented under their first parent
    assert lines[1].index("top") < bottom.index("bottom")
    as_json = json.loads(runner.invoke(main, ["workflow", handle.id, "--json", *base]).output)
    assert as_json["state"] == "failed"
    assert as_json["nodes"]["bottom"]["after"] == ["left", "bad"]
    assert as_json["counts"] == {"succeeded": 2, "dead": 1, "cancelled": 1}
    missing = runner.invoke(main, ["workflow", "default~nope", *base])
    assert missing.exit_code != 0 and "no workflow" in missing.output


def test_demo_reports_each_tenant_once_all_its_batches_ended(
    redis_server: RedisServer,
) -> None:
    env = env_with_src()
    env["CONVEYOR_REDIS_URL"] = redis_server.url
    env["COLUMNS"] = "200"
    done = subprocess.run([str(Path(sys.executable).with_name("conveyor")), "demo", "--scale",
                           "1", "-c", "16"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "newsletter reports" in out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines()
            if line.count("│") >= 6 and line.split("│")[1].strip() in
            ("acme", "globex", "initech", "umbrella", "hooli")}
    assert set(rows) == {"acme", "globex", "initech", "umbrella", "hooli"}
    failed = {t: int(line.split("│")[4]) for t, line in rows.items()}
    assert failed == {"acme": 0, "globex": 1, "initech": 1, "umbrella": 0, "hooli": 0}
