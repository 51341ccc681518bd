"""Every example in examples/ runs as a user would run it (the Django project is driven by
tests/test_django.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from helpers import RedisServer, env_with_src, free_port, wait_until

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
BIN = Path(sys.executable).parent


def example_env(server: RedisServer, namespace: str, folder: Path) -> dict[str, str]:
    env = env_with_src()
    env.update(CONVEYOR_REDIS_URL=server.url, CONVEYOR_NAMESPACE=namespace)
    env["PYTHONPATH"] = os.pathsep.join([str(folder), env.get("PYTHONPATH", "")])
    return env


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.terminate()
    for proc in started:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_newsletter_example(redis_server: RedisServer, namespace: str) -> None:
    folder = EXAMPLES / "newsletter"
    proc = subprocess.run([sys.executable, "newsletter.py"], cwd=folder, capture_output=True,
                          text=True, timeout=120, check=False,
                          env=example_env(redis_server, namespace, folder))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "enqueued 48 jobs" in proc.stdout
    assert "states: {'dead': 1, 'succeeded': 47}; recipients reached: 4400" in proc.stdout
    assert "550 relay refused batch 7 of globex" in proc.stdout


def test_fastapi_example(redis_server: RedisServer, namespace: str, tmp_path: Path,
                         processes: list[subprocess.Popen[bytes]]) -> None:
    folder = EXAMPLES / "fastapi"
    env = example_env(redis_server, namespace, folder)
    port = free_port()
    log = open(tmp_path / "out.log", "ab")  # noqa: SIM115 - closed when the test ends
    processes.append(subprocess.Popen(
        [str(BIN / "uvicorn"), "app:api", "--port", str(port), "--log-level", "warning"],
        cwd=folder, env=env, stdout=log, stderr=log))
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{base}/docs", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, 60, message="uvicorn serving the example")
        signup = httpx.post(f"{base}/signup", json={"email": "ada@example.com"}, timeout=10)
        assert signup.status_code == 202
        first = httpx.post(f"{base}/images/7/thumbnail?width=64", timeout=10).json()["job"]
        again = httpx.post(f"{base}/images/7/thumbnail?width=64", timeout=10).json()["job"]
        assert again == first  # the dedupe key: one job while the first is unfinished
        assert httpx.get(f"{base}/jobs/{first}", timeout=10).json()["state"] == "ready"
        processes.append(subprocess.Popen(  # the worker starts now
            [str(BIN / "conveyor"), "worker", "tasks:app", "-c", "4"],
            cwd=folder, env=env, stdout=log, stderr=log))

        def finished(job_id: str) -> dict[str, object] | None:
            body: dict[str, object] = httpx.get(f"{base}/jobs/{job_id}", timeout=10).json()
            return body if body["state"] == "succeeded" else None

        wait_until(lambda: finished(signup.json()["job"]), 60, message="welcome mail")
        welcome = finished(signup.json()["job"])
        assert welcome is not None and welcome["result"] == "welcome mail sent to ada@example.com"
        wait_until(lambda: finished(first), 60, message="thumbnail")
        assert finished(first) == {"id": first, "state": "succeeded", "attempts": 1,
                                   "result": {"image": 7, "width": 64,
                                              "path": "/thumbs/7-64.png"}, "error": None}
        assert httpx.get(f"{base}/jobs/images~nope", timeout=10).status_code == 404
    finally:
        log.close()
