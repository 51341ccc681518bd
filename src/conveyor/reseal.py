"""Re-encrypting a queue's stored jobs under the current key (``conveyor reseal QUEUE``).

A key rotation adds the new key as ``current`` and keeps the old one listed; this moves
every sealed value of the queue's job records (arguments, results, step values, and the
copy of a child's result a suspended parent holds) under the current key, so that the
old key can then be dropped. Records are visited by a ``SCAN`` of the queue's job keys
(queued, scheduled, running, suspended, dead and finished alike), and each is rewritten
under ``WATCH``: a record a worker or producer changed between the read and the write is
read again, never overwritten with what it held before; so is a record whose rewrite got
no reply (redis-py raises ``WatchError`` for a watched connection that failed; the next
read tells whether it was applied). A run cut short is safe to run again: values already
under the current key are left alone."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from . import keys as keyspace
from .encryption import Unsealable, is_sealed, unwrap
from .errors import ConfigurationError
from .record import ARGS, TASK

if TYPE_CHECKING:
    from .app import Conveyor

__all__ = ["ResealReport", "reseal"]

SCAN_COUNT = 500
TRIES = 10  # rewrites of one record raced by others before it is reported as skipped


@dataclass
class ResealReport:
    """What a reseal did: records read, records rewritten, and the jobs whose sealed
    values could not be opened here (with why) or kept changing under it."""

    records: int = 0
    resealed: int = 0
    unreadable: dict[str, str] = field(default_factory=dict)
    busy: list[str] = field(default_factory=list)


def _part(name: bytes) -> str | None:
    """The sealed part a record field holds, as it was bound (None: never sealed)."""
    if name == ARGS.encode():
        return "args"
    if name == b"result":
        return "result"
    if name.startswith(b"step:"):
        return name.decode(errors="replace")
    return None


def _changes(app: Conveyor, record: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """The fields of ``record`` sealed under another key than the current one, sealed
    again under it.

    :raises Unsealable: one does not open here
    """
    encryption = app.encryption
    assert encryption is not None
    task = record.get(TASK.encode(), b"").decode(errors="replace")
    out = {}
    for name, value in record.items():
        part = _part(name)
        if part is not None and is_sealed(value):
            again = encryption.reseal(value, task, part)
            if again is not None:
                out[name] = again
        elif name.startswith(b"w:") and value[:1] == b"o" and is_sealed(value[1:]):
            again = _child_result(app, value[1:])
            if again is not None:
                out[name] = b"o" + again
    return out


def _child_result(app: Conveyor, sealed: bytes) -> bytes | None:
    """A suspended job's copy of its child's sealed result (``ctx.child``), sealed again
    under the current key; the child's task is read from the child's record.

    :raises Unsealable: it does not open here, or the child's record is gone
    """
    encryption = app.encryption
    assert encryption is not None
    header = unwrap(sealed)
    if header.key_id == encryption.current:
        return None
    child = header.bound
    queue, short_id = keyspace.split_job_id(child)
    task = app.redis.hget(app.keys(queue).job(short_id), TASK)
    if task is None:
        raise Unsealable(f"the result of child {child} it holds cannot be resealed: the"
                         " child's record is gone")
    return encryption.reseal(sealed, task.decode(errors="replace"), "result")


def _one(app: Conveyor, key: str, report: ResealReport) -> None:
    for _ in range(TRIES):
        with app.redis.pipeline() as pipe:
            try:
                pipe.watch(key)
                record = pipe.hgetall(key)
                if not record:
                    return  # gone meanwhile (finished and expired, purged)
                changes = _changes(app, record)
                if not changes:
                    return
                pipe.multi()
                pipe.hset(key, mapping=changes)
                pipe.execute()
                report.resealed += 1
                return
            except redis.WatchError:
                continue  # changed under us: read it again
    report.busy.append(key)


def reseal(app: Conveyor, queue: str, on_record: Callable[[int], Any] | None = None
           ) -> ResealReport:
    """Seal every sealed value of ``queue``'s job records under the current key (every
    shard's, for a sharded queue).

    :param on_record: called with the number of records read so far (a progress bar)
    :raises ConfigurationError: the app has no encryption keys
    """
    if app.encryption is None:
        raise ConfigurationError("reseal needs the app's encryption keys (--app MODULE:APP"
                                 " of an app made with encryption=...)")
    report = ResealReport()
    for shard in app.queue(queue).served():
        prefix = app.keys(shard).job("")
        for raw in app.redis.scan_iter(match=_glob_escape(prefix) + "*", count=SCAN_COUNT):
            key = raw.decode() if isinstance(raw, bytes) else str(raw)
            if ":" in key[len(prefix):]:
                continue  # a key under the record's name (none today), not a record
            report.records += 1
            try:
                _one(app, key, report)
            except Unsealable as exc:
                report.unreadable[keyspace.job_id(shard, key[len(prefix):])
                                  if shard != queue else key[len(prefix):]] = str(exc)
            if on_record is not None:
                on_record(report.records)
    return report


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
