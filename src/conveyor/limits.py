"""Flow control: a queue's concurrency caps and rates, for the queue and per tenant.

Limits are stored in Redis under the queue's hash tag and decided inside the fetch script,
atomically with priorities and tenant turns (see ``scripts/include/flow.lua``): a change
made here holds at every worker's next claim, without a restart.

>>> q = app.queue("emails")
>>> q.set_limits(concurrency=50, rate="200/s", tenant_concurrency=5)
>>> q.set_tenant_limits("acme", concurrency=20, rate="100/s")
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from . import sharding
from .errors import ConfigurationError
from .keys import queues_key
from .scripts import calls

if TYPE_CHECKING:
    from .app import Conveyor


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final[Any] = _Unset()
_RATE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*$")
_PER = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
        "h": 3600.0, "hour": 3600.0}


def parse_rate(rate: Any, what: str = "rate") -> float:
    """Jobs per second from ``"N/s"``, ``"N/m"``, ``"N/h"`` or a number (per second).

    :raises ConfigurationError: anything else, or a rate that is not > 0
    """
    if isinstance(rate, bool):
        raise ConfigurationError(f"{what} must be 'N/s', 'N/m', 'N/h' or a number, got {rate!r}")
    if isinstance(rate, int | float):
        per_second = float(rate)
    elif isinstance(rate, str) and (m := _RATE.match(rate)):
        per_second = float(m.group(1)) / _PER[m.group(2)]
    else:
        raise ConfigurationError(
            f"{what} must be 'N/s', 'N/m', 'N/h' or a number (per second), got {rate!r}")
    if not per_second > 0 or per_second == float("inf"):
        raise ConfigurationError(f"{what} must be more than 0 jobs per second, got {rate!r}")
    return per_second


def _cap(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"{what} must be an integer >= 0 or None, got {value!r}")
    return value


def _number_text(value: float) -> str:
    return repr(float(value)) if value != int(value) else str(int(value))


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """One tenant's own limits (``None``: the queue's tenant default applies)."""

    concurrency: int | None = None
    rate: float | None = None  # jobs per second


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """A queue's limits; rates in jobs per second, ``None`` where no limit is set."""

    concurrency: int | None = None
    rate: float | None = None
    tenant_concurrency: int | None = None
    tenant_rate: float | None = None
    tenants: dict[str, TenantLimits] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """True when nothing limits the queue."""
        return (self.concurrency is None and self.rate is None
                and self.tenant_concurrency is None and self.tenant_rate is None
                and not self.tenants)


def _int_or_none(value: str | None) -> int | None:
    try:
        return None if value is None else int(float(value))
    except (ValueError, OverflowError):
        return None


def _float_or_none(value: str | None) -> float | None:
    try:
        return None if value is None else float(value)
    except ValueError:
        return None


def limits_from_hash(fields: dict[str, str]) -> QueueLimits:
    """Read the stored limits hash (bad values read as no limit)."""
    tenants: dict[str, dict[str, Any]] = {}
    for name, value in fields.items():
        if name.startswith("c:"):
            tenants.setdefault(name[2:], {})["concurrency"] = _int_or_none(value)
        elif name.startswith("r:"):
            tenants.setdefault(name[2:], {})["rate"] = _float_or_none(value)
    return QueueLimits(
        concurrency=_int_or_none(fields.get("concurrency")),
        rate=_float_or_none(fields.get("rate")),
        tenant_concurrency=_int_or_none(fields.get("tenant_concurrency")),
        tenant_rate=_float_or_none(fields.get("tenant_rate")),
        tenants={t: TenantLimits(**v) for t, v in sorted(tenants.items())},
    )


def _changes(values: dict[str, Any], names: dict[str, str]) -> list[tuple[str, str]]:
    """(field, stored text) for each argument given; None removes the field."""
    out: list[tuple[str, str]] = []
    for arg, value in values.items():
        if value is UNSET:
            continue
        stored = names[arg]
        if value is None:
            out.append((stored, ""))
        elif "rate" in arg:
            out.append((stored, _number_text(parse_rate(value, arg))))
        else:
            out.append((stored, str(_cap(value, arg))))
    return out


def tenant_changes(fields: dict[str, str]) -> list[tuple[str, str]]:
    """The tenant limits of a limits hash, as changes that set them elsewhere."""
    return [(name, value) for name, value in fields.items()
            if name in ("tenant_concurrency", "tenant_rate") or name.startswith(("c:", "r:"))]


class Queue:
    """A handle on one queue's flow control and pause switch (made without I/O by
    :meth:`conveyor.Conveyor.queue`)."""

    def __init__(self, app: Conveyor, name: str) -> None:
        self.app = app
        self.name = name

    def __repr__(self) -> str:
        return f"<Queue {self.name!r}>"

    def _apply(self, changes: list[tuple[str, str]], clear: bool = False) -> QueueLimits:
        layout = sharding.read_layout(self.app, self.name)
        if layout.sharded:
            return self._apply_sharded(layout, changes, clear)
        k = self.app.keys(self.name)
        return limits_from_hash(self.app.scripts.run(calls.set_limits(k, changes, clear)))

    def _apply_sharded(self, layout: sharding.Layout, changes: list[tuple[str, str]],
                       clear: bool) -> QueueLimits:
        """A sharded queue's limits: its cap and rate are the whole queue's (stored in its
        layout; the cap is shared out by the workers' rebalancing, the rate split evenly),
        the tenants' limits are the same on every shard (a tenant lives on one)."""
        whole = dict(changes)
        concurrency, rate = layout.concurrency, layout.rate
        if clear:
            concurrency = rate = None
        if "concurrency" in whole:
            concurrency = int(whole["concurrency"]) if whole["concurrency"] else None
        if "rate" in whole:
            rate = float(whole["rate"]) if whole["rate"] else None
        per_shard = [(f, v) for f, v in changes if f not in ("concurrency", "rate")]
        if concurrency is None and layout.concurrency is not None:
            per_shard.append(("concurrency", ""))  # no cap: no shares
        elif concurrency is not None and (layout.concurrency is None
                                          or concurrency < layout.concurrency):
            # New or lowered: no shard starts more until a round has shared the cap out.
            per_shard.append(("concurrency", "0"))
        new = sharding.Layout(self.name, layout.active, layout.retired, concurrency, rate)
        sharding.write_global(self.app, new)
        for shard in new.served:
            self.app.scripts.run(calls.set_limits(self.app.keys(shard), per_shard, clear))
        sharding.spread_rate(self.app, new)
        return self._whole(new)

    def own_limits_hash(self) -> dict[str, str]:
        """The limits hash of the queue itself (for a sharded queue: of its first shard)."""
        raw = self.app.redis.hgetall(self.app.keys(self.name).limits)
        return {_text(a): _text(b) for a, b in raw.items()}

    def set_limits(
        self, *, concurrency: Any = UNSET, rate: Any = UNSET, tenant_concurrency: Any = UNSET,
        tenant_rate: Any = UNSET,
    ) -> QueueLimits:
        """Change the queue's limits; an argument left out is unchanged, ``None`` removes it.

        :param concurrency: jobs of this queue running at once, all workers together
        :param rate: jobs started per second: ``"N/s"``, ``"N/m"``, ``"N/h"`` or a number
        :param tenant_concurrency: default cap for every tenant of the queue
        :param tenant_rate: default rate for every tenant
        :raises ConfigurationError: a value that is not a limit (nothing is changed)
        """
        return self._apply(_changes(
            {"concurrency": concurrency, "rate": rate, "tenant_concurrency": tenant_concurrency,
             "tenant_rate": tenant_rate},
            {"concurrency": "concurrency", "rate": "rate",
             "tenant_concurrency": "tenant_concurrency", "tenant_rate": "tenant_rate"}))

    def set_tenant_limits(self, tenant: str, *, concurrency: Any = UNSET,
                          rate: Any = UNSET) -> QueueLimits:
        """Override the tenant defaults for ``tenant``; ``None`` removes an override.

        :raises ConfigurationError: an empty tenant name, or a value that is not a limit
        """
        if not isinstance(tenant, str) or not tenant:
            raise ConfigurationError(f"tenant must be a non-empty string, got {tenant!r}")
        return self._apply(_changes({"concurrency": concurrency, "rate": rate},
                                    {"concurrency": f"c:{tenant}", "rate": f"r:{tenant}"}))

    def limits(self) -> QueueLimits:
        """The queue's limits as stored now (for a sharded queue, the whole queue's)."""
        layout = sharding.read_layout(self.app, self.name)
        return self._whole(layout) if layout.sharded else limits_from_hash(
            self.own_limits_hash())

    def _whole(self, layout: sharding.Layout) -> QueueLimits:
        """A sharded queue's limits: its cap and rate from ``layout``, its tenants' from
        the queue's own limits hash (the same on every shard)."""
        own = limits_from_hash(self.own_limits_hash())
        return QueueLimits(layout.concurrency, layout.rate, own.tenant_concurrency,
                           own.tenant_rate, own.tenants)

    def clear_limits(self) -> None:
        """Remove every limit of the queue (its tenants' overrides too)."""
        self._apply([], clear=True)

    def set_shards(self, count: int) -> int:
        """Spread the queue over ``count`` shards (1: the queue alone), stored in Redis and
        read by every producer and worker within seconds (see :mod:`conveyor.sharding`).
        Shards a smaller count stops sending to keep their jobs and are served as before.

        :raises ConfigurationError: ``count`` is not an integer from 1 to 64
        """
        return len(sharding.set_shards(self.app, self.name, count).active)

    def shards(self) -> int:
        """How many shards new jobs of the queue are spread over (1 when never set)."""
        return len(sharding.read_layout(self.app, self.name).active)

    def served(self) -> list[str]:
        """The names of every shard that may hold jobs of the queue, the queue first."""
        indexed = [_text(n) for n in self.app.redis.smembers(queues_key(self.app.namespace))]
        return sharding.served_from(sharding.read_layout(self.app, self.name), indexed)

    def pause(self) -> None:
        """Stop handing out jobs of this queue; it keeps accepting new ones."""
        for shard in self.served():
            self.app.redis.set(self.app.keys(shard).paused, 1)

    def resume(self) -> None:
        """Hand out jobs again, and wake the queue's idle workers (a wake key of the wrong
        type wakes nobody: idle workers also look for work after each quiet spell)."""
        for shard in self.served():
            k = self.app.keys(shard)
            with self.app.redis.pipeline(transaction=False) as pipe:
                pipe.delete(k.paused)  # one by one: a Cluster pipeline's delete() chains nothing
                pipe.lpush(k.wake, b"1")
                pipe.ltrim(k.wake, 0, 0)
                resumed = pipe.execute(raise_on_error=False)[0]
            if isinstance(resumed, Exception):
                raise resumed

    def is_paused(self) -> bool:
        return bool(self.app.redis.exists(self.app.keys(self.name).paused))

    def purge_ready(self, reason: str = "purged") -> int:
        """Cancel every job of the queue that is ready now (not scheduled, running or
        suspended ones): each ends ``cancelled`` with ``reason``, as ``job.cancel()``
        would end it, so its record says what happened to it. Jobs made ready while this
        runs may be left. Returns how many were cancelled.

        One read of the ready lists (of each shard of a sharded queue), then one cancel per
        job, sent in pipelines of :data:`PURGE_CHUNK`.
        """
        return sum(self._purge_ready(shard, reason) for shard in self.served())

    def _purge_ready(self, shard: str, reason: str) -> int:
        k, client = self.app.keys(shard), self.app.redis
        ids: list[str] = []
        for priority in client.zrange(k.priorities, 0, -1):
            for tenant in dict.fromkeys(client.lrange(k.ring(_text(priority)), 0, -1)):
                member = f"{_text(priority)}:{_text(tenant)}"
                ids += [_text(i) for i in client.lrange(k.ready(member), 0, -1)]
        ids += [_text(e).split("|", 1)[0] for e in client.lrange(k.inbox, 0, -1)]
        from .workflow.handle import run_all

        cancelled = 0
        for start in range(0, len(ids), PURGE_CHUNK):
            states = run_all(self.app, [calls.cancel(k, short, self.app.limits, reason)
                                        for short in ids[start:start + PURGE_CHUNK]])
            cancelled += sum(state == "ready" for state in states)
        return cancelled


PURGE_CHUNK = 500  # cancels per pipeline of purge_ready


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
