"""Worker process groups: start, stop, and measure their CPU time.

Every worker command starts in a new session so the harness can signal the
whole tree a peer forks (Celery's pool, Dramatiq's processes, ...) and can
sum CPU over it from ``/proc`` without psutil.  Output goes to a log file, not
a pipe: an unread pipe blocks a chatty worker after ~64 KiB.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


class WorkerGroup:
    """A set of worker processes, each the leader of its own session."""

    def __init__(self, procs: list[subprocess.Popen[bytes]], log_path: Path) -> None:
        self.procs = procs
        self.log_path = log_path

    @property
    def sessions(self) -> set[int]:
        return {p.pid for p in self.procs}

    def alive(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(t.strip() for t in text.strip().splitlines()[-lines:])

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM every session, then SIGKILL whatever is left after *grace* s."""
        for sid in self.sessions:
            _signal_session(sid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _session_pids(self.sessions):
            for p in self.procs:
                p.poll()
            time.sleep(0.05)
        for sid in self.sessions:
            _signal_session(sid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)

    def cpu_seconds(self) -> float:
        """CPU time of every live thread in the worker sessions.

        Uses per-thread ``schedstat`` (nanoseconds) rather than ``stat``'s
        utime/stime, whose 10 ms ticks are too coarse for an idle worker.
        """
        return sum(process_cpu_seconds(pid) for pid in _session_pids(self.sessions))

    def tree_cpu_seconds(self) -> float:
        """CPU time the worker trees have used so far, counting processes that ended.

        A worker that forks a child per job, or a burst worker that exits as the
        queue empties, takes its CPU time out of :meth:`cpu_seconds`.  Here each
        process (zombies too) counts its own time plus its reaped children's
        (``utime + stime + cutime + cstime`` from ``/proc/PID/stat``), and the
        session leaders the harness has reaped count through its own
        ``RUSAGE_CHILDREN``, so the total never drops.  Clock ticks (10 ms per
        process) are fine over a drain's seconds; the harness's other children must
        not end while this is compared across a stretch.
        """
        reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
        total = reaped.ru_utime + reaped.ru_stime
        for pid in _session_pids(self.sessions, zombies=True):
            fields = _stat_fields(pid)
            if fields:
                total += sum(int(f) for f in fields[11:15]) / CLK_TCK
        return total


def start_workers(
    cmds: Sequence[list[str]], env: dict[str, str], cwd: Path, log_path: Path
) -> WorkerGroup:
    """Start each command in a fresh session, output appended to *log_path*."""
    log = log_path.open("ab")
    try:
        procs = [
            subprocess.Popen(
                cmd,
                env=env,
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            for cmd in cmds
        ]
    finally:
        log.close()
    return WorkerGroup(procs, log_path)


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the ``(comm)`` field (state is index 0)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2 :].split()


def process_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of every thread of *pid*, in seconds; 0 if it is gone."""
    total_ns = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tids:
        try:
            total_ns += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    if total_ns == 0:  # schedstat unavailable: fall back to clock ticks
        fields = _stat_fields(pid)
        return (int(fields[11]) + int(fields[12])) / CLK_TCK if fields else 0.0
    return total_ns / 1e9


def _session_pids(sessions: set[int], zombies: bool = False) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        # index 3 is the session id; zombies cost nothing more, and cannot be signalled.
        if fields and (zombies or fields[0] != "Z") and int(fields[3]) in sessions:
            pids.append(int(entry))
    return pids


def _signal_session(sid: int, sig: signal.Signals) -> None:
    for pid in _session_pids({sid}):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
