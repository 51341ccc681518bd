"""An application whose tasks count their own executions in a Redis ledger.

Fault tests run it in real worker processes (``conveyor worker apps.ledger:app``) and then
compare what the tasks say they ran (the ledger, written by the task itself on its own
connection) with what conveyor recorded (the job records). A job that ran twice shows a
count of 2 in the ledger; a lost job shows 0.

The worker processes find Redis and the key namespace in ``$CONVEYOR_REDIS_URL`` and
``$LEDGER_NAMESPACE``; a test builds the same tasks on its own app with :func:`build`.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import time
from collections.abc import Iterable, Sequence

import redis

import conveyor

QUEUE = "ledger"
OTHER_QUEUES = ("ledger-b", "ledger-c")  # workflows whose nodes span queues
LEDGER_CLIENT_NAME = "ledger"  # fault tests spare these connections when killing clients
RECORD_VT = 1.5  # short leases so a killed worker's jobs come back quickly
POISON_RETRIES = 2
HOLD_VT = 1.0


class LedgerApp:
    """An app with the ledger tasks registered, and readers for the ledger.

    :param url: Redis URL
    :param namespace: key namespace of the app (the ledger keys share it)
    """

    def __init__(self, url: str, namespace: str) -> None:
        self.app = conveyor.Conveyor(url, namespace=namespace)
        self.namespace = namespace
        self.counts_key = f"{namespace}:ledger:counts"  # hash: job label -> runs started
        self.runs_key = f"{namespace}:ledger:runs"  # list: "<label> <pid>", in start order
        self.client = redis.Redis.from_url(url, client_name=LEDGER_CLIENT_NAME)
        task = self.app.task
        self.record = task(name="ledger.record", queue=QUEUE, retries=20,
                           visibility_timeout=RECORD_VT)(self._record)
        self.hold = task(name="ledger.hold", queue=QUEUE, retries=5,
                         visibility_timeout=HOLD_VT)(self._hold)
        self.ahold = task(name="ledger.ahold", queue=QUEUE, retries=5,
                          visibility_timeout=HOLD_VT)(self._ahold)
        self.record_on = {q: task(name=f"ledger.record@{q}", queue=q, retries=20,
                                  visibility_timeout=RECORD_VT)(self._record)
                          for q in OTHER_QUEUES}
        self.poison = task(name="ledger.poison", queue=QUEUE, retries=POISON_RETRIES,
                           visibility_timeout=HOLD_VT)(self._poison)

    # -- the tasks -------------------------------------------------------------------------

    def _note(self, label: str) -> None:
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hincrby(self.counts_key, label, 1)
            pipe.rpush(self.runs_key, f"{label} {os.getpid()}")
            pipe.execute()

    def _record(self, n: int, seconds: float = 0.0) -> int:
        """Note the run, work for ``seconds``, return ``n``."""
        self._note(str(n))
        if seconds:
            time.sleep(seconds)
        return n

    def _hold(self, label: str, seconds: float) -> int:
        """Note the run, hold the job for ``seconds``, return the pid that ran it."""
        self._note(label)
        time.sleep(seconds)
        return os.getpid()

    async def _ahold(self, label: str, seconds: float) -> int:
        """:meth:`_hold` as a coroutine (runs on the worker's loop; cancellable)."""
        self._note(label)  # a millisecond of blocking I/O on the loop: fine for a test
        await asyncio.sleep(seconds)
        return os.getpid()

    def _poison(self, label: str) -> None:
        """Note the run, then SIGKILL the worker process running it."""
        self._note(label)
        os.kill(os.getpid(), signal.SIGKILL)

    # -- reading the ledger ----------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Runs started per job label."""
        raw = self.client.hgetall(self.counts_key)
        return {_text(k): int(v) for k, v in raw.items()}

    def total_runs(self) -> int:
        return int(self.client.llen(self.runs_key))

    def runs(self) -> list[tuple[str, int]]:
        """(label, pid) of every run started, in order."""
        out = []
        for item in self.client.lrange(self.runs_key, 0, -1):
            label, pid = _text(item).rsplit(" ", 1)
            out.append((label, int(pid)))
        return out

    def states(self, jobs: Sequence[conveyor.Job]) -> list[str | None]:
        """The state field of each job record, read in one round trip."""
        with self.app.redis.pipeline(transaction=False) as pipe:
            for job in jobs:
                pipe.hget(self.app.keys(job.queue).job(job.short_id), "s")
            return [s.decode() if s is not None else None for s in pipe.execute()]

    def census(self, jobs: Sequence[conveyor.Job]) -> collections.Counter[str | None]:
        """How many of ``jobs`` are in each state (``None``: record missing)."""
        return collections.Counter(self.states(jobs))

    def all_succeeded(self, jobs: Sequence[conveyor.Job]) -> bool:
        return all(s == "succeeded" for s in self.states(jobs))

    def queue_sizes(self) -> dict[str, int]:
        """Leases, delayed jobs, dead letters and the ready count of the ledger queue."""
        k = self.app.keys(QUEUE)
        r = self.app.redis
        return {"leases": int(r.zcard(k.leases)), "delayed": int(r.zcard(k.delayed)),
                "dead": int(r.zcard(k.dead)),
                "ready": int(r.hget(k.counts, "ready") or 0)}

    def succeeded_events(self, short_ids: Iterable[str], queues: Iterable[str] = (QUEUE,)
                         ) -> collections.Counter[str]:
        """How many 'succeeded' events the queues' streams hold for each of ``short_ids``."""
        wanted = set(short_ids)
        seen: collections.Counter[str] = collections.Counter()
        for queue in queues:
            for _, fields in self.app.redis.xrange(self.app.keys(queue).events):
                short = fields[b"id"].decode()
                if short in wanted and fields[b"state"] == b"succeeded":
                    seen[short] += 1
        return seen

    def close(self) -> None:
        self.client.close()
        self.app.close()


def build(url: str, namespace: str) -> LedgerApp:
    return LedgerApp(url, namespace)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _from_env() -> conveyor.Conveyor | None:
    url = os.environ.get("CONVEYOR_REDIS_URL")
    namespace = os.environ.get("LEDGER_NAMESPACE")
    if not url or not namespace:
        return None  # imported by a test, which builds its own LedgerApp
    return build(url, namespace).app


app = _from_env()
