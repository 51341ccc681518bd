"""The dead-letter set of a queue: jobs whose attempts are spent, kept for inspection."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import keys as keyspace
from . import untrusted
from .job import JobInfo
from .scripts import calls

if TYPE_CHECKING:
    from .app import Conveyor

BATCH = 1000


class DeadLetters:
    """List, inspect, requeue and purge the dead jobs of one queue (oldest first)."""

    def __init__(self, app: Conveyor, queue: str) -> None:
        self.app = app
        self.queue = queue
        self._keys = app.keys(queue)

    def __len__(self) -> int:
        return int(self.app.redis.zcard(self._keys.dead))

    def list(self, limit: int = 100, offset: int = 0) -> list[JobInfo]:
        """Up to ``limit`` dead jobs, oldest first, with their errors."""
        raw = self.app.redis.zrange(self._keys.dead, offset, offset + limit - 1)
        ids = [untrusted.text(i) or "" for i in raw]  # a member that is no id finds no record
        with self.app.redis.pipeline(transaction=False) as pipe:
            for short in ids:
                pipe.hgetall(self._keys.job(short))
            records = pipe.execute()
        return [
            JobInfo.from_record(self.app, self.queue, short, record)
            for short, record in zip(ids, records, strict=True)
            if record
        ]

    def requeue(self, job_id: str | None = None) -> int:
        """Give dead jobs fresh attempts; one by id, or all when ``job_id`` is None.

        A job enqueued with a ``key`` takes its key back. One whose key another unfinished
        job took while it was dead stays dead (two unfinished jobs never share a key), as
        does one whose record cannot be requeued as it stands; neither is counted.

        :returns: the number of jobs requeued
        """
        if job_id is not None:
            queue, short = keyspace.split_job_id(job_id)
            if queue != self.queue:
                raise ValueError(f"job {job_id} belongs to queue {queue!r}, not {self.queue!r}")
            return self.app.scripts.run(calls.requeue_dead(self._keys, [short]))
        # Page through the set by rank: the jobs a batch leaves dead keep their places at
        # the front, so the next page starts after them (else a batch of them would stop
        # the walk with the rest never tried).
        total = kept = 0
        while raw := self.app.redis.zrange(self._keys.dead, kept, kept + BATCH - 1):
            ids = [untrusted.text(i) or "" for i in raw]
            total += self.app.scripts.run(calls.requeue_dead(self._keys, ids))
            kept += sum(score is not None for score in self.app.redis.zmscore(self._keys.dead, raw))
        return total

    def purge(self) -> int:
        """Delete every dead job of the queue; the number removed."""
        total = 0
        while n := self.app.scripts.run(calls.purge_dead(self._keys, BATCH)):
            total += n
        return total
