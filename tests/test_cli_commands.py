"""Commands of the first hour, through the real console script: pause and resume, a dead
requeue that asks, the dashboard by URL, where the metrics listen, and the demo's data."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

import conveyor
from conveyor import testing
from helpers import RedisServer, env_with_src, free_port, stop_processes, wait_until

CONVEYOR = str(Path(sys.executable).with_name("conveyor"))


def cli(app: conveyor.Conveyor, *args: str, stdin: str | None = None
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CONVEYOR, *args, "--url", app.url, "--namespace", app.namespace],
                          env=env_with_src(), capture_output=True, text=True, timeout=60,
                          input=stdin)


def dead_jobs(app: conveyor.Conveyor, n: int) -> list[conveyor.Job]:
    @app.task(name="mail.bounce", queue="mail", retries=0)
    def bounce(i: int) -> None:
        raise RuntimeError("relay said no")

    jobs = bounce.enqueue_many([(i,) for i in range(n)])
    testing.drain(app, ["mail"])
    return jobs


def test_pause_and_resume(app: conveyor.Conveyor) -> None:
    app.task(name="mail.send", queue="mail")(lambda: None).enqueue()
    done = cli(app, "pause", "mail")
    assert done.returncode == 0 and "paused mail" in done.stdout
    assert app.queue("mail").is_paused()
    assert "already paused" in cli(app, "pause", "mail").stdout
    assert "resumed mail" in cli(app, "resume", "mail").stdout
    assert not app.queue("mail").is_paused()
    unknown = cli(app, "pause", "mial")
    assert unknown.returncode == 1 and "unknown queue 'mial'" in unknown.stderr
    assert not app.queue("mial").is_paused()


def test_requeue_of_every_dead_job_asks(app: conveyor.Conveyor) -> None:
    jobs = dead_jobs(app, 3)
    refused = cli(app, "dead", "requeue", "mail", stdin="n\n")
    assert refused.returncode == 1 and "requeue all 3 dead jobs of mail?" in refused.stdout
    assert all(j.info().state.value == "dead" for j in jobs)
    one = cli(app, "dead", "requeue", "mail", "--id", jobs[0].id)  # one job: no question
    assert one.returncode == 0 and "requeued 1 job(s)" in one.stdout
    agreed = cli(app, "dead", "requeue", "mail", stdin="y\n")
    assert agreed.returncode == 0 and "requeued 2 job(s)" in agreed.stdout
    assert all(j.info().state.value == "ready" for j in jobs)


def test_dashboard_by_url_and_namespace(app: conveyor.Conveyor) -> None:
    app.task(name="mail.send", queue="mail")(lambda: None).enqueue()
    port = free_port()
    proc = subprocess.Popen([CONVEYOR, "dashboard", "--url", app.url, "--namespace",
                             app.namespace, "--port", str(port)], env=env_with_src(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def overview() -> dict[str, object] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/overview",
                                        timeout=2) as response:
                return json.loads(response.read())  # type: ignore[no-any-return]
        except OSError:
            return None

    try:
        data = wait_until(overview, 20, 0.1, "the dashboard to answer")
        queues = {q["name"]: q for q in data["queues"]}  # type: ignore[attr-defined]
        assert queues["mail"]["ready"] == 1
    finally:
        stop_processes([proc])
    assert proc.stderr is not None
    with proc.stderr:
        assert f"namespace {app.namespace}" in proc.stderr.read()


def listening_addresses(port: int) -> set[str]:
    """Local addresses of the sockets listening on ``port`` (from /proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if int(hex_port, 16) == port and state == "0A":  # LISTEN
            octets = [str(int(address[i:i + 2], 16)) for i in (6, 4, 2, 0)]
            found.add(".".join(octets))
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux's /proc")
def test_metrics_listen_on_loopback_by_default(app: conveyor.Conveyor) -> None:
    port = free_port()
    proc = subprocess.Popen([CONVEYOR, "metrics", "--port", str(port), "--url", app.url,
                             "--namespace", app.namespace], env=env_with_src(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        addresses = wait_until(lambda: listening_addresses(port), 20, 0.1, "the exporter")
        assert addresses == {"127.0.0.1"}
    finally:
        stop_processes([proc])


def test_demo_names_its_redis_and_leaves_its_jobs(redis_server: RedisServer) -> None:
    env = {**env_with_src(), "CONVEYOR_REDIS_URL": redis_server.url, "COLUMNS": "200"}
    done = subprocess.run([CONVEYOR, "demo", "--scale", "1", "-c", "16"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    match = re.fullmatch(r"Redis: (\S+) \(\$CONVEYOR_REDIS_URL\); namespace (\S+)", first)
    assert match is not None and match.group(1) == redis_server.url
    namespace = match.group(2)
    command = f"conveyor dead list newsletter --namespace {namespace}"
    assert command in done.stdout
    dead = subprocess.run([CONVEYOR, *command.split()[1:], "--json"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert len(json.loads(dead.stdout)) == 2  # the two batches that always fail


def test_purge_cancels_the_ready_jobs_of_a_queue_and_nothing_else(
        app: conveyor.Conveyor) -> None:
    @app.task(name="chore", queue="chores")
    def chore(n: int) -> int:
        return n

    ready = chore.enqueue_many([(i,) for i in range(30)])
    with_tenant = chore.options(tenant="acme", priority=8).enqueue_many(
        [(i,) for i in range(5)])
    later = chore.options(delay=600).enqueue(99)
    plain = chore.enqueue(7)  # a plain enqueue: in the queue's inbox until a fetch
    done = cli(app, "purge", "chores", "--yes")
    assert done.returncode == 0 and "cancelled 36 ready job(s)" in done.stdout, done
    assert all(j.info().state == "cancelled" for j in [*ready, *with_tenant, plain])
    assert later.info().state == "scheduled"
    assert app.monitor.backlog("chores").ready == 0
    assert "purged" in (ready[0].info().error or "")
