"""A plain single enqueue, sent as one MULTI of plain commands instead of a script.

``enqueue.lua`` does all an enqueue may need: delays, dedupe keys, debounce, throttles,
periodic claims, tenants' turns, a hand-off to an idle worker. A job that needs none of
these (ready now, no tenant, no key) needs only its record, its place in the queue, its
ready count, its metric and a wake-up marker: a handful of plain commands, which a
``MULTI``/``EXEC`` applies as one step, at about a quarter of the script's cost to the
Redis server. Its place is the queue's inbox (``QueueKeys.inbox``): the record's id, with
its priority when that is not the default; the next claim moves the inbox's jobs onto their
priorities' lists in order (``include/ready.lua``, ``absorb_inbox``), so a job is counted,
found by its id and cancelled like any other ready job from the moment the MULTI ran.

The MULTI cannot hand the job to an idle worker in the enqueue itself, as the script does
(``include/handoff.lua``): that takes a claim. So it also counts the queue's live waiters,
and while it finds some, this process's next single enqueues of that queue take the script
path, each sent behind a count of its own (:meth:`PlainEnqueue.probe`): an idle worker
starts a new job as soon as the enqueue returns, and once the count finds none (the
workers are busy, or gone) the cheap path is taken again. Each count is one ``ZCOUNT``
in a round trip that is made anyway.

A MULTI is not all or nothing when one of its keys has the wrong type (a key written over
by hand): Redis runs the other commands. The rule kept is the script's: a call that raises
has stored no job, and a call whose job was stored and listed returns it. So when the
inbox refused the job, what the MULTI wrote (the record, the ready count, the metric) is
taken back before the error is raised; when only the bookkeeping failed (the ready count,
the metric, the wake-up marker), the job is stored and will run: the call returns, and
the error is logged (once a minute per error), since raising would have the caller store
the job a second time.

The enqueue time on the record comes from this process's estimate of the server's clock
(:class:`~conveyor.clock.ServerClock`), renewed by a ``TIME`` inside the MULTI at most
every :data:`CLOCK_REFRESH_S` seconds; before the first estimate the script path is taken.

This module packs the MULTI and reads its replies; the runners send it (``send`` in
``_async/transport.py``, and the sync one generated from it), on a connection they keep.
"""

from __future__ import annotations

import logging
import time
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import record
from ..clock import TIME_COMMAND, ServerClock, from_reply

if TYPE_CHECKING:
    from ..keys import QueueKeys
    from .calls import JobSpec, Limits

log = logging.getLogger("conveyor.enqueue")
CLOCK_REFRESH_S = 1.0  # longest a plain enqueue trusts its clock estimate unrenewed
# A metric bucket's EXPIRE and the count of a queue's waiters ride along at most this often
# per task (bucket) and per queue: in a burst of enqueues the MULTI is two commands shorter.
EXPIRE_EVERY_S = 1.0
COUNT_EVERY_S = 0.05
_TRACE_DIGITS = frozenset("0123456789abcdefABCDEF")
HSET_AT, RPUSH_AT = 0, 1  # places in EXEC's reply of the record's write and the listing
UNDO_REPLIES = 3  # replies to Packed.undo's commands
WARN_EVERY_S = 60.0  # a bookkeeping error is logged at most this often (per error text)


@lru_cache(maxsize=1024)
def fits(spec: JobSpec) -> bool:
    """Whether jobs of ``spec`` may take the plain path: ready at once, no tenant, no key,
    and options the script would accept (the script reports bad ones by name)."""
    return (not spec.tenant and not spec.key and spec.delay_ms is None and spec.at_ms is None
            and spec.debounce_ms is None and spec.debounce_max_ms is None
            and spec.throttle_ms is None and bool(spec.task) and not spec.parent
            and not spec.expires and not spec.deadline
            and type(spec.priority) is int and 0 <= spec.priority <= 9
            and type(spec.max_attempts) is int and spec.max_attempts >= 1
            and type(spec.visibility_ms) is int and spec.visibility_ms > 0
            and (spec.trace == "" or (len(spec.trace) == 32 and set(spec.trace) <= _TRACE_DIGITS)))


def _bulk(value: str | bytes | int) -> bytes:
    data = value if isinstance(value, bytes) else str(value).encode()
    return b"$%d\r\n%b\r\n" % (len(data), data)


def _command(*parts: str | bytes | int) -> bytes:
    return b"*%d\r\n" % len(parts) + b"".join(map(_bulk, parts))


class _Shape:
    """What stays the same from one job of a task and its options to the next, encoded
    once: the record's fixed fields, the inbox entry's suffix and the fixed commands."""

    def __init__(self, k: QueueKeys, spec: JobSpec, limits: Limits) -> None:
        fixed: list[str | int] = [record.TASK, spec.task, record.STATE, "ready"]
        optional: list[str | int] = []
        if spec.priority != record.DEFAULT_PRIORITY:
            optional += [record.PRIORITY, spec.priority]
        if spec.max_attempts != record.DEFAULT_MAX_ATTEMPTS:
            optional += [record.MAX_ATTEMPTS, spec.max_attempts]
        if spec.visibility_ms != record.DEFAULT_VISIBILITY_MS:
            optional += [record.VISIBILITY_MS, spec.visibility_ms]
        if spec.trace:
            optional += ["tr", spec.trace]
        # HSET <key> t <task> s ready e <ms> [options] a <args>: 2 + 6 + options + 2 parts
        self.hset_head = b"*%d\r\n" % (10 + len(optional)) + _bulk("HSET")
        self.fields_before_e = b"".join(map(_bulk, fixed)) + _bulk(record.ENQUEUED_MS)
        self.fields_after_e = b"".join(map(_bulk, optional)) + _bulk(record.ARGS)
        self.job_prefix = k.job_prefix
        self.entry_suffix = "" if spec.priority == record.DEFAULT_PRIORITY else f"|{spec.priority}"
        self.rpush_head = b"*3\r\n" + _bulk("RPUSH") + _bulk(k.inbox)
        self.middle = _command("HINCRBY", k.counts, "ready", 1)
        self.metric = _bulk(f"{spec.task}|enqueued")
        self.metrics_prefix = k.metrics_prefix
        self.bucket_seconds = limits.bucket_seconds
        self.bucket_ttl = b"%d" % limits.bucket_ttl
        self.counts = k.counts
        self.metric_name = f"{spec.task}|enqueued"
        self.wake = _command("LPUSH", k.wake, "1") + _command("LTRIM", k.wake, 0, 0)
        self.waiters = _bulk(k.waiters)
        # The bucket this shape's MULTI last gave its lifetime (EXEC succeeded), and when
        # (monotonic). A bucket written to gets it within EXPIRE_EVERY_S of the write: one
        # that vanished (a restart) and came back by a write that skipped the EXPIRE gets
        # it from the next, or from the first script that writes one of its fields.
        self.expired: tuple[int, float] = (-1, -float("inf"))


class Packed(NamedTuple):
    """A packed MULTI: its bytes, the replies before EXEC's (MULTI's OK and the QUEUEDs),
    the places in EXEC's reply of the waiters' count and of TIME (None: not sent), and the
    shape and bucket it gave a lifetime (None: no EXPIRE sent).

    ``waiters`` names the queue's waiters key, where the count's finding is kept; the
    shape, the job's short id and the metric bucket's key say what to take back when the
    inbox refused the job (:meth:`undo`)."""

    message: bytes
    queued: int
    waiters: str
    count_at: int | None
    time_at: int | None
    expiring: tuple[_Shape, int, float] | None
    shape: _Shape
    short_id: str
    bucket: str

    def undo(self) -> bytes:
        """What takes back the writes of a MULTI whose job the inbox refused: the record,
        the ready count and the enqueued metric (the last two fail harmlessly where their
        own key was what refused, or where the MULTI's increment did not run); as many
        commands as :data:`UNDO_REPLIES`."""
        shape = self.shape
        return (_command("DEL", shape.job_prefix + self.short_id)
                + _command("HINCRBY", shape.counts, "ready", -1)
                + _command("ZINCRBY", self.bucket, -1, shape.metric_name))


class NotStored(Exception):
    """A plain MULTI whose job the inbox refused: ``error`` is Redis's, to raise once the
    MULTI's :meth:`Packed.undo` has run."""

    def __init__(self, error: ResponseError) -> None:
        super().__init__(str(error))
        self.error = error


_MULTI = _command("MULTI")
_EXEC = _command("EXEC")


class PlainEnqueue:
    """Builds the MULTI of plain single enqueues and reads its replies; one per client."""

    LIMIT = 1024  # shapes kept; then they are forgotten and made again

    def __init__(self, clock: ServerClock | None = None) -> None:
        self.clock = clock or ServerClock()
        self._shapes: dict[tuple[QueueKeys, JobSpec, Limits], _Shape] = {}
        self._renewed = -float("inf")  # monotonic time of the latest TIME read
        # waiters key -> whether the latest count found live waiters for that queue
        self._waiting: dict[str, bool] = {}
        self._counted: dict[str, float] = {}  # waiters key -> when a MULTI last counted them
        self._warned: dict[str, float] = {}  # error text -> when it was last logged

    def ready(self) -> bool:
        """Whether the clock has been read: until then, enqueues take the script path."""
        return self._renewed > -float("inf")

    def observe(self, server_s: float) -> None:
        """Set the clock estimate from a server time read just now (epoch seconds)."""
        self.clock.observe(server_s * 1000)
        self._renewed = time.monotonic()

    def pack(self, k: QueueKeys, spec: JobSpec, limits: Limits, short_id: str,
             args: bytes, now_ms: float | None = None) -> Packed:
        """The bytes to send, how many replies precede EXEC's (MULTI's and QUEUEDs), and
        where the optional replies sit in EXEC's.

        :param now_ms: the enqueue time to store (tests); default the clock's estimate
        """
        shape = self._shapes.get((k, spec, limits))
        if shape is None:
            if len(self._shapes) >= self.LIMIT:
                self._shapes.clear()
            shape = self._shapes[(k, spec, limits)] = _Shape(k, spec, limits)
        mono = time.monotonic()
        if now_ms is None:
            now_ms = self.clock.now() * 1000
        start = int(now_ms / 1000 / shape.bucket_seconds) * shape.bucket_seconds
        bucket_key = f"{shape.metrics_prefix}{start}"
        bucket = _bulk(bucket_key)
        parts = [
            _MULTI,
            shape.hset_head, _bulk(shape.job_prefix + short_id), shape.fields_before_e,
            _bulk(int(now_ms)), shape.fields_after_e, _bulk(args),
            shape.rpush_head, _bulk(short_id + shape.entry_suffix),
            shape.middle,
            b"*4\r\n$7\r\nZINCRBY\r\n", bucket, b"$1\r\n1\r\n", shape.metric,
            shape.wake,
        ]
        n = 6  # HSET RPUSH HINCRBY ZINCRBY LPUSH LTRIM
        expiring = None
        if shape.expired[0] != start or mono - shape.expired[1] >= EXPIRE_EVERY_S:
            expiring = (shape, start, mono)  # noted once EXEC has run it
            parts += [b"*3\r\n$6\r\nEXPIRE\r\n", bucket, _bulk(shape.bucket_ttl)]
            n += 1
        count_at = time_at = None
        if mono - self._counted.get(k.waiters, -float("inf")) >= COUNT_EVERY_S:
            if len(self._counted) >= self.LIMIT:
                self._counted.clear()
            self._counted[k.waiters] = mono
            parts += [b"*4\r\n$6\r\nZCOUNT\r\n", shape.waiters, _bulk(f"({int(now_ms)}"),
                      b"$4\r\n+inf\r\n"]
            count_at, n = n, n + 1
        if mono - self._renewed > CLOCK_REFRESH_S:
            parts.append(TIME_COMMAND)
            time_at, n = n, n + 1
        parts.append(_EXEC)
        return Packed(b"".join(parts), 1 + n, k.waiters, count_at, time_at, expiring, shape,
                      short_id, bucket_key)

    def parse(self, packed: Packed, replies: list[Any]) -> None:
        """Check EXEC's replies; note whether the queue has live waiters and the server
        time, when the MULTI read them.

        :raises NotStored: the inbox refused the job (take its writes back, then raise)
        """
        if isinstance(replies[RPUSH_AT], ResponseError):
            raise NotStored(replies[RPUSH_AT])
        if isinstance(replies[HSET_AT], ResponseError):
            # The new id's key holds something else: nothing of this call's to take back.
            raise replies[HSET_AT]
        for i, reply in enumerate(replies):
            # The job is stored and listed: an error now is the bookkeeping's (the count
            # of waiters is advice anyway), and raising would have the job stored twice.
            if isinstance(reply, ResponseError) and i != packed.count_at:
                self._warn(packed, reply)
        if packed.expiring is not None:
            shape, start, when = packed.expiring
            shape.expired = (start, when)
        if packed.count_at is not None:
            self.note_waiters(packed.waiters, replies[packed.count_at])
        if packed.time_at is not None:
            self.observe(from_reply(replies[packed.time_at]))

    def _warn(self, packed: Packed, error: ResponseError) -> None:
        text = str(error)
        now = time.monotonic()
        if now - self._warned.get(text, -float("inf")) < WARN_EVERY_S:
            return
        if len(self._warned) >= self.LIMIT:
            self._warned.clear()
        self._warned[text] = now
        log.warning("job %s is stored and will run, but Redis refused part of its"
                    " bookkeeping (a queue key of the wrong type?): %s", packed.short_id, text)

    def hand_off(self, k: QueueKeys) -> bool:
        """Whether the latest count found live waiters of ``k``'s queue: its next single
        enqueue should take the script, which hands the job over."""
        return self._waiting.get(k.waiters, False)

    def probe(self, k: QueueKeys) -> bytes:
        """The count of ``k``'s live waiters, packed, to send before an enqueue script."""
        return _command("ZCOUNT", k.waiters, f"({int(self.clock.now() * 1000)}", "+inf")

    def note_waiters(self, waiters: str, count: Any) -> None:
        """Keep what a count of the live waiters under key ``waiters`` found (a reply that
        is no count reads as none: a mangled key must not keep enqueues off the cheap
        path)."""
        if len(self._waiting) >= self.LIMIT:
            self._waiting.clear()
        self._waiting[waiters] = isinstance(count, int) and count > 0


KEEP_SECONDS = 1.0  # a kept connection goes back to its pool and is taken again this often
BROKEN = (RedisConnectionError, RedisTimeoutError)  # the connection is out of step: drop it
