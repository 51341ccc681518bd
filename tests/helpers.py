"""Shared test helpers: private redis-server processes, bounded waiting, worker threads."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import conveyor

# CONVEYOR_REDIS_SERVER names another server binary (the engine matrix, `make engine-matrix`).
REDIS_SERVER = (os.environ.get("CONVEYOR_REDIS_SERVER") or shutil.which("redis-server")
                or "/usr/bin/redis-server")


T = TypeVar("T")


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


def record_field(app: conveyor.Conveyor, job_id: str, field: str) -> bytes | None:
    """One field of a job's record, read as stored."""
    queue, short = job_id.split("~", 1)
    value: bytes | None = app.redis.hget(app.keys(queue).job_prefix + short, field)
    return value


def start_told(app: conveyor.Conveyor, job_id: str) -> bool:
    """Whether the worker holding ``job_id`` told Redis that its run began (heartbeat.lua):
    from then on, a lost lease of the job is charged an attempt."""
    queue, short = job_id.split("~", 1)
    token, told = app.redis.hmget(app.keys(queue).job_prefix + short, "token", "rs")
    return bool(token) and token == told


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


def run_async(app: conveyor.Conveyor, main: Awaitable[T]) -> T:
    """``asyncio.run(main)``, closing ``app``'s asyncio client of that loop before the loop
    ends: the app keeps a client per event loop, and one left open leaves its sockets to the
    garbage collector (a ResourceWarning, which this suite counts as an error)."""

    async def closing() -> T:
        try:
            return await main
        finally:
            await app.aclose()

    return asyncio.run(closing())


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
        assert not thread.is_alive(), f"worker did not stop:\n{where_stuck(worker, thread)}"
        if errors:
            raise errors[0]


def where_stuck(worker: conveyor.Worker, thread: threading.Thread) -> str:
    """The stuck worker's thread stack and its loop's unfinished tasks, for a failure
    message that says where it hangs."""
    import asyncio
    import sys
    import traceback

    lines = ["worker thread:"]
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is not None:
        lines += traceback.format_stack(frame)
    loop = worker._loop
    if loop is not None and not loop.is_closed():
        for task in asyncio.all_tasks(loop):
            lines.append(f"task {task.get_name()} {task.get_coro()!r}:")
            for f in task.get_stack():
                lines += traceback.format_stack(f, limit=1)
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def within_one_bucket(app: conveyor.Conveyor, read: Callable[[], Any]) -> Any:
    """``read()`` done within one metric bucket of the server clock (so every reader's
    window holds the same buckets); retried when a bucket boundary fell inside."""
    from conveyor.clock import server_now

    width = app.limits.bucket_seconds
    for _ in range(5):
        before = server_now(app.redis) // width
        out = read()
        if server_now(app.redis) // width == before:
            return out
    raise AssertionError("never read within one bucket")


def scrape(registry: Any) -> dict[str, float]:
    """A Prometheus registry's samples as {name with labels: value}."""
    from prometheus_client import generate_latest

    out = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def stop_processes(procs: list[subprocess.Popen[Any]], grace: float = 20.0) -> None:
    """SIGTERM every process still running, then wait for each (killed past ``grace``)."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def env_with_src() -> dict[str, str]:
    env = dict(os.environ)
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root / "src"), str(root / "tests"),
                                         env.get("PYTHONPATH", "")])
    return env


class ModuleServer:
    """A redis-server private to one test module, for code that gets no fixtures: a
    hypothesis state machine is built by hypothesis, so it reads the server from a module
    global. Declare ``SERVER = ModuleServer()`` and ``_server = SERVER.fixture()`` at
    module level; the server runs while the module's tests do."""

    def __init__(self) -> None:
        self.server: RedisServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None, "the module's server runs only during its tests"
        return self.server.url

    def fixture(self) -> Any:
        @pytest.fixture(scope="module", autouse=True)
        def private_server() -> Iterator[RedisServer]:
            self.server = RedisServer().start()
            try:
                yield self.server
            finally:
                self.server.cleanup()
                self.server = None

        return private_server


CONVEYOR = str(Path(sys.executable).with_name("conveyor"))
TESTS = Path(__file__).parent


class WorkerProcesses:
    """``conveyor worker <target> <args>`` processes run from the tests folder, each
    one's output in a file of ``tmp``. The test application reads its namespace from the
    environment variable ``namespace_var``."""

    def __init__(self, app: conveyor.Conveyor, tmp: Path, target: str, namespace_var: str,
                 args: tuple[str, ...] = ()) -> None:
        self.app, self.tmp, self.target, self.args = app, tmp, target, args
        self.env = env_with_src() | {"CONVEYOR_REDIS_URL": app.url,
                                     namespace_var: app.namespace}
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        with (self.tmp / f"worker-{len(self.procs)}.log").open("wb") as log:
            proc = subprocess.Popen([CONVEYOR, "worker", self.target, *self.args],
                                    env=self.env, cwd=TESTS, stdout=log,
                                    stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return (self.tmp / f"worker-{self.procs.index(proc)}.log").read_text(errors="replace")

    def logs(self) -> str:
        """The end of every worker's output, for a failure message."""
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.tmp.glob("worker-*.log")))

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a stopped worker cannot act on SIGTERM
        stop_processes(self.procs)


REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free and valid too."""
    while True:
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


class RedisCluster:
    """A private 3-primary Redis Cluster: one redis-server per node, each on a free port
    in its own folder, joined with ``redis-cli --cluster create``.

    With ``tls`` (a :class:`tls_helpers.Certificates`) every node listens only for TLS and
    requires a client certificate, the cluster bus too (``--tls-cluster yes``), and
    :attr:`url` is ``rediss+cluster://`` with the certificates in its query.
    """

    def __init__(self, primaries: int = 3, tls: Any = None) -> None:
        self.tls = tls
        self.nodes: list[RedisServer] = []
        for _ in range(primaries):
            extra = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                     "--cluster-node-timeout", "5000"]
            if tls is None:
                node = RedisServer(extra=extra)
            else:
                from tls_helpers import TLSRedisServer

                node = TLSRedisServer(tls, require_client_cert=True,
                                      extra=[*extra, "--tls-cluster", "yes"])
            node.port = _cluster_port()
            self.nodes.append(node)

    @property
    def url(self) -> str:
        """A conveyor URL naming the first node as the startup node."""
        if self.tls is not None:
            return f"rediss+cluster://127.0.0.1:{self.nodes[0].port}/0{self.tls.query()}"
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}/0"

    def start(self) -> RedisCluster:
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        tls = self.tls.cli_args() if self.tls is not None else []
        subprocess.run([REDIS_CLI, *tls, "--cluster", "create", *addresses, "--cluster-replicas",
                        "0", "--cluster-yes"], check=True, capture_output=True, timeout=30)

        def ready() -> bool:
            for node in self.nodes:
                client = node.client()
                try:
                    info = client.execute_command("CLUSTER INFO")  # parsed into a dict
                finally:
                    client.close()
                if info.get("cluster_state") != "ok":
                    return False
            return True

        wait_until(ready, 20, interval=0.1, message="cluster_state:ok on every node")
        return self

    def node_of(self, key: str) -> int:
        """The port of the primary that owns ``key``'s slot (CLUSTER KEYSLOT + CLUSTER
        SLOTS, asked of the servers themselves)."""
        client = self.nodes[0].client()
        try:
            slot = int(client.execute_command("CLUSTER KEYSLOT", key))
            for start, end, primary, *_ in client.execute_command("CLUSTER SLOTS"):
                if int(start) <= slot <= int(end):
                    return int(primary[1])
        finally:
            client.close()
        raise AssertionError(f"no node owns the slot of {key!r}")

    def commands_processed(self) -> int:
        """``total_commands_processed`` summed over the nodes."""
        total = 0
        for node in self.nodes:
            client = node.client()
            try:
                total += int(client.info("stats")["total_commands_processed"])
            finally:
                client.close()
        return total

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()


class FlowFleet:
    """``conveyor worker apps.flow_app:app`` processes of one app (its URL and namespace
    reach them through the environment); each one's output goes to a file in ``tmp``."""

    def __init__(self, app: conveyor.Conveyor, tmp: Path) -> None:
        self.app, self.tmp = app, tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, n: int, concurrency: int = 8) -> None:
        env = env_with_src() | {"CONVEYOR_REDIS_URL": self.app.url,
                                "FLOW_NAMESPACE": self.app.namespace}
        conveyor_cli = str(Path(sys.executable).with_name("conveyor"))
        alive = self.alive() + n
        for _ in range(n):
            log = (self.tmp / f"worker-{len(self.procs)}.log").open("wb")
            self.procs.append(subprocess.Popen(
                [conveyor_cli, "worker", "apps.flow_app:app", "-c", str(concurrency)],
                env=env, cwd=Path(__file__).parent, stdout=log, stderr=subprocess.STDOUT))
            log.close()
        wait_until(lambda: self.app.redis.zcard(f"{self.app.namespace}:workers") >= alive,
                   timeout=30, message=f"{alive} workers registered")

    def alive(self) -> int:
        return sum(p.poll() is None for p in self.procs)

    def kill_one(self) -> None:
        """SIGKILL the oldest live worker (its registration stays until it lapses)."""
        victim = next(p for p in self.procs if p.poll() is None)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)

    def stop(self) -> None:
        stop_processes(self.procs)

