"""One supervised worker process: runs a :class:`~conveyor.worker.Worker` and reports to
its parent over a pipe twice a second (jobs in hand, jobs done, threads stuck past their
timeout, memory; one JSON message each), so the parent decides without asking Redis.

A child is ``python -m conveyor.fleet.child FD OPTIONS``: a fresh interpreter that
imports only conveyor and the application (by its ``MODULE:APP`` spec), and that anyone
can recognise in a process list.

The child leaves the terminal's process group: a Ctrl-C reaches only the parent, which
relays it once, so the children drain instead of seeing two signals and stopping at
once. A child whose parent died stops gracefully by itself.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from .. import logs
from ..loading import import_app
from ..worker.registry import SUPERVISOR_ENV

if TYPE_CHECKING:
    from ..worker import Worker

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_RECYCLE", "Child", "ChildOptions", "describe_exit",
           "main"]

log = logging.getLogger("conveyor.supervisor")
REPORT_SECONDS = 0.5
EXIT_OK = 0  # stopped when asked, or a burst found nothing left to do
EXIT_FAILED = 1  # could not start, or the worker crashed
EXIT_RECYCLE = 3  # ran its --max-jobs-per-child jobs


@dataclass(frozen=True, slots=True)
class ChildOptions:
    """What a child needs to build its worker (passed as JSON on its command line)."""

    app_spec: str
    queues: tuple[str, ...]
    concurrency: int
    grace: float
    burst: bool
    max_jobs: int | None
    supervisor_id: str
    verbose: int = 0  # -v count of the command, for the same log lines as one worker
    log_format: str = "text"


@dataclass(eq=False)
class Child:
    """The supervisor's handle on one child process."""

    number: int
    process: subprocess.Popen[bytes]
    conn: Connection
    started: float
    report: dict[str, Any] = field(default_factory=dict)
    retiring: str | None = None  # why it was asked to drain
    terms: int = 0  # SIGTERMs sent
    kill_at: float | None = None
    counted: int = 0  # jobs of its reports already added to the supervisor's total

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    def start(cls, number: int, options: ChildOptions, now: float) -> Child:
        """Start a child process; its reports arrive on the returned handle's ``conn``."""
        read_fd, write_fd = os.pipe()
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "conveyor.fleet.child", str(write_fd),
                 json.dumps(dataclasses.asdict(options))],
                pass_fds=(write_fd,), stdin=subprocess.DEVNULL, process_group=0)
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        return cls(number, process, Connection(read_fd, writable=False), now)

    def read(self) -> None:
        """Take in every report waiting on the pipe (the latest wins)."""
        try:
            while self.conn.poll():
                self.report = json.loads(self.conn.recv_bytes())
        except (EOFError, OSError, ValueError):
            pass

    @property
    def jobs(self) -> int:
        return int(self.report.get("jobs", 0))


def rss_bytes() -> int:
    """Resident memory of this process now (peak when /proc is not available)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def report(worker: Worker | None, final: bool = False) -> dict[str, Any]:
    """The status sent to the parent (plain types: it crosses a pipe)."""
    executor = getattr(worker, "executor", None)
    return {
        "pid": os.getpid(),
        "worker_id": worker.id if worker else None,
        "jobs": len(worker.held) if worker else 0,
        "processed": worker.processed if worker else 0,
        "stuck": dict(executor.stuck) if executor is not None else {},
        "rss": rss_bytes(),
        "final": final,
    }


class Reporter(threading.Thread):
    """Sends reports until stopped; stops the worker when the parent is gone."""

    def __init__(self, worker: Worker, conn: Connection) -> None:
        super().__init__(name="conveyor-report", daemon=True)
        self.worker = worker
        self.conn = conn
        self.parent = os.getppid()
        self.lock = threading.Lock()
        self.done = threading.Event()

    def send(self, message: dict[str, Any]) -> bool:
        with self.lock:
            try:
                self.conn.send_bytes(json.dumps(message).encode())
                return True
            except (OSError, ValueError):
                return False

    def run(self) -> None:
        while not self.done.wait(REPORT_SECONDS):
            if os.getppid() != self.parent or not self.send(report(self.worker)):
                log.warning("the supervisor is gone: stopping gracefully")
                self.worker.stop()
                return


def main(options: ChildOptions, conn: Connection) -> None:
    """Run the child's worker (never returns: exits with an ``EXIT_*`` code)."""
    os.environ[SUPERVISOR_ENV] = options.supervisor_id
    logs.configure(options.verbose, options.log_format, worker=True, child=True)
    code = EXIT_FAILED
    worker: Worker | None = None
    reporter: Reporter | None = None
    try:
        app = import_app(options.app_spec)
        logs.OUTAGES.url = app.url
        # supervised: the supervisor replaces this process if a job gets stuck
        worker = app.worker(queues=list(options.queues) or None,
                            concurrency=options.concurrency, grace=options.grace,
                            max_jobs=options.max_jobs, supervised=True)
        reporter = Reporter(worker, conn)
        reporter.start()
        worker.run(burst=options.burst)
        limit = options.max_jobs
        code = EXIT_RECYCLE if limit is not None and worker.processed >= limit else EXIT_OK
    except Exception:
        log.exception("worker process failed")
    finally:
        if reporter is not None:
            reporter.done.set()
            reporter.send(report(worker, final=True))
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        # Leave at once: a thread stuck in a task that overran its timeout would
        # otherwise keep the interpreter from exiting (its outcome is already recorded).
        os._exit(code)


def describe_exit(code: int) -> str:
    """'exit code 1' / 'killed by SIGKILL' for a return code (negative: killed by that
    signal)."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


if __name__ == "__main__":
    main(ChildOptions(**json.loads(sys.argv[2])),
         Connection(int(sys.argv[1]), readable=False))
