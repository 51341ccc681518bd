"""Shared test helpers: private redis-server processes, bounded waiting, worker threads."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import conveyor

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01,
               message: str = "condition") -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {message}")
        time.sleep(interval)


class RedisServer:
    """A private redis-server on a free port in its own folder."""

    def __init__(self, durable: bool = False, extra: list[str] | None = None) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="conveyor-redis-"))
        self.durable = durable
        self.extra = extra or []
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)

    def start(self) -> RedisServer:
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.dir), "--save", "", "--daemonize", "no",
                "--logfile", str(self.dir / "redis.log")]
        if self.durable:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        self.process = subprocess.Popen(args + self.extra, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        client = self.client()

        def up() -> bool:
            try:
                return bool(client.ping())
            except redis.exceptions.ConnectionError:
                return False

        wait_until(up, 10, message=f"redis-server on port {self.port}")
        client.close()
        return self

    def stop(self, save: bool = False) -> None:
        if self.process is None:
            return
        with contextlib.suppress(Exception):
            # Without retries: the server closing the connection is the expected answer, and
            # redis-py's default retries would spend seconds reconnecting to a stopped server.
            quiet = redis.Redis(port=self.port, retry=Retry(NoBackoff(), 0))
            quiet.shutdown(save=save, nosave=not save)
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        self.process = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def running_worker(app: conveyor.Conveyor, **options: Any) -> Iterator[conveyor.Worker]:
    """Run a worker in a thread for the duration of the block, then stop it gracefully."""
    burst = options.pop("burst", False)
    worker = app.worker(**options)
    errors: list[BaseException] = []

    def target() -> None:
        try:
            worker.run(burst=burst)
        except BaseException as exc:  # surface crashes in the test
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    wait_until(worker.started.is_set, 10, message="worker start")
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(30)
        assert not thread.is_alive(), "worker did not stop"
        if errors:
            raise errors[0]


def env_with_src() -> dict[str, str]:
    env = dict(os.environ)
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root / "src"), str(root / "tests"),
                                         env.get("PYTHONPATH", "")])
    return env
