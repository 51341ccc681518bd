"""The producer's call: ``enqueue`` stores a batch of jobs of one task and options."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ...bounds import Limits
from ...keys import QueueKeys
from .. import ScriptCall
from ..signatures import Arg, EnqueueArgv, EnqueueItem
from .build import _call, _now, _opt, _text


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
    parent: str = ""  # the job whose durable wait this one is (ctx.child)
    expires: str = ""  # '' or must start by: '+<ms>' from the enqueue, or '<ms>' epoch
    deadline: str = ""  # '' or must finish by, in the same forms


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
        trace=spec.trace, parent=spec.parent, expires=spec.expires,
        deadline=spec.deadline, dead_cap=limits.dead_cap,
        events_maxlen=limits.events_maxlen,
        jobs=len(jobs))
    rest: list[Arg] = []
    for short_id, encoded in jobs:
        rest.extend(EnqueueItem(short_id, encoded))
    return _call("enqueue", k, fixed, rest, _parse_enqueue(jobs))
