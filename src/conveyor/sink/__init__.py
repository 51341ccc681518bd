"""The analytics sink: finished jobs stream out of Redis into SQL.

Every job that finishes (succeeded, dead or cancelled) is appended by the Lua scripts to
its queue's capped ``events`` stream, once a sink has read that queue (the first read
turns the stream on, :func:`stream_events`; a deployment that runs no sink writes no
events). :class:`Sink` reads those streams with a consumer group, writes the
rows in batches through SQLAlchemy Core (an SQLite file by default, PostgreSQL or any
other database by URL) and acknowledges the events only after the commit. So:

- a database outage loses nothing: unacknowledged events stay pending in Redis and are
  written again, oldest first, once the database is back;
- replays insert nothing twice: rows are keyed by job id, attempt and finish time, and
  inserts skip rows already there;
- a sink that restarts reads its own pending events first, and takes over those another
  consumer left pending for longer than ``claim_idle`` seconds.

Events are lost only if the sink stays down long enough for a stream to pass its cap
(``limits.events_maxlen``); such gaps are logged.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis
import redis.exceptions
import sqlalchemy as sa
import sqlalchemy.exc

from .. import clients
from ..app import Conveyor
from .schema import (
    DEFAULT_TABLE,
    KEY_COLUMNS,
    add_missing_columns,
    jobs_table,
    missing_columns,
    row_from_event,
)

__all__ = ["DEFAULT_DB", "DEFAULT_TABLE", "Sink", "stream_events"]

log = logging.getLogger("conveyor.sink")
DEFAULT_DB = "sqlite:///conveyor-jobs.db"
GROUP = "conveyor-sink"
RETRY_MAX = 30.0
DB_ERRORS = (sqlalchemy.exc.DBAPIError, sqlalchemy.exc.OperationalError, OSError)
REDIS_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
Entries = list[tuple[bytes, dict[bytes, bytes] | None]]


def stream_events(app: Conveyor, queue: str) -> None:
    """Turn on ``queue``'s events stream: from now on every job of it that finishes is
    written there. A queue writes no events until a sink (or this call) turns them on, so
    a deployment without a sink pays nothing for it; once on, they stay on. Every shard
    of a sharded queue (and each shard it gets later, see :mod:`conveyor.sharding`)."""
    for shard in app.queue(queue).served():
        app.redis.set(app.keys(shard).events_on, "1")


def make_engine(url: str) -> sa.Engine:
    """An engine that notices dropped connections and does not hang on a dead server."""
    connect_args: dict[str, Any] = {}
    if url.startswith("postgresql"):
        connect_args["connect_timeout"] = 5
    elif url.startswith("sqlite"):
        connect_args["timeout"] = 30
    return sa.create_engine(url, pool_pre_ping=True, connect_args=connect_args)


class Sink:
    """Copies the events streams of ``queues`` into the table ``table`` of ``db``.

    :param app: the application whose queues are read
    :param db: SQLAlchemy URL (``sqlite:///file.db``, ``postgresql+psycopg://...``) or engine
    :param queues: queues to read (default: every known queue, re-read as new ones appear)
    :param table: table name (created when missing)
    :param group: consumer group; sinks in one group share the work
    :param consumer: this sink's name in the group (default ``host:pid``); a sink that
        restarts under the same name resumes its own pending events at once
    :param batch: most events written per transaction
    :param claim_idle: seconds after which another consumer's pending events are taken over
    """

    def __init__(
        self,
        app: Conveyor,
        db: str | sa.Engine = DEFAULT_DB,
        *,
        queues: Sequence[str] | None = None,
        table: str = DEFAULT_TABLE,
        group: str = GROUP,
        consumer: str | None = None,
        batch: int = 500,
        claim_idle: float = 60.0,
        block: float = 1.0,
    ) -> None:
        self.app = app
        self.engine = db if isinstance(db, sa.Engine) else make_engine(db)
        self.metadata = sa.MetaData()
        self.table = jobs_table(self.metadata, table)
        self.fixed_queues = list(queues) if queues else None
        self.group = group
        self.consumer = consumer or f"{socket.gethostname()}:{os.getpid()}"
        self.batch = batch
        self.claim_idle = claim_idle
        self.block = block
        self.written = 0  # events committed (rows inserted or already there)
        self.failures = 0  # consecutive failed cycles
        self._grouped: set[str] = set()
        self._marked: dict[str, float] = {}  # queue -> when its stream was last turned on
        self._table_ready = False
        self._stop = threading.Event()

    # -- setup -----------------------------------------------------------------------------

    MARK_SECONDS = 60.0  # how often a running sink turns its queues' streams on again

    def queues(self) -> list[str]:
        """The queues whose streams it reads: those it was given (with their shards), else
        every queue the namespace has seen."""
        if not self.fixed_queues:
            return self.app.known_queues()
        return [shard for queue in self.fixed_queues
                for shard in self.app.queue(queue).served()]

    def _ensure(self) -> list[str]:
        if not self._table_ready:
            self.metadata.create_all(self.engine, checkfirst=True)
            self._upgrade_table()
            self._table_ready = True
        queues = self.queues()
        now = time.monotonic()
        for queue in queues:
            # Again every so often: a Redis rolled back to before the sink first read the
            # queue (a restore, a failover to a lagging replica) lost the mark.
            if now - self._marked.get(queue, -math.inf) >= self.MARK_SECONDS:
                stream_events(self.app, queue)
                self._marked[queue] = now
            if queue in self._grouped:
                continue
            try:
                # From the stream's start: events written before the group existed (by
                # another sink's run, say) count too.
                self.app.redis.xgroup_create(self.app.keys(queue).events, self.group, id="0",
                                             mkstream=True)
            except redis.exceptions.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self._grouped.add(queue)
        return queues

    def _upgrade_table(self) -> None:
        """Add the columns a table made by an older version lacks. Two sinks starting at
        once may both try: the loser's error is ignored if the column is there after all."""
        try:
            with self.engine.begin() as conn:
                added = add_missing_columns(conn, self.table)
        except sqlalchemy.exc.DBAPIError:
            with self.engine.connect() as conn:
                if missing_columns(conn, self.table):
                    raise
            return
        if added:
            log.warning("added column(s) %s to table %s", ", ".join(added), self.table.name)

    # -- one cycle -------------------------------------------------------------------------

    def step(self, block: bool = True) -> int:
        """Write one batch: own pending events first, then stale ones of other consumers,
        then new ones (waiting up to ``block`` seconds for them). Returns events written.

        :raises sqlalchemy.exc.DBAPIError: the database failed; nothing was acknowledged
        """
        queues = self._ensure()
        for queue in queues:
            entries = self._read(queue, "0")
            if not entries:
                entries = self._claim(queue)
            if entries:
                return self._write(queue, entries)
        if clients.is_cluster(self.app.url):
            return self._step_by_queue(queues, block)
        streams = {self.app.keys(q).events: ">" for q in queues}
        if not streams:
            if block:
                self._stop.wait(self.block)
            return 0
        # One blocking read over every queue's stream (single Redis; on a Cluster the
        # queues' streams live in different slots and must be read one by one).
        replies = self.app.redis.xreadgroup(
            self.group, self.consumer, streams, count=self.batch,
            block=int(self.block * 1000) if block else None)
        written = 0
        by_stream = {self.app.keys(q).events: q for q in queues}
        for stream, entries in replies or []:
            name = stream.decode() if isinstance(stream, bytes) else stream
            written += self._write(by_stream[name], entries)
        return written

    def _step_by_queue(self, queues: list[str], block: bool) -> int:
        """New events of each queue, one read per queue: on a Cluster the streams of
        different queues live in different slots, and one read may name one slot only."""
        written = 0
        for queue in queues:
            entries = self._read(queue, ">")
            if entries:
                written += self._write(queue, entries)
        if not written and block:
            self._stop.wait(self.block)
        return written

    def _read(self, queue: str, start: str) -> Entries:
        reply = self.app.redis.xreadgroup(self.group, self.consumer,
                                          {self.app.keys(queue).events: start},
                                          count=self.batch)
        return list(reply[0][1]) if reply else []

    def _claim(self, queue: str) -> Entries:
        reply = self.app.redis.xautoclaim(self.app.keys(queue).events, self.group,
                                          self.consumer, int(self.claim_idle * 1000),
                                          count=self.batch)
        return list(reply[1]) if reply and len(reply) > 1 else []

    def _write(self, queue: str, entries: Entries) -> int:
        ids = [entry_id for entry_id, _ in entries]
        rows = []
        for entry_id, fields in entries:
            if not fields:  # trimmed from the stream while pending: nothing left to write
                log.warning("event %s of %s was trimmed before it was written", entry_id, queue)
                continue
            sid = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
            rows.append(row_from_event(queue, sid, fields))
        if rows:
            with self.engine.begin() as conn:
                self._insert_new(conn, rows)
        # Only now, after the commit: a crash before this line replays the batch, harmlessly.
        self.app.redis.xack(self.app.keys(queue).events, self.group, *ids)
        self.written += len(rows)
        return len(rows)

    def _insert_new(self, conn: sa.Connection, rows: list[dict[str, Any]]) -> None:
        dialect = conn.dialect.name
        if dialect == "postgresql":
            from sqlalchemy.dialects import postgresql

            conn.execute(postgresql.insert(self.table)
                         .on_conflict_do_nothing(index_elements=KEY_COLUMNS), rows)
            return
        if dialect == "sqlite":
            from sqlalchemy.dialects import sqlite

            conn.execute(sqlite.insert(self.table)
                         .on_conflict_do_nothing(index_elements=KEY_COLUMNS), rows)
            return
        # Other databases: skip the keys already present, inside the same transaction.
        key = [self.table.c[name] for name in KEY_COLUMNS]
        wanted = {tuple(r[name] for name in KEY_COLUMNS) for r in rows}
        present = set()
        for row in conn.execute(sa.select(*key).where(
                self.table.c.job_id.in_({k[0] for k in wanted}))):
            present.add(tuple(row))
        fresh = [r for r in rows if tuple(r[n] for n in KEY_COLUMNS) not in present]
        if fresh:
            conn.execute(sa.insert(self.table), fresh)

    # -- running ---------------------------------------------------------------------------

    def run(self, until_idle: bool = False) -> int:
        """Copy events until :meth:`stop` (or, with ``until_idle``, until none are left).
        Database and Redis outages are waited out with a capped back-off. Returns the
        number of events written."""
        self._stop.clear()
        start = self.written
        while not self._stop.is_set():
            try:
                n = self.step(block=not until_idle)
                if self.failures:
                    log.warning("sink recovered after %d failed attempt(s)", self.failures)
                self.failures = 0
            except (*DB_ERRORS, *REDIS_ERRORS) as exc:
                self.failures += 1
                pause = min(RETRY_MAX, 0.1 * 2**self.failures)
                log.warning("sink could not write (%s); nothing acknowledged, retrying in "
                            "%.1f s", str(exc).splitlines()[0], pause)
                self._stop.wait(pause)
                continue
            if until_idle and n == 0:
                break
        return self.written - start

    def stop(self) -> None:
        """Ask :meth:`run` to return after the current batch (any thread)."""
        self._stop.set()

    def lag(self) -> dict[str, int]:
        """Events not yet written per queue: pending in the group plus not yet read."""
        out = {}
        for queue in self.queues():
            try:
                groups = self.app.redis.xinfo_groups(self.app.keys(queue).events)
            except redis.exceptions.ResponseError:
                continue
            for g in groups:
                if g["name"] in (self.group, self.group.encode()):
                    out[queue] = int(g.get("pending") or 0) + int(g.get("lag") or 0)
        return out

    def close(self) -> None:
        self.engine.dispose()

