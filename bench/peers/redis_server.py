"""A private, throw-away ``redis-server`` for the benchmark.

One server on a free loopback port, persistence off (``--save ''
--appendonly no``) so that fsyncs and forks never show up in the figures, in
a temporary directory removed at the end.  Everything talks to 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from .procs import process_cpu_seconds

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
HOST = "127.0.0.1"


def free_port() -> int:
    """Ask the kernel for an unused loopback port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class RedisServer:
    """Handle on the running server: URL, a harness client, INFO helpers."""

    def __init__(self, port: int, workdir: Path, proc: subprocess.Popen[bytes]) -> None:
        self.port = port
        self.workdir = workdir
        self.proc = proc
        self.url = f"redis://{HOST}:{port}/0"
        self.client = redis.Redis(host=HOST, port=port, db=0)

    def info(self, section: str) -> dict[str, Any]:
        return dict(self.client.info(section))

    def version(self) -> str:
        return str(self.info("server")["redis_version"])

    def used_memory(self) -> int:
        return int(self.info("memory")["used_memory"])

    def commands_processed(self) -> int:
        return int(self.info("stats")["total_commands_processed"])

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu_seconds(self) -> float:
        """The server's CPU time so far (user + system, every thread), from /proc."""
        return process_cpu_seconds(self.proc.pid)

    def poll_cpu_seconds(self, key: str, calls: int = 1000) -> float:
        """Server CPU one ``GET key`` costs: subtracted for the harness's own polling."""
        c0 = self.cpu_seconds()
        for _ in range(calls):
            self.client.get(key)
        return max(0.0, self.cpu_seconds() - c0) / calls

    def flush(self) -> None:
        """Empty the DB (workers must be stopped first) and drop cached scripts."""
        self.client.flushall()
        self.client.script_flush()

    def counter(self, key: str) -> int:
        raw = self.client.get(key)
        return int(raw) if raw else 0


def _wait_ready(client: redis.Redis, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {proc.returncode}")
        with contextlib.suppress(redis.ConnectionError):
            if client.ping():
                return
        time.sleep(0.05)
    raise RuntimeError("redis-server did not answer PING in time")


DURABLE = ("--appendonly", "yes", "--appendfsync", "always")  # the settings conveyor promises under


@contextlib.contextmanager
def private_redis(*extra: str, timeout: float = 10.0) -> Iterator[RedisServer]:
    """Start a server, yield it, and always stop it and remove its folder.

    :param extra: more ``redis-server`` arguments; a later one wins over the defaults
        (:data:`DURABLE` turns the append-only file on, ``"--replicaof", host, port`` makes
        a replica)
    """
    workdir = Path(tempfile.mkdtemp(prefix="bench-redis-"))
    port = free_port()
    cmd = [
        REDIS_SERVER,
        "--bind",
        HOST,
        "--port",
        str(port),
        "--dir",
        str(workdir),
        "--save",
        "",
        "--appendonly",
        "no",
        "--logfile",
        str(workdir / "redis.log"),
        *extra,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = RedisServer(port, workdir, proc)
    try:
        _wait_ready(server.client, proc, timeout)
        yield server
    finally:
        with contextlib.suppress(redis.RedisError):
            server.client.shutdown(nosave=True)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)
