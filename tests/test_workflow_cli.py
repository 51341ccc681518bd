"""``conveyor workflow ID`` through the click entry point: a tree of nodes with states."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import conveyor
from conveyor.cli import main
from helpers import running_worker


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
