"""The dead-letter set of a queue: jobs whose attempts are spent, kept for inspection.

A sharded queue (:mod:`conveyor.sharding`) has a dead-letter set on each shard; its
:class:`DeadLetters` covers them all: counts and lists across them, and requeues and
purges on each. A shard's own name (``emails~1``) stands for that shard alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import keys as keyspace
from . import sharding, untrusted
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

    def _shards(self) -> list[str]:
        """The shards that may hold the queue's dead jobs, the queue itself first."""
        if sharding.is_shard(self.queue):
            return [self.queue]
        return self.app.queue(self.queue).served()

    def __len__(self) -> int:
        with self.app.redis.pipeline(transaction=False) as pipe:
            for shard in self._shards():
                pipe.zcard(self.app.keys(shard).dead)
            return sum(int(n) for n in pipe.execute())

    def list(self, limit: int = 100, offset: int = 0) -> list[JobInfo]:
        """Up to ``limit`` dead jobs, oldest first, with their errors."""
        shards = self._shards()
        with self.app.redis.pipeline(transaction=False) as pipe:
            for shard in shards:
                pipe.zrange(self.app.keys(shard).dead, 0 if len(shards) > 1 else offset,
                            offset + limit - 1, withscores=True)
            replies = pipe.execute()
        # a member that is no id finds no record
        found = sorted(((float(score), shard, untrusted.text(m) or "")
                        for shard, members in zip(shards, replies, strict=True)
                        for m, score in members), key=lambda row: row[0])
        page = found[offset: offset + limit] if len(shards) > 1 else found
        with self.app.redis.pipeline(transaction=False) as pipe:
            for _, shard, short in page:
                pipe.hgetall(self.app.keys(shard).job(short))
            records = pipe.execute()
        return [
            JobInfo.from_record(self.app, shard, short, record)
            for (_, shard, short), record in zip(page, records, strict=True)
            if record
        ]

    def requeue(self, job_id: str | None = None) -> int:
        """Give dead jobs fresh attempts; one by id, or all when ``job_id`` is None.

        A job enqueued with a ``key`` takes its key back. One whose key another unfinished
        job took while it was dead stays dead (two unfinished jobs never share a key), as
        does one whose record cannot be requeued as it stands; neither is counted.

        :returns: the number of jobs requeued
        :raises ValueError: ``job_id`` is not a job of this queue (or of one of its shards)
        """
        if job_id is not None:
            queue, short = keyspace.split_job_id(job_id)
            if queue != self.queue and (sharding.is_shard(self.queue)
                                        or sharding.base_queue(queue) != self.queue):
                raise ValueError(f"job {job_id} belongs to queue {queue!r}, not {self.queue!r}")
            return self.app.scripts.run(calls.requeue_dead(self.app.keys(queue), [short]))
        return sum(self._requeue_all(shard) for shard in self._shards())

    def _requeue_all(self, shard: str) -> int:
        # Page through the set by rank: the jobs a batch leaves dead keep their places at
        # the front, so the next page starts after them (else a batch of them would stop
        # the walk with the rest never tried).
        k = self.app.keys(shard)
        total = kept = 0
        while raw := self.app.redis.zrange(k.dead, kept, kept + BATCH - 1):
            ids = [untrusted.text(i) or "" for i in raw]
            total += self.app.scripts.run(calls.requeue_dead(k, ids))
            kept += sum(score is not None for score in self.app.redis.zmscore(k.dead, raw))
        return total

    def purge(self) -> int:
        """Delete every dead job of the queue; the number removed."""
        total = 0
        for shard in self._shards():
            while n := self.app.scripts.run(calls.purge_dead(self.app.keys(shard), BATCH)):
                total += n
        return total
