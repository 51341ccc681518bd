"""What ``conveyor worker`` says, read from a real worker process: the banner, a line per
retry and per dead job, JSON lines, the way out, and Redis out of reach."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from helpers import RedisServer, env_with_src, stop_processes, wait_until

TESTS = Path(__file__).parent
CONVEYOR = str(Path(sys.executable).with_name("conveyor"))


class Worker:
    """A ``conveyor worker`` process and the lines of its stderr, read as they come."""

    def __init__(self, url: str, namespace: str, *args: str, verbose: bool = False) -> None:
        """:param verbose: ``-v`` given to the command group (``conveyor -v worker``); the
            worker command's own ``-v`` goes in ``args``"""
        env = env_with_src()
        env.update(CONVEYOR_REDIS_URL=url, CLI_TEST_NAMESPACE=namespace)
        self.proc = subprocess.Popen(
            [CONVEYOR, *(["-v"] if verbose else []), "worker", "apps.cli_app:app", "-q", "cli",
             "-c", "2", *args],
            env=env, cwd=TESTS, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float = 20.0) -> str:
        def found() -> str | None:
            return next((line for line in list(self.lines) if text in line), None)

        line: str = wait_until(found, timeout, message=f"{text!r} in {self.lines}")
        return line

    def text(self) -> str:
        return "\n".join(self.lines)

    def stop(self) -> None:
        """Stop the process (if it still runs), read the rest of its output, close the pipe."""
        stop_processes([self.proc])
        self.reader.join(10)
        assert self.proc.stderr is not None
        self.proc.stderr.close()


@pytest.fixture
def cli_app(redis_server: RedisServer) -> Iterator[tuple[ModuleType, str]]:
    """The test application, in a namespace of its own, for this process and workers."""
    namespace = f"out{uuid.uuid4().hex[:8]}"
    os.environ.update(CLI_TEST_NAMESPACE=namespace, CONVEYOR_REDIS_URL=redis_server.url)
    sys.path.insert(0, str(TESTS))
    import apps.cli_app as module

    module = importlib.reload(module)
    yield module, namespace
    module.app.close()


def test_banner_retry_dead_and_ctrl_c(cli_app: tuple[ModuleType, str],
                                      redis_server: RedisServer) -> None:
    module, namespace = cli_app
    url = redis_server.url.replace("redis://", "redis://default:hunter2@")
    worker = Worker(url, namespace)
    try:
        banner = worker.wait_for("ready:")
        assert "redis redis://default:***@127.0.0.1" in banner
        assert f"namespace {namespace}, queues cli, concurrency 2" in banner
        assert "cli.always_fails, cli.double" in banner

        failing = module.always_fails.enqueue(7)
        retry = worker.wait_for(f"job {failing.id} (cli.always_fails) failed attempt 1 of 2")
        assert "INFO conveyor.jobs" in retry and retry.endswith("RuntimeError: failed on 7")
        dead = worker.wait_for(f"job {failing.id} (cli.always_fails) is dead after attempt 2")
        assert "WARNING conveyor.jobs" in dead and dead.endswith("RuntimeError: failed on 7")
        module.double.enqueue(4).result(timeout=10)
        assert "succeeded" not in worker.text()  # a line per job only with -v

        running = module.sleep.enqueue(1.5)
        wait_until(lambda: running.info().state.value == "active", message="a running job")
        worker.proc.send_signal(signal.SIGINT)
        stopping = worker.wait_for("stopping:")
        assert "draining 1 running job(s) for up to 30 s (grace period)" in stopping
        assert worker.proc.wait(20) == 0
        assert running.info().state.value == "succeeded"
        text = worker.text()
        assert "hunter2" not in text and "Traceback" not in text and "second line" not in text
    finally:
        worker.stop()


def test_json_lines_parse_and_verbose_adds_a_line_per_job(
        cli_app: tuple[ModuleType, str], redis_server: RedisServer) -> None:
    module, namespace = cli_app
    worker = Worker(redis_server.url, namespace, "--log-format", "json", verbose=True)
    try:
        ok = module.double.enqueue(5)
        bad = module.double.enqueue(-5)
        worker.wait_for(f'"job_id": "{ok.id}"')
        worker.wait_for(f'"job_id": "{bad.id}"')
    finally:
        worker.stop()
    records = [json.loads(line) for line in worker.lines]  # every line is one object
    banner = next(r for r in records if r["message"].startswith("worker ") and "ready" in
                  r["message"])
    assert banner["namespace"] == namespace and banner["queues"] == ["cli"]
    assert banner["concurrency"] == 2 and "cli.double" in banner["tasks"]
    by_job = {r["job_id"]: r for r in records if "job_id" in r}
    assert by_job[ok.id]["outcome"] == "succeeded" and by_job[ok.id]["level"] == "INFO"
    assert by_job[ok.id]["logger"] == "conveyor.jobs.done" and by_job[ok.id]["task"] == "cli.double"
    assert by_job[bad.id]["outcome"] == "dead" and by_job[bad.id]["level"] == "WARNING"
    assert by_job[bad.id]["error"] == "ValueError: negative input -5"
    assert all(r["time"].endswith("Z") for r in records)


def test_the_worker_commands_own_verbose_flag_adds_a_line_per_job(
        cli_app: tuple[ModuleType, str], redis_server: RedisServer) -> None:
    module, namespace = cli_app
    worker = Worker(redis_server.url, namespace, "-v")  # conveyor worker APP ... -v
    try:
        ok = module.double.enqueue(6)
        line = worker.wait_for(f"job {ok.id} (cli.double) succeeded")
        assert "INFO conveyor.jobs.done" in line
    finally:
        worker.stop()


def test_redis_down_is_said_once_then_reached(cli_app: tuple[ModuleType, str],
                                             make_server: type[RedisServer]) -> None:
    _, namespace = cli_app
    server = make_server()  # a free port, nothing listening yet
    worker = Worker(server.url, namespace)
    try:
        line = worker.wait_for("cannot reach Redis")
        assert "ERROR conveyor.worker" in line
        assert f"cannot reach Redis at {server.url}: connection refused; check" in line
        server.start()
        worker.wait_for("reached Redis")
        worker.wait_for("ready:")
        assert worker.text().count("cannot reach Redis") == 1
        assert "Traceback" not in worker.text()
    finally:
        worker.stop()
    assert worker.proc.returncode == 0


def test_a_stop_while_redis_is_down_ends_the_worker(cli_app: tuple[ModuleType, str],
                                                    make_server: type[RedisServer]) -> None:
    _, namespace = cli_app
    server = make_server()
    worker = Worker(server.url, namespace)
    try:
        worker.wait_for("cannot reach Redis")
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(10) == 0
    finally:
        worker.stop()
    assert "Traceback" not in worker.text()


def test_redis_lost_while_running_is_one_line_then_one_when_back(
        cli_app: tuple[ModuleType, str], make_server: type[RedisServer]) -> None:
    _, namespace = cli_app
    server = make_server().start()
    worker = Worker(server.url, namespace)
    try:
        worker.wait_for("ready:")
        server.stop()
        lost = worker.wait_for("lost Redis")
        assert f"ERROR conveyor.worker: lost Redis at {server.url}: " in lost
        assert "connection refused" in lost or "the connection was cut" in lost
        server.start()
        worker.wait_for(f"Redis at {server.url} answers again after")
        text = worker.text()
        assert text.count("lost Redis") == 1 and "Traceback" not in text
        assert "could not fetch" not in text and "failed (ConnectionError" not in text
    finally:
        worker.stop()
