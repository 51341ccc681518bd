"""The tasks a chaos run executes, and the ledger they write.

Every run of a task appends entries to a ledger kept on a separate redis-server that
suffers no faults: ``"<label> <run> <pid> start <job id>"`` when the run begins and
``"<label> <run> <pid> ok <job id>"`` or ``"... raise ..."`` when it ends (a run killed with
its process writes no end). ``label`` names the job (the run enqueues each job with a label
of its own, so a job stored twice shows as one label under two job ids), ``run`` is a
random id of this run. After the run the ledger is compared with what conveyor recorded.

Worker processes import this module as ``conveyor.chaos.tasks:app`` and find the servers
in ``$CONVEYOR_REDIS_URL``, ``$CONVEYOR_CHAOS_LEDGER`` and ``$CONVEYOR_CHAOS_NAMESPACE``.

The wait task waits durably (``ctx.wait_for``) for a signal the producer sends it, then
for a child job on the side queue (``ctx.child``); a run that suspends notes ``suspend``,
and the resumed run notes ``ok`` only if it got its own signal and its own child's result
(``wrong`` otherwise).

The expiring task belongs to jobs enqueued with a short ``expires``: a run notes ``late``
instead of ``start`` when its lease was granted past the time its job had to start by
(both read from its record, on the server's clock).

The batch task takes up to 20 jobs per call (``Batch``) on the side queue, beside the plain
side jobs; each item notes its own ``start`` and ``ok`` under its job id.

The work tasks (``chaos.work`` and ``chaos.side``) are encrypted (``encrypt=True``, with a
key made from the run's namespace): every fault meets sealed arguments and results.

The poison tasks misbehave on purpose: one raises, one SIGKILLs its own process, one leaves
it with ``os._exit``, one sleeps far past its timeout. Each must end dead with a reason,
after its attempts, without holding up anything else.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from ..app import Conveyor
from ..batch import Batch, BatchItem
from ..context import current_job
from ..encryption import Encryption
from ..task import Task
from ..waits import Suspended

__all__ = ["KINDS", "LEDGER_KEY", "POISON", "QUEUE", "QUEUES", "SIDE_QUEUE", "WORK_KINDS",
           "ChaosTasks", "LedgerEntry", "parse_entry"]

QUEUE = "chaos"
# A second queue the same workers serve, with a share of the plain work jobs: the faults
# aimed at one queue's keys (overwrite) hit QUEUE only, and must not hold back this one.
SIDE_QUEUE = "chaos-side"
QUEUES = (QUEUE, SIDE_QUEUE)
LEDGER_KEY = "conveyor-chaos:ledger"
WORK_VT = 2.0  # short leases, so the jobs of a killed or paused worker come back soon
WORK_RETRIES = 60  # far more lost leases than any run inflicts on one job
POISON_VT = 2.0
POISON_RETRIES = 1  # two attempts: each kill of a worker costs a lease of every job it holds
HANG_TIMEOUT = 1.0
HANG_SECONDS = 4.0  # a sync task cannot be interrupted: its thread stays busy this long
RETRY_BACKOFF = 0.2
POISON = ("raise", "kill", "exit", "hang")
WORK_KINDS = ("work", "wait", "expiring", "batch")  # jobs that must succeed (or be cancelled)
KINDS = (*WORK_KINDS, *POISON)
SIGNAL = "go"  # the signal a wait job waits for; its payload is the job's label
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One line of the ledger: a run of the job ``label`` began or ended."""

    label: str
    run: str
    pid: int
    phase: str  # start | ok | raise | suspend | wrong | late
    job: str = ""  # the id of the job the run was for ("" in entries written without it)

    @property
    def kind(self) -> str:
        return self.label.split(":", 1)[0]


def parse_entry(raw: bytes | str) -> LedgerEntry:
    text = raw.decode() if isinstance(raw, bytes) else raw
    label, run, pid, phase, *job = text.split(" ")
    return LedgerEntry(label, run, int(pid), phase, job[0] if job and job[0] != "-" else "")


class ChaosTasks:
    """The chaos run's application and its tasks.

    :param url: the Redis the jobs live on
    :param namespace: key namespace of the run
    :param ledger_url: the Redis of the ledger (never faulted)
    """

    def __init__(self, url: str, namespace: str, ledger_url: str) -> None:
        # The run's key, the same in every process of the run (made from its namespace).
        key = hashlib.sha256(b"conveyor chaos\x00" + namespace.encode()).digest()
        self.app = Conveyor(url, namespace=namespace,
                            encryption=Encryption(keys={"chaos": key}, current="chaos"))
        self.ledger = redis.Redis.from_url(ledger_url, socket_timeout=30)
        task = self.app.task
        # The work and its side jobs are encrypted: their arguments and results are sealed
        # through every fault, and a wait job opens its child's sealed result.
        self.work = task(name="chaos.work", queue=QUEUE, retries=WORK_RETRIES,
                         backoff=RETRY_BACKOFF, visibility_timeout=WORK_VT,
                         encrypt=True)(self._work)
        self.side = task(name="chaos.side", queue=SIDE_QUEUE, retries=WORK_RETRIES,
                         backoff=RETRY_BACKOFF, visibility_timeout=WORK_VT,
                         encrypt=True)(self._work)
        self.expiring = task(name="chaos.expiring", queue=QUEUE, retries=WORK_RETRIES,
                             backoff=RETRY_BACKOFF, visibility_timeout=WORK_VT)(self._expiring)
        self.batched = task(name="chaos.batch", queue=SIDE_QUEUE, retries=WORK_RETRIES,
                            backoff=RETRY_BACKOFF, visibility_timeout=WORK_VT,
                            batch=Batch(max=20, wait=0.2))(self._batch)
        self.waits = task(name="chaos.wait", queue=QUEUE, retries=WORK_RETRIES,
                          backoff=RETRY_BACKOFF, visibility_timeout=WORK_VT)(self._wait)

        def poison(name: str, timeout: float | None = None) -> Callable[[F], Task[Any, Any]]:
            return task(name=name, queue=QUEUE, retries=POISON_RETRIES, backoff=RETRY_BACKOFF,
                        visibility_timeout=POISON_VT, timeout=timeout)

        self.raises = poison("chaos.raise")(self._raise)
        self.kills = poison("chaos.kill")(self._kill)
        self.exits = poison("chaos.exit")(self._exit)
        self.hangs = poison("chaos.hang", HANG_TIMEOUT)(self._hang)

    def by_kind(self, kind: str) -> Task[Any, Any]:
        return {"work": self.work, "wait": self.waits, "expiring": self.expiring,
                "batch": self.batched, "raise": self.raises, "kill": self.kills,
                "exit": self.exits,
                "hang": self.hangs}[kind]

    def _note(self, label: str, run: str, phase: str) -> None:
        try:
            job = current_job().id
        except RuntimeError:  # called outside a worker's run (a test calling it directly)
            job = "-"
        self.ledger.rpush(LEDGER_KEY, f"{label} {run} {os.getpid()} {phase} {job}")

    def _start(self, label: str) -> str:
        run = os.urandom(4).hex()
        self._note(label, run, "start")
        return run

    def _work(self, label: str, seconds: float) -> str:
        run = self._start(label)
        time.sleep(seconds)
        self._note(label, run, "ok")
        return label

    def _wait(self, label: str, seconds: float) -> str:
        run = self._start(label)
        ctx = current_job()
        try:
            payload = ctx.wait_for(SIGNAL)
            kid = ctx.child("kid", self.side, f"{label}/kid", seconds)
        except Suspended:
            self._note(label, run, "suspend")
            raise
        except BaseException:  # a lost lease, Redis out of reach past the lease: it ended
            self._note(label, run, "raise")
            raise
        self._note(label, run, "ok" if payload == label and kid == f"{label}/kid" else "wrong")
        return label

    def _expiring(self, label: str, seconds: float) -> str:
        ctx = current_job()
        # The lease wrote its own time (server clock) as the record's start, which the
        # run's finish replaces: read now, it says when this run was granted its lease.
        start_by, leased_at = self.app.redis.hmget(
            self.app.keys(ctx.queue).job(ctx.id.split("~", 1)[1]), "x", "started_at")
        late = (start_by is not None and leased_at is not None
                and float(leased_at) * 1000 > float(start_by))
        run = os.urandom(4).hex()
        self._note(label, run, "late" if late else "start")
        time.sleep(seconds)
        self._note(label, run, "ok")
        return label

    def _batch(self, items: list[BatchItem]) -> None:
        runs = []
        for item in items:
            run = os.urandom(4).hex()
            self.ledger.rpush(LEDGER_KEY, f"{item.args[0]} {run} {os.getpid()} start {item.id}")
            runs.append((item, run))
        time.sleep(max(float(item.args[1]) for item in items))
        for item, run in runs:
            self.ledger.rpush(LEDGER_KEY, f"{item.args[0]} {run} {os.getpid()} ok {item.id}")

    def _raise(self, label: str) -> None:
        run = self._start(label)
        self._note(label, run, "raise")
        raise RuntimeError(f"poison job {label} raises on every attempt")

    def _kill(self, label: str) -> None:
        self._start(label)
        os.kill(os.getpid(), signal.SIGKILL)

    def _exit(self, label: str) -> None:
        self._start(label)
        os._exit(17)

    def _hang(self, label: str) -> None:
        run = self._start(label)
        time.sleep(HANG_SECONDS)
        self._note(label, run, "ok")  # too late: the attempt already failed on its timeout

    def close(self) -> None:
        self.ledger.close()
        self.app.close()


def _from_env() -> Conveyor | None:
    url = os.environ.get("CONVEYOR_REDIS_URL")
    ledger = os.environ.get("CONVEYOR_CHAOS_LEDGER")
    namespace = os.environ.get("CONVEYOR_CHAOS_NAMESPACE")
    if not (url and ledger and namespace):
        return None  # imported by the chaos command itself, which builds its own
    return ChaosTasks(url, namespace, ledger).app


app = _from_env()
