"""Typed wrappers: one function per script, building the :class:`ScriptCall` to send.

``KEYS`` names each script's KEYS and ``ARGV`` gives the typed tuple of its fixed ARGV
entries, both in the order of the script's header (a test checks them against the
``.lua`` files); every call's fixed arguments are built as that tuple. Callers pass a
:class:`~conveyor.keys.QueueKeys` and typed values; they never build key lists by hand.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, NamedTuple

from ..keys import QueueKeys
from . import Arg, ScriptCall
from .signatures import (
    ARGV as ARGV,
)
from .signatures import (
    ITEMS as ITEMS,
)
from .signatures import (
    KEYS as KEYS,
)
from .signatures import (
    CancelArgv,
    EnqueueArgv,
    EnqueueItem,
    FetchArgv,
    FinishArgv,
    FinishItem,
    HeartbeatArgv,
    HeartbeatItem,
    ProgressArgv,
    ProgressItem,
    PurgeDeadArgv,
    RegisterWaiterArgv,
    ReleaseArgv,
    ReleaseItem,
    RequeueDeadArgv,
    RequeueDeadItem,
    SetLimitsArgv,
    SetLimitsItem,
    StepArgv,
    WorkflowEnqueueArgv,
    WorkflowEnqueueItem,
    WorkflowReleaseArgv,
    WorkflowReleaseItem,
    WorkflowSettleArgv,
    WorkflowSettleItem,
)


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds that keep Redis memory flat; set on :class:`~conveyor.Conveyor`."""

    retention: int = 86_400  # seconds a finished job record and its result are kept
    dead_cap: int = 100_000  # most dead letters kept per queue
    events_maxlen: int = 100_000  # approximate cap of a queue's events stream
    bucket_seconds: int = 10  # width of a metric bucket
    bucket_ttl: int = 86_400  # lifetime of a metric bucket: the longest stats window
    snooze_cap: int = 100  # most snoozes of one job; the next one makes it dead


@cache
def _keys(name: str, k: QueueKeys) -> tuple[str, ...]:
    return tuple(getattr(k, attr) for attr in KEYS[name])


def _call(name: str, k: QueueKeys, fixed: tuple[Any, ...], rest: Sequence[Arg] = (),
          parse: Any = None) -> ScriptCall[Any]:
    """The call of script ``name``: its KEYS from ``k``, its ARGV the fields of ``fixed``
    (the script's own typed tuple, see :data:`ARGV`) followed by ``rest``."""
    keys = _keys(name, k)
    args: Sequence[Arg] = (*fixed, *rest) if rest else fixed
    if parse is None:
        return ScriptCall(name, keys, args, fixed=len(fixed))
    return ScriptCall(name, keys, args, parse, len(fixed))


def _nonce() -> str:
    """64 random bits for a fetch's tokens: from the process's PRNG (seeded from the OS,
    and again in a forked child), not a system call per fetch."""
    return f"{random.getrandbits(64):016x}"


def _now(now: float | None) -> str:
    return "" if now is None else repr(float(now))


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class JobSpec(NamedTuple):
    """What every job of one enqueue call shares: its task, its options, and the trace id
    of the call (32 hex digits, '' when not traced) that the sink's rows carry."""

    task: str
    priority: int = 5
    tenant: str = ""
    delay_ms: float | None = None
    at_ms: float | None = None
    max_attempts: int = 4
    key: str = ""
    visibility_ms: int = 30_000
    debounce_ms: float | None = None
    debounce_max_ms: float | None = None
    throttle_ms: float | None = None
    trace: str = ""


def _opt(ms: float | None) -> str:
    return "" if ms is None else repr(float(ms))


def _parse_enqueue(
    jobs: Sequence[tuple[str, bytes]],
) -> Callable[[Any], list[tuple[str, bool]]]:
    def parse(reply: Any) -> list[tuple[str, bool]]:
        if isinstance(reply, int):  # all stored: the reply is just how many
            return [(short_id, True) for short_id, _ in jobs]
        return [(_text(reply[i]), bool(reply[i + 1])) for i in range(0, len(reply), 2)]

    return parse


@dataclass(frozen=True, slots=True)
class Claim:
    """Store jobs only as the first to claim ``tick_ms`` of periodic ``name``.

    :param only_if_seen: on a periodic's first claim ever, record the tick without firing
    """

    name: str
    tick_ms: int
    only_if_seen: bool = False


def enqueue(
    k: QueueKeys, spec: JobSpec, jobs: Sequence[tuple[str, bytes]], limits: Limits,
    now: float | None = None, claim: Claim | None = None,
) -> ScriptCall[list[tuple[str, bool]]]:
    """Store ``jobs``, given as (short id, encoded arguments), all as ``spec`` says; the
    reply pairs each with (short id, created), or is empty when ``claim`` was taken."""
    fixed = EnqueueArgv(
        now=_now(now), bucket_seconds=limits.bucket_seconds, bucket_ttl=limits.bucket_ttl,
        claim="" if claim is None else claim.name,
        claim_tick="" if claim is None else claim.tick_ms,
        claim_mode="seen" if claim is not None and claim.only_if_seen else "fire",
        task=spec.task, priority=spec.priority, tenant=spec.tenant,
        delay_ms=_opt(spec.delay_ms), at_ms=_opt(spec.at_ms), max_attempts=spec.max_attempts,
        key=spec.key, visibility_ms=spec.visibility_ms, debounce_ms=_opt(spec.debounce_ms),
        debounce_max_ms=_opt(spec.debounce_max_ms), throttle_ms=_opt(spec.throttle_ms),
        trace=spec.trace, dead_cap=limits.dead_cap, events_maxlen=limits.events_maxlen,
        jobs=len(jobs))
    rest: list[Arg] = []
    for short_id, encoded in jobs:
        rest.extend(EnqueueItem(short_id, encoded))
    return _call("enqueue", k, fixed, rest, _parse_enqueue(jobs))


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


def _leased(f: Sequence[Any]) -> Leased:
    """One leased job from its 9 reply fields; never raises (see ``Leased.problem``)."""
    short_id, token, task, args = f[0], f[1], f[2], f[3]
    if type(short_id) is bytes and type(token) is bytes and type(task) is bytes \
            and type(args) is bytes:
        try:  # the common case: one decode per text field, no bookkeeping
            enqueued_at = _float(f[6]) / 1000  # stored in ms
            return Leased(short_id.decode(), token.decode(), task.decode(), args,
                          _int(f[4], 1), _int(f[5], 1), enqueued_at,
                          _float(f[7], enqueued_at), _int(f[8], 30_000))
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
        visibility_ms=_int(f[8], 30_000), problem=problem,
    )


def _parse_fetch(reply: list[Any]) -> Fetched:
    now, next_due, dead, flat, trimmed, held = reply
    return Fetched(
        now_ms=float(now),
        next_due_ms=float(next_due) if next_due not in (b"", "") else None,
        dead=[_text(d) for d in dead],
        jobs=[_leased(flat[i:i + 9]) for i in range(0, len(flat), 9)],
        trimmed=[_text(t) for t in trimmed],
        held=bool(int(held)),
    )


def parse_handoff(entry: bytes) -> Fetched:
    """A hand-off list entry (include/handoff.lua): fields framed as ``<length>:<bytes>``;
    now, the dead and the trimmed ids (each a count, then the ids), 9 fields per job.

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
    n_dead = int(fields[1])
    dead = fields[2:2 + n_dead]
    n_trimmed = int(fields[2 + n_dead])
    flat = fields[3 + n_dead + n_trimmed:]
    if len(flat) % 9:
        raise ValueError("hand-off entry with a partial job")
    return Fetched(
        now_ms=float(fields[0]), next_due_ms=None, dead=[_text(d) for d in dead],
        jobs=[_leased(flat[i:i + 9]) for i in range(0, len(flat), 9)],
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
    """Lease up to ``count`` jobs (after promotion and lease reclaim). With a ``worker``
    id, the worker's registration as a waiter of the queue is replaced: the slots the fetch
    left free are offered to the next enqueue (``Fetched.offered``), or none."""
    fixed = FetchArgv(_now(now), count, limits.dead_cap, limits.events_maxlen,
                      limits.bucket_seconds, limits.bucket_ttl, _nonce(), worker, waiter_ttl_ms)
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
    outcome: str  # 'ok' | 'retry' | 'dead' | 'snooze' | 'cancelled'
    started_at: float
    payload: bytes | str = b""
    retry_delay_ms: int = 0  # the delay of a retry or a snooze


FINISH_REFUSED, FINISH_SUCCEEDED, FINISH_RETRYING, FINISH_DEAD = 0, 1, 2, 3
FINISH_CANCELLED, FINISH_SNOOZED = 4, 5


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


def heartbeat(
    k: QueueKeys, leases: Sequence[tuple[str, str, int]], now: float | None = None
) -> ScriptCall[list[int]]:
    """Extend leases given as (short id, token, extend_ms); per lease :data:`BEAT_KEPT`,
    :data:`BEAT_LOST`, or :data:`BEAT_CANCEL` (kept, and the job is to be cancelled)."""
    rest: list[Arg] = []
    for short_id, token, extend_ms in leases:
        rest.extend(HeartbeatItem(short_id, token, extend_ms))
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


def cancel(
    k: QueueKeys, short_id: str, limits: Limits, reason: str = "", now: float | None = None
) -> ScriptCall[str]:
    """Cancel a job (a running one: ask its holder to stop); the reply is the state it
    was in."""
    return _call("cancel", k, CancelArgv(_now(now), limits.retention, short_id, reason), (),
                 _text)


CANCELLABLE = ("scheduled", "retrying", "ready", "active")


def requeue_dead(k: QueueKeys, short_ids: Sequence[str], limit: int = 1000) -> ScriptCall[int]:
    """Requeue the given dead jobs, or (no ids) up to ``limit`` of the oldest."""
    rest = [field for short_id in short_ids for field in RequeueDeadItem(short_id)]
    return _call("requeue_dead", k, RequeueDeadArgv(limit), rest, int)


def purge_dead(k: QueueKeys, limit: int = 1000) -> ScriptCall[int]:
    """Delete up to ``limit`` dead jobs, oldest first."""
    return _call("purge_dead", k, PurgeDeadArgv(limit), (), int)


def progress(k: QueueKeys, reports: Sequence[tuple[str, str, float, str]]) -> ScriptCall[list[int]]:
    """Record progress given as (short id, token, fraction, note); 1 written, 0 refused
    (a stale token, or a job being cancelled)."""
    rest: list[Arg] = []
    for short_id, token, fraction, note in reports:
        rest.extend(ProgressItem(short_id, token, repr(float(fraction)), note))
    return _call("progress", k, ProgressArgv(len(reports)), rest,
                 lambda r: [int(c) for c in r])


STEP_REFUSED, STEP_RECORDED, STEP_KEPT, STEP_CANCELLING = 0, 1, 2, 3


def _parse_step(reply: list[Any]) -> tuple[int, bytes]:
    value = reply[1]
    return int(reply[0]), value if isinstance(value, bytes) else str(value).encode()


def step(k: QueueKeys, short_id: str, token: str, name: str, value: bytes
         ) -> ScriptCall[tuple[int, bytes]]:
    """Record the encoded result of step ``name``: (:data:`STEP_RECORDED`, b''),
    (:data:`STEP_KEPT`, the value recorded before), or a refusal with b''."""
    return _call("step", k, StepArgv(short_id, token, name, value), (), _parse_step)


class NodeSpec(NamedTuple):
    """One workflow node as ``workflow_enqueue`` stores it."""

    short_id: str
    spec: JobSpec
    args: bytes
    name: str
    waits_for: int  # parents that must end before it runs
    run_if: str  # 'succeeded' | 'finished'
    parents: bytes  # encoded [[name, job id], ...] (read by Python only)
    children: bytes  # encoded [job id, ...] (read by Python only)


@dataclass(frozen=True, slots=True)
class WorkflowHome:
    """The part of a workflow's record stored in its home queue."""

    short_id: str
    nodes: bytes  # encoded node list
    total: int


def workflow_enqueue(
    k: QueueKeys, workflow: str, nodes: Sequence[NodeSpec], limits: Limits,
    home: WorkflowHome | None = None, total: int = 0, now: float | None = None,
) -> ScriptCall[int]:
    """Store the nodes of ``workflow`` that live in ``k``'s queue (and its record, when
    ``home`` is given); the reply is how many nodes were stored."""
    fixed = WorkflowEnqueueArgv(
        now=_now(now), bucket_seconds=limits.bucket_seconds, bucket_ttl=limits.bucket_ttl,
        retention=limits.retention, workflow=workflow,
        home="" if home is None else home.short_id, nodes=b"" if home is None else home.nodes,
        total=total if home is None else home.total, node_count=len(nodes))
    rest: list[Arg] = []
    for node in nodes:
        s = node.spec
        rest.extend(WorkflowEnqueueItem(
            short_id=node.short_id, task=s.task, priority=s.priority, tenant=s.tenant,
            delay_ms=_opt(s.delay_ms), at_ms=_opt(s.at_ms), max_attempts=s.max_attempts,
            visibility_ms=s.visibility_ms, args=node.args, name=node.name,
            waits_for=node.waits_for, run_if=node.run_if, parents=node.parents,
            children=node.children))
    return _call("workflow_enqueue", k, fixed, rest, int)


def workflow_release(
    k: QueueKeys, handovers: Sequence[tuple[str, str, str]], limits: Limits,
    now: float | None = None,
) -> ScriptCall[tuple[int, int]]:
    """Tell waiting nodes of ``k``'s queue, given as (child short id, parent job id,
    outcome: '' succeeded, else the reason), that a parent ended; the reply is how many
    were released and how many cancelled."""
    rest: list[Arg] = []
    for child, parent, outcome in handovers:
        rest.extend(WorkflowReleaseItem(child, parent, outcome))
    return _call("workflow_release", k, WorkflowReleaseArgv(_now(now), limits.retention,
                                                            len(handovers)),
                 rest, lambda r: (int(r[0]), int(r[1])))


def workflow_settle(
    k: QueueKeys, workflow_short_id: str, ended: Sequence[str], limits: Limits
) -> ScriptCall[int]:
    """Note in the home queue that nodes (job ids) of a workflow ended; the reply is how
    many have ended in all."""
    fixed = WorkflowSettleArgv(limits.retention, workflow_short_id, len(ended))
    rest = [field for node in ended for field in WorkflowSettleItem(node)]
    return _call("workflow_settle", k, fixed, rest, int)


def _parse_hash(reply: Any) -> dict[str, str]:
    return {_text(reply[i]): _text(reply[i + 1]) for i in range(0, len(reply), 2)}


def set_limits(
    k: QueueKeys, changes: Sequence[tuple[str, str]], clear: bool = False
) -> ScriptCall[dict[str, str]]:
    """Change flow-control limit fields given as (field, value); '' removes a field.
    ``clear`` removes every limit first. The reply is the limits hash afterwards."""
    rest: list[Arg] = []
    for name, value in changes:
        rest.extend(SetLimitsItem(name, value))
    return _call("set_limits", k, SetLimitsArgv("1" if clear else "", len(changes)), rest,
                 _parse_hash)
