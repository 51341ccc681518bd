"""`conveyor limits` through the real console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import conveyor
from helpers import env_with_src

CONVEYOR = str(Path(sys.executable).with_name("conveyor"))


def run(app: conveyor.Conveyor, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([CONVEYOR, "limits", *args, "--url", app.url, "--namespace",
                           app.namespace], env=env_with_src(), capture_output=True, text=True,
                          timeout=60)
    if ok:
        assert done.returncode == 0, done.stderr
    return done


def test_limits_are_shown_set_and_cleared(app: conveyor.Conveyor) -> None:
    run(app, "emails", "--concurrency", "50", "--rate", "200/s", "--tenant-concurrency", "5",
        "--tenant-rate", "20")
    run(app, "emails", "--tenant", "acme", "--tenant", "globex", "--concurrency", "20")
    q = app.queue("emails")
    assert q.limits() == conveyor.QueueLimits(
        50, 200.0, 5, 20.0,
        {"acme": conveyor.TenantLimits(20), "globex": conveyor.TenantLimits(20)})
    shown = run(app, "emails").stdout
    assert "concurrency" in shown and "200/s" in shown and "acme" in shown
    state = json.loads(run(app, "emails", "--rate", "none", "--json").stdout)
    assert state["limits"]["rate"] is None and state["limits"]["concurrency"] == 50
    bad = run(app, "emails", "--rate", "fast", ok=False)
    assert bad.returncode != 0 and "rate must be" in bad.stderr
    run(app, "emails", "--clear")
    assert q.limits() == conveyor.QueueLimits()


def test_stats_shows_jobs_held_per_tenant(app: conveyor.Conveyor) -> None:
    from conveyor.scripts import calls

    app.queue("emails").set_limits(tenant_concurrency=1)
    k = app.keys("emails")
    for tenant in ("acme", "globex"):
        spec = calls.JobSpec(task="emails.send", tenant=tenant)
        app.store("emails", spec, [(f"{tenant}{i}", b"[[]]") for i in range(3)])
    app.scripts.run(calls.fetch(k, 10, app.limits))  # one each runs, the rest is held
    env = {**env_with_src(), "COLUMNS": "160"}  # wide enough for one table per view
    done = subprocess.run([CONVEYOR, "stats", "--url", app.url, "--namespace", app.namespace],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "held by limits" in done.stdout
    assert any("acme" in line and " 2 " in line for line in done.stdout.splitlines())
