"""The worker processes of a chaos run, started through the ``conveyor worker`` command as
an operator starts them, with their output in files.

A *slot* is one such command: either a single worker process (``conveyor worker``), which
the run restarts at once when it dies, or a supervisor (``conveyor worker -p N``), which
replaces its own children. Faults are aimed at worker processes: a plain slot's process or
a supervisor's children, never the supervisor itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["APP_SPEC", "Fleet", "Slot", "conveyor_command", "process_age"]

APP_SPEC = "conveyor.chaos.tasks:app"
CHILD_MARK = b"conveyor.fleet.child"
GRACE = 10.0  # --grace: far longer than a work job, so a drain never interrupts one


def conveyor_command() -> list[str]:
    """The ``conveyor`` console script beside this interpreter, else ``python -m``."""
    script = Path(sys.executable).with_name("conveyor")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "conveyor"]


def process_age(pid: int) -> float | None:
    """Seconds since ``pid`` started (from /proc), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return uptime - int(stat[19]) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    try:
        found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    out = []
    for child in found:
        with contextlib.suppress(OSError):
            # Only worker children: multiprocessing may start a helper process too.
            if CHILD_MARK in Path(f"/proc/{child}/cmdline").read_bytes():
                out.append(int(child))
    return out


class Slot:
    """One ``conveyor worker`` command.

    :param name: label (log file names)
    :param folder: where its output goes, one file per start
    :param env: its environment (servers, namespace)
    :param concurrency: ``-c``
    :param processes: ``-p`` (None: a single unsupervised worker process)
    """

    def __init__(self, name: str, folder: Path, env: dict[str, str], concurrency: int,
                 processes: int | None) -> None:
        self.name = name
        self.folder = folder
        self.env = env
        self.concurrency = concurrency
        self.processes = processes
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        args = [*conveyor_command(), "-v", "worker", APP_SPEC, "-c", str(self.concurrency),
                "--grace", str(GRACE)]
        if self.processes is not None:
            args += ["-p", str(self.processes)]
        with open(self.folder / f"{self.name}-{self.starts}.log", "wb") as out:
            self.process = subprocess.Popen(args, env=self.env, cwd=self.folder, stdout=out,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def capacity(self) -> int:
        """Jobs its worker processes can hold at once, all together."""
        return self.concurrency * (self.processes or 1)

    def worker_pids(self) -> list[int]:
        """Its live worker processes (a supervisor's children, or its own process)."""
        if not self.alive():
            return []
        assert self.process is not None
        if self.processes is None:
            return [self.process.pid]
        return _children(self.process.pid)

    def terminate(self) -> None:
        """SIGCONT its workers (a paused one cannot act on SIGTERM), then one SIGTERM: a
        graceful stop (a second signal would stop at once)."""
        if not self.alive():
            return
        assert self.process is not None
        for pid in self.worker_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int | None:
        """Wait for the exit (else SIGKILL); the exit code."""
        if self.process is None:
            return None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        return self.process.returncode

    def kill(self) -> None:
        if self.process is None:
            return
        pids = self.worker_pids()
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(10)


class Fleet:
    """The slots of a run; restarts single-process slots that die (what a process manager
    such as systemd or Kubernetes does)."""

    def __init__(self, slots: list[Slot]) -> None:
        self.slots = slots
        self.restarts = 0

    @property
    def capacity(self) -> int:
        return sum(s.capacity for s in self.slots)

    @property
    def largest(self) -> int:
        """Most jobs one worker process holds at once."""
        return max(s.concurrency for s in self.slots)

    def start(self) -> None:
        for slot in self.slots:
            slot.start()

    def revive(self) -> int:
        revived = 0
        for slot in self.slots:
            if not slot.alive():
                slot.start()
                revived += 1
        self.restarts += revived
        return revived

    def victims(self, min_age: float) -> list[int]:
        """Worker processes that have been up at least ``min_age`` seconds (killing one
        still importing tests nothing)."""
        pids = [pid for slot in self.slots for pid in slot.worker_pids()]
        return [pid for pid in pids if (process_age(pid) or 0.0) >= min_age]

    def stop(self) -> None:
        """Stop every slot gracefully, together; kill what outlives the grace period."""
        deadline = time.monotonic() + GRACE + 10
        for slot in self.slots:
            slot.terminate()
        for slot in self.slots:
            slot.wait(max(0.5, deadline - time.monotonic()))

    def kill(self) -> None:
        for slot in self.slots:
            if slot.alive():
                slot.kill()
