"""Typed wrappers: one function per script, building the :class:`ScriptCall` to send.

``KEYS`` and ``ARGV`` below name each script's KEYS and fixed ARGV entries in the order of
the script's header (a test checks them against the ``.lua`` files). Callers pass a
:class:`~conveyor.keys.QueueKeys` and typed values; they never build key lists by hand.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, NamedTuple

from ..keys import QueueKeys
from . import Arg, ScriptCall

KEYS: dict[str, tuple[str, ...]] = {
    "enqueue": ("job_prefix", "ready_prefix", "ring_prefix", "priorities", "delayed", "counts",
                "dedupe_prefix", "wake", "metrics_prefix", "schedule_prefix", "throttle_prefix",
                "leases", "dead", "active", "seq", "events", "paused", "limits", "buckets",
                "running", "parked", "waiters", "waiter_offers", "handoff_prefix"),
    "fetch": ("job_prefix", "ready_prefix", "ring_prefix", "priorities", "delayed", "leases",
              "dead", "counts", "active", "seq", "dedupe_prefix", "events", "metrics_prefix",
              "wake", "paused", "limits", "buckets", "running", "parked", "waiters",
              "waiter_offers"),
    "finish": ("job_prefix", "leases", "delayed", "dead", "active", "idle", "dedupe_prefix",
               "events", "metrics_prefix", "wake", "counts", "running", "parked", "limits",
               "ready_prefix", "ring_prefix", "priorities"),
    "heartbeat": ("job_prefix", "leases", "cancelling"),
    "release": ("job_prefix", "ready_prefix", "ring_prefix", "priorities", "leases", "counts",
                "active", "wake", "running", "parked", "limits"),
    "cancel": ("job_prefix", "delayed", "counts", "dedupe_prefix", "cancelling"),
    "requeue_dead": ("job_prefix", "ready_prefix", "ring_prefix", "priorities", "dead",
                     "counts", "wake"),
    "purge_dead": ("job_prefix", "dead"),
    "progress": ("job_prefix",),
    "step": ("job_prefix",),
    "workflow_enqueue": ("job_prefix", "ready_prefix", "ring_prefix", "priorities", "delayed",
                         "counts", "wake", "metrics_prefix", "handover", "waiting_prefix",
                         "workflow_prefix"),
    "workflow_release": ("job_prefix", "ready_prefix", "ring_prefix", "priorities", "delayed",
                         "counts", "wake", "handover", "waiting_prefix"),
    "workflow_settle": ("workflow_prefix",),
    "set_limits": ("limits", "buckets", "parked", "ready_prefix", "ring_prefix", "priorities",
                   "wake", "counts"),
    "register_waiter": ("waiters", "waiter_offers"),
}
ARGV: dict[str, tuple[str, ...]] = {
    "enqueue": ("now", "bucket_seconds", "bucket_ttl", "claim", "claim_tick", "claim_mode",
                "task", "priority", "tenant", "delay_ms", "at_ms", "max_attempts", "key",
                "visibility_ms", "debounce_ms", "debounce_max_ms", "throttle_ms", "trace",
                "dead_cap", "events_maxlen", "count"),
    "fetch": ("now", "count", "dead_cap", "events_maxlen", "bucket_seconds", "bucket_ttl",
              "nonce", "worker", "waiter_ttl_ms"),
    "finish": ("now", "retention", "dead_cap", "events_maxlen", "bucket_seconds", "bucket_ttl",
               "snooze_cap", "count"),
    "heartbeat": ("now", "count"),
    "release": ("count",),
    "cancel": ("now", "retention", "id", "reason"),
    "requeue_dead": ("limit",),
    "purge_dead": ("limit",),
    "progress": ("count",),
    "step": ("id", "token", "name", "value"),
    "workflow_enqueue": ("now", "bucket_seconds", "bucket_ttl", "retention", "workflow", "home",
                         "nodes", "total", "count"),
    "workflow_release": ("now", "retention", "count"),
    "workflow_settle": ("retention", "workflow", "count"),
    "set_limits": ("clear", "count"),
    "register_waiter": ("now", "worker", "slots", "nonce", "ttl_ms"),
}


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


def _call(name: str, k: QueueKeys, args: Sequence[Arg], parse: Any = None) -> ScriptCall[Any]:
    keys = _keys(name, k)
    if parse is None:
        return ScriptCall(name, keys, args)
    return ScriptCall(name, keys, args, parse)


def _now(now: float | None) -> Arg:
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

    def fields(self) -> tuple[Arg, ...]:
        return (
            self.task, self.priority, self.tenant, _opt(self.delay_ms), _opt(self.at_ms),
            self.max_attempts, self.key, self.visibility_ms, _opt(self.debounce_ms),
            _opt(self.debounce_max_ms), _opt(self.throttle_ms), self.trace,
        )


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
    args: list[Arg] = [_now(now), limits.bucket_seconds, limits.bucket_ttl]
    if claim is None:
        args += ["", "", "fire"]
    else:
        args += [claim.name, claim.tick_ms, "seen" if claim.only_if_seen else "fire"]
    args.extend(spec.fields())
    args += [limits.dead_cap, limits.events_maxlen, len(jobs)]
    for short_id, encoded in jobs:
        args.append(short_id)
        args.append(encoded)
    return _call("enqueue", k, args, _parse_enqueue(jobs))


@dataclass(frozen=True, slots=True)
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
    problem = None
    texts = []
    for name, raw in (("id", f[0]), ("token", f[1]), ("task", f[2])):
        try:
            texts.append(raw.decode() if isinstance(raw, bytes) else str(raw))
        except UnicodeDecodeError:
            problem = problem or f"corrupt record: field {name!r} is not valid UTF-8"
            texts.append(raw.decode(errors="surrogateescape"))
    args = f[3] if isinstance(f[3], bytes) else str(f[3]).encode()
    return Leased(
        short_id=texts[0], token=texts[1], task=texts[2], args=args,
        attempts=_int(f[4], 1), max_attempts=_int(f[5], 1),
        enqueued_at=_float(f[6]), run_at=_float(f[7], _float(f[6])),
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
    args: list[Arg] = [_now(now), worker, slots, os.urandom(8).hex(), ttl_ms]
    return _call("register_waiter", k, args, float)


def fetch(
    k: QueueKeys, count: int, limits: Limits, now: float | None = None, worker: str = "",
    waiter_ttl_ms: int = 0,
) -> ScriptCall[Fetched]:
    """Lease up to ``count`` jobs (after promotion and lease reclaim). With a ``worker``
    id, the worker's registration as a waiter of the queue is replaced: the slots the fetch
    left free are offered to the next enqueue (``Fetched.offered``), or none."""
    args: list[Arg] = [_now(now), count, limits.dead_cap, limits.events_maxlen,
                       limits.bucket_seconds, limits.bucket_ttl, os.urandom(8).hex(), worker,
                       waiter_ttl_ms]
    if not worker or waiter_ttl_ms <= 0:
        return _call("fetch", k, args, _parse_fetch)

    def parse(reply: list[Any]) -> Fetched:
        fetched = _parse_fetch(reply)
        return dataclasses.replace(fetched, offered=max(0, count - len(fetched.jobs)))

    return _call("fetch", k, args, parse)


@dataclass(frozen=True, slots=True)
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
    args: list[Arg] = [_now(now), limits.retention, limits.dead_cap, limits.events_maxlen,
                       limits.bucket_seconds, limits.bucket_ttl, limits.snooze_cap, len(outcomes)]
    for o in outcomes:
        args.extend((o.short_id, o.token, o.outcome, f"{o.started_at:.6f}", o.payload,
                     o.retry_delay_ms))
    return _call("finish", k, args, _parse_finish)


BEAT_LOST, BEAT_KEPT, BEAT_CANCEL = 0, 1, 2


def heartbeat(
    k: QueueKeys, leases: Sequence[tuple[str, str, int]], now: float | None = None
) -> ScriptCall[list[int]]:
    """Extend leases given as (short id, token, extend_ms); per lease :data:`BEAT_KEPT`,
    :data:`BEAT_LOST`, or :data:`BEAT_CANCEL` (kept, and the job is to be cancelled)."""
    args: list[Arg] = [_now(now), len(leases)]
    for short_id, token, extend_ms in leases:
        args.extend((short_id, token, extend_ms))
    return _call("heartbeat", k, args, lambda r: [int(c) for c in r])


def release(
    k: QueueKeys, jobs: Sequence[tuple[str, str] | tuple[str, str, str]]
) -> ScriptCall[int]:
    """Hand back leased jobs given as (short id, token) when they never started, or
    (short id, token, reason) when their run was interrupted (the reason is recorded);
    either way the attempt is refunded."""
    args: list[Arg] = [len(jobs)]
    for job in jobs:
        args.extend((job[0], job[1], job[2] if len(job) > 2 else ""))
    return _call("release", k, args, int)


def cancel(
    k: QueueKeys, short_id: str, limits: Limits, reason: str = "", now: float | None = None
) -> ScriptCall[str]:
    """Cancel a job (a running one: ask its holder to stop); the reply is the state it
    was in."""
    return _call("cancel", k, [_now(now), limits.retention, short_id, reason], _text)


CANCELLABLE = ("scheduled", "retrying", "ready", "active")


def requeue_dead(k: QueueKeys, short_ids: Sequence[str], limit: int = 1000) -> ScriptCall[int]:
    """Requeue the given dead jobs, or (no ids) up to ``limit`` of the oldest."""
    return _call("requeue_dead", k, [limit, *short_ids], int)


def purge_dead(k: QueueKeys, limit: int = 1000) -> ScriptCall[int]:
    """Delete up to ``limit`` dead jobs, oldest first."""
    return _call("purge_dead", k, [limit], int)


def progress(k: QueueKeys, reports: Sequence[tuple[str, str, float, str]]) -> ScriptCall[list[int]]:
    """Record progress given as (short id, token, fraction, note); 1 written, 0 refused
    (a stale token, or a job being cancelled)."""
    args: list[Arg] = [len(reports)]
    for short_id, token, fraction, note in reports:
        args.extend((short_id, token, repr(float(fraction)), note))
    return _call("progress", k, args, lambda r: [int(c) for c in r])


STEP_REFUSED, STEP_RECORDED, STEP_KEPT, STEP_CANCELLING = 0, 1, 2, 3


def _parse_step(reply: list[Any]) -> tuple[int, bytes]:
    value = reply[1]
    return int(reply[0]), value if isinstance(value, bytes) else str(value).encode()


def step(k: QueueKeys, short_id: str, token: str, name: str, value: bytes
         ) -> ScriptCall[tuple[int, bytes]]:
    """Record the encoded result of step ``name``: (:data:`STEP_RECORDED`, b''),
    (:data:`STEP_KEPT`, the value recorded before), or a refusal with b''."""
    return _call("step", k, [short_id, token, name, value], _parse_step)


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
    args: list[Arg] = [_now(now), limits.bucket_seconds, limits.bucket_ttl, limits.retention,
                       workflow]
    if home is None:
        args += ["", "", total]
    else:
        args += [home.short_id, home.nodes, home.total]
    args.append(len(nodes))
    for node in nodes:
        s = node.spec
        args.extend((
            node.short_id, s.task, s.priority, s.tenant,
            "" if s.delay_ms is None else repr(float(s.delay_ms)),
            "" if s.at_ms is None else repr(float(s.at_ms)),
            s.max_attempts, s.visibility_ms, node.args, node.name, node.waits_for,
            node.run_if, node.parents, node.children,
        ))
    return _call("workflow_enqueue", k, args, int)


def workflow_release(
    k: QueueKeys, handovers: Sequence[tuple[str, str, str]], limits: Limits,
    now: float | None = None,
) -> ScriptCall[tuple[int, int]]:
    """Tell waiting nodes of ``k``'s queue, given as (child short id, parent job id,
    outcome: '' succeeded, else the reason), that a parent ended; the reply is how many
    were released and how many cancelled."""
    args: list[Arg] = [_now(now), limits.retention, len(handovers)]
    for child, parent, outcome in handovers:
        args.extend((child, parent, outcome))
    return _call("workflow_release", k, args, lambda r: (int(r[0]), int(r[1])))


def workflow_settle(
    k: QueueKeys, workflow_short_id: str, ended: Sequence[str], limits: Limits
) -> ScriptCall[int]:
    """Note in the home queue that nodes (job ids) of a workflow ended; the reply is how
    many have ended in all."""
    args: list[Arg] = [limits.retention, workflow_short_id, len(ended), *ended]
    return _call("workflow_settle", k, args, int)


def _parse_hash(reply: Any) -> dict[str, str]:
    return {_text(reply[i]): _text(reply[i + 1]) for i in range(0, len(reply), 2)}


def set_limits(
    k: QueueKeys, changes: Sequence[tuple[str, str]], clear: bool = False
) -> ScriptCall[dict[str, str]]:
    """Change flow-control limit fields given as (field, value); '' removes a field.
    ``clear`` removes every limit first. The reply is the limits hash afterwards."""
    args: list[Arg] = ["1" if clear else "", len(changes)]
    for name, value in changes:
        args.extend((name, value))
    return _call("set_limits", k, args, _parse_hash)
