"""A worker's calls: ``fetch`` (and ``register_waiter``, with the hand-off entries a waiter
pops), ``finish``, ``heartbeat`` and ``release``; the records they carry and return."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...bounds import Limits
from ...keys import QueueKeys
from .. import ScriptCall
from ..signatures import (
    Arg,
    FetchArgv,
    FinishArgv,
    FinishItem,
    HeartbeatArgv,
    HeartbeatItem,
    RegisterWaiterArgv,
    ReleaseArgv,
    ReleaseItem,
)
from .build import _call, _nonce, _now, _text


# Built once per job on a worker's hot path, so not frozen: a frozen dataclass sets each
# field through object.__setattr__, which made building one about five times dearer
# (0.77 against 0.14 us for a Leased). Treat them as values all the same: never assign a
# field (dataclasses.replace makes a changed copy); they hash and compare by value.
@dataclass(slots=True, unsafe_hash=True)
class Leased:
    """A job leased to a worker by ``fetch``.

    ``problem`` names what makes the job impossible to run when the script could not see
    it (a task name or id that is not UTF-8); the worker then dead-letters the job with it
    as the reason. Fields a script can check (numbers) are checked by the script itself.
    """

    short_id: str
    token: str
    task: str
    args: bytes
    attempts: int
    max_attempts: int
    enqueued_at: float
    run_at: float
    visibility_ms: int
    problem: str | None = None
    # The job lost a lease before its run was known to begin: this run tells Redis that it
    # begins before it does (so a job that kills its worker is charged an attempt).
    confirm: bool = False


@dataclass(frozen=True, slots=True)
class Fetched:
    """The reply of ``fetch``: server time, next due time, jobs that went dead (lost
    leases, bad records), leases, and dead letters the cap deleted meanwhile."""

    now_ms: float
    next_due_ms: float | None
    dead: list[str]
    jobs: list[Leased]
    trimmed: list[str] = field(default_factory=list)
    held: bool = False  # limits held back ready jobs (they start when a limit frees)
    offered: int = 0  # free slots the fetch registered the worker as a waiter with
    expired: list[str] = field(default_factory=list)  # jobs that ended expired meanwhile
    top: int | None = None  # the highest priority with ready jobs left (None: none, unknown)


def _float(value: Any, default: float = 0.0) -> float:
    if not value:  # absent fields come back empty: no exception on the hot path
        return default
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


# Reply fields per leased job (include/lease.lua's LEASE_FIELDS).
LEASE_FIELDS = 10


def _leased(f: Sequence[Any]) -> Leased:
    """One leased job from its reply fields; never raises (see ``Leased.problem``)."""
    short_id, token, task, args = f[0], f[1], f[2], f[3]
    if type(short_id) is bytes and type(token) is bytes and type(task) is bytes \
            and type(args) is bytes:
        try:  # the common case: one decode per text field, no bookkeeping
            enqueued_at = _float(f[6]) / 1000  # stored in ms
            return Leased(short_id.decode(), token.decode(), task.decode(), args,
                          _int(f[4], 1), _int(f[5], 1), enqueued_at,
                          _float(f[7], enqueued_at), _int(f[8], 30_000), None,
                          f[9] == b"1")
        except UnicodeDecodeError:
            pass
    return _leased_checked(f)


def _leased_checked(f: Sequence[Any]) -> Leased:
    """:func:`_leased` for a record whose text fields may not be UTF-8 (or not bytes)."""
    problem = None
    texts = []
    for name, raw in (("id", f[0]), ("token", f[1]), ("task", f[2])):
        try:
            texts.append(raw.decode() if isinstance(raw, bytes) else str(raw))
        except UnicodeDecodeError:
            problem = problem or f"corrupt record: field {name!r} is not valid UTF-8"
            texts.append(raw.decode(errors="surrogateescape"))
    args = f[3] if isinstance(f[3], bytes) else str(f[3]).encode()
    enqueued_at = _float(f[6]) / 1000  # stored in ms
    return Leased(
        short_id=texts[0], token=texts[1], task=texts[2], args=args,
        attempts=_int(f[4], 1), max_attempts=_int(f[5], 1),
        enqueued_at=enqueued_at, run_at=_float(f[7], enqueued_at),
        visibility_ms=_int(f[8], 30_000), problem=problem, confirm=f[9] in (b"1", "1"),
    )


def _parse_fetch(reply: list[Any]) -> Fetched:
    now, next_due, dead, flat, trimmed, held, expired, top = reply
    return Fetched(
        now_ms=float(now),
        next_due_ms=float(next_due) if next_due not in (b"", "") else None,
        dead=[_text(d) for d in dead],
        jobs=[_leased(flat[i:i + LEASE_FIELDS]) for i in range(0, len(flat), LEASE_FIELDS)],
        trimmed=[_text(t) for t in trimmed],
        held=bool(int(held)),
        expired=[_text(e) for e in expired],
        top=_int(top, -1) if top not in (b"", "") else None,
    )


def parse_handoff(entry: bytes) -> Fetched:
    """A hand-off list entry (include/handoff.lua): fields framed as ``<length>:<bytes>``;
    now, the soonest deadline of the jobs ('' if none, include/expiry.lua), the dead and
    the trimmed ids (each a count, then the ids), :data:`LEASE_FIELDS` fields per job.

    :raises ValueError: a mangled entry
    """
    fields: list[bytes] = []
    at = 0
    while at < len(entry):
        colon = entry.index(b":", at)
        end = colon + 1 + int(entry[at:colon])
        if end > len(entry):
            raise ValueError("hand-off entry cut short")
        fields.append(entry[colon + 1:end])
        at = end
    soonest, fields = fields[1], fields[:1] + fields[2:]
    n_dead = int(fields[1])
    dead = fields[2:2 + n_dead]
    n_trimmed = int(fields[2 + n_dead])
    flat = fields[3 + n_dead + n_trimmed:]
    if len(flat) % LEASE_FIELDS:
        raise ValueError("hand-off entry with a partial job")
    return Fetched(
        now_ms=float(fields[0]), next_due_ms=float(soonest) if soonest else None,
        dead=[_text(d) for d in dead],
        jobs=[_leased(flat[i:i + LEASE_FIELDS]) for i in range(0, len(flat), LEASE_FIELDS)],
        trimmed=[_text(t) for t in fields[3 + n_dead:3 + n_dead + n_trimmed]],
    )


def register_waiter(
    k: QueueKeys, worker: str, slots: int, ttl_ms: int, now: float | None = None
) -> ScriptCall[float]:
    """Register an idle worker as a waiter of the queue offering ``slots`` (replacing its
    registration, if any); the reply is the server time (ms). A fresh nonce per
    registration keeps the fencing tokens it is handed unique."""
    fixed = RegisterWaiterArgv(_now(now), worker, slots, _nonce(), ttl_ms)
    return _call("register_waiter", k, fixed, (), float)


def fetch(
    k: QueueKeys, count: int, limits: Limits, now: float | None = None, worker: str = "",
    waiter_ttl_ms: int = 0,
) -> ScriptCall[Fetched]:
    """Lease up to ``count`` jobs (after promotion and lease reclaim). A ``worker`` id is
    named on each leased record (``JobInfo.worker``); with ``waiter_ttl_ms`` > 0 as well,
    the worker's registration as a waiter of the queue is replaced: the slots the fetch
    left free are offered to the next enqueue (``Fetched.offered``), or none."""
    fixed = FetchArgv(_now(now), count, limits.dead_cap, limits.events_maxlen,
                      limits.bucket_seconds, limits.bucket_ttl, _nonce(), worker, waiter_ttl_ms,
                      limits.retention)
    if not worker or waiter_ttl_ms <= 0:
        return _call("fetch", k, fixed, (), _parse_fetch)

    def parse(reply: list[Any]) -> Fetched:
        fetched = _parse_fetch(reply)
        return dataclasses.replace(fetched, offered=max(0, count - len(fetched.jobs)))

    return _call("fetch", k, fixed, (), parse)


@dataclass(slots=True, unsafe_hash=True)  # per job: not frozen, see Leased
class Outcome:
    """The result of one attempt, as ``finish`` records it."""

    short_id: str
    token: str
    outcome: str  # 'ok' | 'retry' | 'dead' | 'snooze' | 'cancelled' | 'suspend'
    started_at: float
    payload: bytes | str = b""
    retry_delay_ms: int = 0  # the delay of a retry or a snooze


FINISH_REFUSED, FINISH_SUCCEEDED, FINISH_RETRYING, FINISH_DEAD = 0, 1, 2, 3
FINISH_CANCELLED, FINISH_SNOOZED = 4, 5
FINISH_EXPIRED = 8
FINISH_SUSPENDED = (6, 7)  # suspended; or ready again, its wait over before it could suspend


@dataclass(frozen=True, slots=True)
class Finished:
    """Reply of ``finish``: a code per outcome, dead letters trimmed by the cap, and how
    many of the jobs that ended are workflow nodes waiting for their hand-over."""

    codes: list[int]
    trimmed: list[str]
    handed_over: int = 0


def _parse_finish(reply: list[Any]) -> Finished:
    handed = int(reply[2]) if len(reply) > 2 else 0
    return Finished([int(c) for c in reply[0]], [_text(t) for t in reply[1]], handed)


def finish(
    k: QueueKeys, outcomes: Sequence[Outcome], limits: Limits, now: float | None = None
) -> ScriptCall[Finished]:
    """Record ``outcomes``; only current fencing tokens are accepted."""
    fixed = FinishArgv(_now(now), limits.retention, limits.dead_cap, limits.events_maxlen,
                       limits.bucket_seconds, limits.bucket_ttl, limits.snooze_cap,
                       len(outcomes))
    rest: list[Arg] = []
    for o in outcomes:
        rest.extend(FinishItem(o.short_id, o.token, o.outcome, f"{o.started_at:.6f}",
                               o.payload, o.retry_delay_ms))
    return _call("finish", k, fixed, rest, _parse_finish)


BEAT_LOST, BEAT_KEPT, BEAT_CANCEL = 0, 1, 2


# What a heartbeat tells of a lease's run (heartbeat.lua): nothing, that it began, or
# that it goes on from an earlier lease whose start was told (this lease costs no attempt).
STARTED, CONTINUED = "1", "2"


def heartbeat(
    k: QueueKeys, leases: Sequence[tuple[str, str, int] | tuple[str, str, int, bool | str]],
    now: float | None = None
) -> ScriptCall[list[int]]:
    """Extend leases given as (short id, token, extend_ms[, started]); per lease
    :data:`BEAT_KEPT`, :data:`BEAT_LOST`, or :data:`BEAT_CANCEL` (kept, and the job is to
    be cancelled). ``started``: True (or :data:`STARTED`) once the lease's run has begun,
    :data:`CONTINUED` when it goes on from an earlier lease's (see heartbeat.lua)."""
    rest: list[Arg] = []
    for lease in leases:
        told = lease[3] if len(lease) > 3 else ""
        started = STARTED if told is True else (told or "")
        rest.extend(HeartbeatItem(lease[0], lease[1], lease[2], started))
    return _call("heartbeat", k, HeartbeatArgv(_now(now), len(leases)), rest,
                 lambda r: [int(c) for c in r])


def release(
    k: QueueKeys, jobs: Sequence[tuple[str, str] | tuple[str, str, str]]
) -> ScriptCall[int]:
    """Hand back leased jobs given as (short id, token) when they never started, or
    (short id, token, reason) when their run was interrupted (the reason is recorded);
    either way the attempt is refunded."""
    rest: list[Arg] = []
    for job in jobs:
        rest.extend(ReleaseItem(job[0], job[1], job[2] if len(job) > 2 else ""))
    return _call("release", k, ReleaseArgv(len(jobs)), rest, int)
