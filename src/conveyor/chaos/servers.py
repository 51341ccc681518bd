"""Private redis-server processes for a chaos run: loopback only, a free port, a folder of
their own, and (for the server the jobs live on) the settings under which conveyor
promises to lose nothing: ``appendonly yes``, ``appendfsync always``, ``noeviction``.

A server can be SIGKILLed and started again on the same port and folder, so the jobs come
back from its append-only file, as after a crash of a production Redis.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = ["CLIENT_NAME", "RedisProcess", "SingleRedis", "free_port", "redis_server_binary"]

START_TIMEOUT = 20.0  # seconds a (re)start may take, loading the append-only file included
CLIENT_NAME = "conveyor-chaos"  # the run's own connections, spared by CLIENT KILL faults


def redis_server_binary() -> str | None:
    """The server binary a run starts: ``$CONVEYOR_REDIS_SERVER`` when set (another engine,
    e.g. a Valkey build, as the engine matrix and the tests use it), else ``redis-server``.
    """
    chosen = os.environ.get("CONVEYOR_REDIS_SERVER")
    if chosen:
        return chosen if Path(chosen).exists() else None
    return shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisProcess:
    """One private redis-server.

    :param binary: path of ``redis-server``
    :param folder: its working folder (append-only file, log)
    :param durable: AOF with fsync on every write and ``noeviction`` (the jobs' server);
        otherwise no persistence (the ledger's server, which suffers no faults)

    ``replica_of`` is the port of the primary it replicates (None: it is a primary); a
    restart starts it in the role it has now, so a Sentinel set's failovers carry over.
    """

    def __init__(self, binary: str, folder: Path, durable: bool) -> None:
        self.binary = binary
        self.folder = folder
        self.durable = durable
        self.port = free_port()
        self.replica_of: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, socket_timeout: float = 10) -> redis.Redis:
        """A client for the run's own commands (named, so CLIENT KILL faults spare it)."""
        return redis.Redis(port=self.port, client_name=CLIENT_NAME,
                           socket_timeout=socket_timeout, retry=Retry(NoBackoff(), 0))

    def start(self) -> RedisProcess:
        self.folder.mkdir(parents=True, exist_ok=True)
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.folder), "--save", "", "--daemonize", "no",
                "--logfile", str(self.folder / "redis.log")]
        if self.durable:
            args += ["--appendonly", "yes", "--appendfsync", "always",
                     "--maxmemory-policy", "noeviction"]
        else:
            args += ["--appendonly", "no"]
        if self.replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(self.replica_of)]
        self.starts += 1
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        self._wait_up()
        return self

    def _wait_up(self) -> None:
        client = redis.Redis(port=self.port, socket_timeout=2, retry=Retry(NoBackoff(), 0))
        deadline = time.monotonic() + START_TIMEOUT
        try:
            while True:
                with contextlib.suppress(redis.exceptions.RedisError):
                    if client.ping():  # answers only once the append-only file is loaded
                        return
                if self.process is not None and self.process.poll() is not None:
                    raise RuntimeError(f"redis-server on port {self.port} exited; see"
                                       f" {self.folder / 'redis.log'}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} did not answer"
                                       f" within {START_TIMEOUT:g} s")
                time.sleep(0.02)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL (a crash: only what the append-only file holds survives) and reap."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(10)
        self.process = None

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()
        self.process = None


class SingleRedis:
    """The jobs' Redis as one server: what :class:`~conveyor.chaos.faults.Injector` needs
    of the jobs' Redis, as :class:`~conveyor.chaos.sentinel.SentinelSet` also offers it.

    :param binary: path of ``redis-server``
    :param folder: the run's folder
    """

    fails_over = False

    def __init__(self, binary: str, folder: Path) -> None:
        self.server = RedisProcess(binary, folder / "redis", durable=True)

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> SingleRedis:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def primary(self) -> RedisProcess:
        return self.server

    def crash(self, hold: Callable[[], float]) -> str:
        """SIGKILL the server, wait ``hold()``, start it again on its port and folder."""
        self.server.kill()
        try:
            seconds = hold()
        finally:
            self.server.start()
        return f"down {seconds:g} s"

    def failover(self) -> str | None:
        return None  # one server has no replica to promote
