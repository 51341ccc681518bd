"""Reading a queue's flow-control state: its limits, running counts, and the ready jobs
that a limit holds back now (the one reader of these keys; the CLI, dashboard, stats and
advice call it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..clock import server_now
from ..keys import QueueKeys
from ..limits import QueueLimits, limits_from_hash

PARKED_READ = 1000  # most parked tenants looked at for the held counts


@dataclass(frozen=True, slots=True)
class FlowState:
    """A queue's limits and what they do now.

    ``held``: ready jobs that cannot start now because of a limit (all of them while the
    queue is paused or at its own cap or rate); ``blocked_by``: ``"paused"``,
    ``"concurrency"``, ``"rate"`` or ``None`` when the queue as a whole may start jobs.
    """

    queue: str
    limits: QueueLimits
    paused: bool = False
    running: int = 0
    running_by_tenant: dict[str, int] = field(default_factory=dict)
    ready: int = 0
    held: int = 0
    held_by_tenant: dict[str, int] = field(default_factory=dict)
    blocked_by: str | None = None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _int(value: Any) -> int:
    try:
        return max(0, int(float(value or 0)))
    except (TypeError, ValueError, OverflowError):
        return 0


def bucket_tokens(state: Any, rate: float, now_ms: float) -> float:
    """Tokens in a stored bucket (``'<tokens> <ms>'``) at ``now_ms``, as flow.lua counts."""
    size = max(rate, 1.0)
    try:
        tokens, at = (float(x) for x in _text(state).split(" "))
    except (TypeError, ValueError):
        return size
    return min(size, tokens + max(0.0, now_ms - at) * rate / 1000)


def _blocked_by(lim: QueueLimits, paused: bool, running: int, bucket: Any,
                now_ms: float) -> str | None:
    if paused:
        return "paused"
    if lim.concurrency is not None and running >= lim.concurrency:
        return "concurrency"
    if lim.rate is not None and lim.rate > 0 and bucket_tokens(bucket, lim.rate, now_ms) < 1 - 1e-9:
        return "rate"
    return None


def read_flow(client: Any, keys: QueueKeys) -> FlowState:
    """The flow-control state of one queue (two pipelined round trips at most)."""
    with client.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.limits).hmget(keys.counts, "running", "ready")
        pipe.hgetall(keys.running).hget(keys.buckets, "").exists(keys.paused)
        pipe.zrange(keys.parked, 0, PARKED_READ - 1)
        raw_limits, counts, by_tenant, bucket, paused, parked = pipe.execute()
    lim = limits_from_hash({_text(a): _text(b) for a, b in raw_limits.items()})
    running, ready = _int(counts[0]), _int(counts[1])
    now_ms = 0.0
    if lim.rate is not None:  # the server's clock, as the scripts read it (not pipelined:
        now_ms = server_now(client) * 1000  # a cluster pipeline refuses keyless commands)
    held_by_tenant: dict[str, int] = {}
    members = [_text(m) for m in parked]
    if members:
        with client.pipeline(transaction=False) as pipe:
            for member in members:
                pipe.llen(keys.ready(member))
            lengths = pipe.execute()
        for member, n in zip(members, lengths, strict=True):
            tenant = member.partition(":")[2]
            held_by_tenant[tenant] = held_by_tenant.get(tenant, 0) + int(n)
    blocked = _blocked_by(lim, bool(paused), running, bucket, now_ms)
    held = ready if blocked else min(ready, sum(held_by_tenant.values()))
    return FlowState(
        queue=keys.queue, limits=lim, paused=bool(paused), running=running,
        running_by_tenant={_text(t): _int(n) for t, n in sorted(by_tenant.items())},
        ready=ready, held=held, held_by_tenant=dict(sorted(held_by_tenant.items())),
        blocked_by=blocked,
    )
