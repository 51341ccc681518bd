"""Worker processes of the ledger app, and the kill -9 storm the fault tests and
``python -m bench.faults`` run against them.

Workers are real processes started through the console script, as an operator would run
them; their output goes to files (a pipe nobody reads would block them).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .ledger import LedgerApp

ROOT = Path(__file__).resolve().parents[2]
APP_SPEC = "apps.ledger:app"


def worker_env(url: str, namespace: str) -> dict[str, str]:
    """The environment of a worker process: conveyor and the test apps importable, and
    the ledger app pointed at ``url`` / ``namespace``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(ROOT / "src"), str(ROOT / "tests"), env.get("PYTHONPATH", "")] if p)
    env["CONVEYOR_REDIS_URL"] = url
    env["LEDGER_NAMESPACE"] = namespace
    env["PYTHONUNBUFFERED"] = "1"
    return env


def conveyor_command() -> list[str]:
    script = Path(sys.executable).with_name("conveyor")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from conveyor.cli import main; main()"]


class WorkerProcess:
    """One ``conveyor worker`` process of the ledger app, restartable in place.

    :param ledger: the app whose Redis URL and namespace the worker uses
    :param log_dir: folder for the output of each start (one file per start)
    :param name: label of this slot (file names)
    :param concurrency: ``-c``
    :param grace: ``--grace`` (seconds running jobs get after SIGTERM)
    """

    def __init__(self, ledger: LedgerApp, log_dir: Path, name: str, concurrency: int,
                 grace: float = 10.0) -> None:
        self.ledger = ledger
        self.log_dir = log_dir
        self.name = name
        self.concurrency = concurrency
        self.grace = grace
        self.starts = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self.started_at = 0.0  # time.monotonic() of the last start

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> WorkerProcess:
        self.starts += 1
        self.started_at = time.monotonic()
        self.log_path = self.log_dir / f"{self.name}-{self.starts}.log"
        args = [*conveyor_command(), "-v", "worker", APP_SPEC, "-c", str(self.concurrency),
                "--grace", str(self.grace)]
        with open(self.log_path, "wb") as out:
            self.process = subprocess.Popen(
                args, env=worker_env(self.ledger.app.url, self.ledger.namespace), cwd=ROOT,
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def serving(self) -> bool:
        """True once this start has logged its banner: connected, serving its queues."""
        return " ready: redis " in self.log()

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the process has used so far."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.alive():
            self.signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(10)

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM, wait for a clean exit (else SIGKILL); the exit code."""
        if self.process is None:
            return None
        if self.alive():
            self.signal(signal.SIGCONT)  # a paused worker cannot act on SIGTERM
            self.signal(signal.SIGTERM)
            try:
                return self.process.wait(self.grace + 10 if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode


class Fleet:
    """Several worker processes; restarts any that die on their own (a supervisor's job)."""

    def __init__(self, ledger: LedgerApp, log_dir: Path, size: int, concurrency: int,
                 grace: float = 10.0) -> None:
        self.workers = [WorkerProcess(ledger, log_dir, f"w{i}", concurrency, grace)
                        for i in range(size)]
        self.deaths = 0  # exits nobody asked for (e.g. a poison job)

    def start(self) -> Fleet:
        for worker in self.workers:
            worker.start()
        return self

    def revive(self) -> int:
        """Restart workers that exited; how many were restarted."""
        revived = 0
        for worker in self.workers:
            if not worker.alive():
                worker.start()
                revived += 1
        self.deaths += revived
        return revived

    def stop(self) -> list[int | None]:
        return [worker.stop() for worker in self.workers]

    def logs(self) -> str:
        parts = []
        for worker in self.workers:
            for path in sorted(worker.log_dir.glob(f"{worker.name}-*.log")):
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)


@dataclasses.dataclass
class Storm:
    kills: int = 0  # SIGKILLs sent
    kills_during_work: int = 0  # ... while some job was still unfinished
    seconds: float = 0.0
    killed_pids: list[int] = dataclasses.field(default_factory=list)

    def kills_of_working(self, ledger: LedgerApp) -> int:
        """Kills of processes that had started at least one job (the ledger says which)."""
        ran = {pid for _, pid in ledger.runs()}
        return sum(pid in ran for pid in self.killed_pids)


def kill_storm(fleet: Fleet, seconds: float, interval: float,
               work_left: Callable[[], bool], min_kills: int = 0,
               max_seconds: float | None = None) -> Storm:
    """SIGKILL one worker every ``interval`` seconds for ``seconds`` and restart it at once;
    go on past ``seconds`` (up to ``max_seconds``) until ``min_kills`` were sent.

    The victim is the serving worker started longest ago: killing a process that is still
    importing tests nothing, and on a loaded machine start-up can outlast the interval (a
    tick with no serving worker sends no kill). ``work_left`` says whether jobs remain.
    """
    storm = Storm()
    limit = max(seconds, max_seconds or seconds)
    began = time.monotonic()
    tick = 0
    while True:
        elapsed = time.monotonic() - began
        if elapsed >= limit or (elapsed >= seconds and storm.kills >= min_kills):
            break
        tick += 1
        # A fixed cadence, not a condition: this is the fault being injected.
        time.sleep(max(0.0, began + tick * interval - time.monotonic()))
        fleet.revive()
        serving = [w for w in fleet.workers if w.alive() and w.serving()]
        if not serving:
            continue
        victim = min(serving, key=lambda w: w.started_at)
        busy = work_left()
        storm.killed_pids.append(victim.pid)
        victim.kill()
        storm.kills += 1
        storm.kills_during_work += busy
        victim.start()
    storm.seconds = time.monotonic() - began
    return storm
