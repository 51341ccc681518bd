"""Running ``conveyor worker apps.supervised:app`` under its supervisor in tests.

Children are recognised by what they are (``python -m conveyor.fleet.child`` processes
whose parent is the supervisor), not by how many processes exist.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from apps import supervised
from helpers import env_with_src, wait_until


def conveyor_command() -> list[str]:
    script = Path(sys.executable).with_name("conveyor")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from conveyor.cli import main; main()"]


def children_of(pid: int) -> list[int]:
    """Pids of the worker processes the process ``pid`` spawned and that are alive."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        state, ppid = fields[0], int(fields[1])
        if ppid == pid and state != "Z" and b"conveyor.fleet.child" in cmdline:
            found.append(int(entry.name))
    return sorted(found)


class SupervisorProcess:
    """A ``conveyor worker ... -p/--autoscale`` process with its output in a file.

    :param url: Redis URL
    :param namespace: key namespace of the app
    :param log_path: file receiving the supervisor's and children's output
    :param args: extra ``conveyor worker`` arguments
    """

    def __init__(self, url: str, namespace: str, log_path: Path, *args: str) -> None:
        self.url = url
        self.namespace = namespace
        self.log_path = log_path
        self.args = args
        self.process: subprocess.Popen[bytes] | None = None
        self.app = supervised.build(url, namespace)
        self.client = redis.Redis.from_url(url)

    def start(self) -> SupervisorProcess:
        env = env_with_src()
        env.update(CONVEYOR_REDIS_URL=self.url, SUPERVISED_NAMESPACE=self.namespace,
                   PYTHONUNBUFFERED="1")
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(
                [*conveyor_command(), "-v", "worker", "apps.supervised:app", "-q",
                 supervised.QUEUE, *self.args],
                env=env, stdout=out, stderr=subprocess.STDOUT, cwd=self.log_path.parent)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def children(self) -> list[int]:
        return children_of(self.pid)

    def registered_pids(self) -> set[int]:
        """Pids of the workers in the registry (live or not yet expired)."""
        members = self.client.zrange(f"{self.namespace}:workers", 0, -1)
        return {int(self.client.hget(f"{self.namespace}:worker:{m.decode()}", "pid") or 0)
                for m in members}

    def wait_children(self, n: int, timeout: float = 20.0) -> list[int]:
        """Wait until exactly ``n`` children are alive and registered as workers."""
        def ready() -> list[int] | None:
            pids = self.children()
            if len(pids) != n:
                return None
            return pids if set(pids) <= self.registered_pids() else None

        return self.wait(ready, timeout, f"{n} registered children")  # type: ignore[no-any-return]

    def wait(self, condition: Callable[[], Any], timeout: float, what: str,
             interval: float = 0.05) -> Any:
        """wait_until, with the supervisor's output in the failure message."""
        try:
            return wait_until(condition, timeout, interval=interval, message=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- supervisor output ---\n{self.log()}") from None

    def decisions(self) -> list[dict[str, Any]]:
        out = []
        for key in self.client.scan_iter(f"{self.namespace}:supervisor:*:decisions"):
            out += [json.loads(v) for v in self.client.lrange(key, 0, -1)]
        return out

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def stop(self, timeout: float = 40.0) -> int:
        """SIGTERM, wait; kill everything left if it does not exit in time."""
        if self.process is None:
            return 0
        children = self.children()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait(5)
        for pid in children:  # never leave orphans behind a failed test
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.app.close()
        self.client.close()
        return code

    def counts(self) -> dict[str, int]:
        raw = self.client.hgetall(supervised.counts_key(self.namespace))
        return {k.decode(): int(v) for k, v in raw.items()}

    def runs(self) -> list[tuple[str, int]]:
        out = []
        for item in self.client.lrange(supervised.runs_key(self.namespace), 0, -1):
            label, pid = item.decode().split()
            out.append((label, int(pid)))
        return out
