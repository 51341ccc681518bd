"""Sharded queues: one queue spread over several hash tags, so several Redis Cluster nodes.

Every key of a queue shares one hash tag, so one queue lives on one Cluster node and can
go no faster than that node's core. ``app.queue("emails").set_shards(4)`` spreads it over
four shards: the queue itself and three more, named ``emails~1`` ... (a ``~`` cannot be
part of a queue's own name, so a shard's name never meets a queue's). Each shard is a whole
queue of its own on the server, with its own hash tag; on a Cluster, new shards are named
so that their tags fall on distinct primaries while there are primaries left.

The layout is stored on the queue itself (``keys.shards``) and read by every producer
(at most :data:`LAYOUT_TTL` seconds old) and every worker:

* a producer sends a job with a tenant to that tenant's shard (its order and its turn are
  kept there), a job with a dedupe, debounce or throttle key to that key's shard (so that
  the key names one job), and any other job to the next shard in turn (spread evenly);
  jobs whose id is fixed in advance (a durable wait's child, a periodic tick, a workflow
  node) stay on the queue itself;
* a worker serves every shard that may hold jobs: the active ones, the ones retired by a
  smaller count (they keep their jobs, so they are served until the end), and any shard
  the index of queues names (a layout lost with an old copy of the data never hides one);
* the queue's concurrency cap holds for all shards together: each shard has a share, and
  one rebalancing round at a time (:func:`rebalance`, run by workers) moves the shares to
  where the jobs are, never taking from a shard more than it leaves unused, so the shares
  never add up to more than the cap. A round is fenced by an epoch each shard checks: one
  that stalled past its lock cannot write after a newer one read the shard. Jobs held by
  a dead worker free their shard's share when their leases are reclaimed, as on any queue.
* the queue's rate is split evenly among the shards it serves; tenant limits are the same
  on every shard (a tenant lives on one).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.crc import key_slot

from . import keys as keyspace
from .errors import ConfigurationError

if TYPE_CHECKING:
    from .app import Conveyor

log = logging.getLogger("conveyor.sharding")

SEPARATOR = keyspace.JOB_ID_SEPARATOR  # "<queue>~<n>": never the name of a queue
MAX_SHARDS = 64
LAYOUT_TTL = 1.0  # seconds a producer uses a layout before reading it again
LOCK_MS = 2000  # a rebalancing round's lock (only one round runs at a time)


def shard_name(queue: str, number: int) -> str:
    """The name of shard ``number`` of ``queue`` (0: the queue itself)."""
    return queue if number == 0 else f"{queue}{SEPARATOR}{number}"


def base_queue(name: str) -> str:
    """The queue a shard belongs to (a queue's own name is its own base)."""
    return name.split(SEPARATOR, 1)[0]


def is_shard(name: str) -> bool:
    return SEPARATOR in name


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a queue's jobs live.

    :ivar active: the shards new jobs go to; the first is the queue itself
    :ivar retired: shards a smaller count stopped sending to (still served)
    :ivar concurrency: the queue's cap, all shards together (None: no cap)
    :ivar rate: the queue's rate, all shards together (jobs per second; None: none)
    :ivar garbled: a limit field holds no number: the cap is not known (rounds then move
        no share, rather than read it as no cap)
    """

    queue: str
    active: tuple[str, ...]
    retired: tuple[str, ...] = ()
    concurrency: int | None = None
    rate: float | None = None
    garbled: bool = False  # a limit field that reads as no number (written over by hand)

    @property
    def served(self) -> tuple[str, ...]:
        """Every shard that may hold jobs."""
        return self.active + self.retired

    @property
    def sharded(self) -> bool:
        return len(self.served) > 1


def _names(queue: str, raw: Any) -> tuple[str, ...]:
    try:
        names = json.loads(raw) if raw else []
    except ValueError:
        names = []
    if not isinstance(names, list):
        names = []
    # Only names of this queue's shards (a mangled record never sends jobs elsewhere).
    return tuple(dict.fromkeys(n for n in names if isinstance(n, str)
                               and (n == queue or n.startswith(queue + SEPARATOR))))


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def parse_layout(queue: str, raw: dict[Any, Any]) -> Layout:
    """The layout stored in ``keys.shards`` (an empty or mangled record: one shard)."""
    fields = {_text(a): _text(b) for a, b in raw.items()}
    active = _names(queue, fields.get("active"))
    if not active or active[0] != queue:
        active = (queue, *(n for n in active if n != queue))
    retired = tuple(n for n in _names(queue, fields.get("retired")) if n not in active)
    concurrency, rate, garbled = None, None, False
    try:
        if fields.get("concurrency"):
            concurrency = int(fields["concurrency"])
        if fields.get("rate"):
            rate = float(fields["rate"])
    except ValueError:
        garbled = True
    return Layout(queue, active, retired, concurrency, rate, garbled)


def place(layout: Layout, tenant: str | None, key: str | None, turn: int) -> str:
    """The shard a new job goes to (see the module's docstring)."""
    active = layout.active
    n = len(active)
    if n == 1:
        return active[0]
    if tenant is not None:
        return active[zlib.crc32(tenant.encode()) % n]
    if key is not None:
        return active[zlib.crc32(key.encode()) % n]
    return active[turn % n]


class Layouts:
    """The layouts a producer uses, each read again once :data:`LAYOUT_TTL` old."""

    def __init__(self, app: Conveyor) -> None:
        self._app = app
        self._known: dict[str, tuple[float, Layout]] = {}
        self._turn = itertools.count(int.from_bytes(os.urandom(2), "big"))

    def _fresh(self, queue: str) -> Layout | None:
        known = self._known.get(queue)
        if known is not None and time.monotonic() - known[0] < LAYOUT_TTL:
            return known[1]
        return None

    def _learn(self, queue: str, raw: Any) -> Layout:
        layout = parse_layout(queue, raw)
        self._known[queue] = (time.monotonic(), layout)
        return layout

    def _failed(self, queue: str, exc: Exception) -> Layout:
        # The send that follows meets the same fault and says so; meanwhile the last layout
        # known (or the queue itself, which is always served) takes the job.
        log.debug("could not read the layout of queue %s: %s", queue, exc)
        known = self._known.get(queue)
        return known[1] if known is not None else Layout(queue, (queue,))

    def due(self, queue: str) -> bool:
        """Whether the layout of ``queue`` should be read again (see :meth:`learn`)."""
        return self._fresh(queue) is None

    def learn(self, queue: str, raw: Any) -> None:
        """Keep the layout read by a send's own pipeline (an error reply: none learnt)."""
        if isinstance(raw, dict):
            self._learn(queue, raw)

    def peek(self, queue: str) -> Layout:
        """The layout last read, however old, without I/O (never read: the queue alone)."""
        known = self._known.get(queue)
        return known[1] if known is not None else Layout(queue, (queue,))

    def _to_read(self, queue: str) -> list[str]:
        """``queue``, and on the first read of a layout, those of the app's other queues
        (so that a process's first enqueue to each costs no read of its own)."""
        if self._known:
            return [queue]
        return [queue, *(q for q in self._app.queues() if q != queue)]

    def get(self, queue: str) -> Layout:
        """The layout of ``queue``, read again when :data:`LAYOUT_TTL` old."""
        layout = self._fresh(queue)
        if layout is not None:
            return layout
        names = self._to_read(queue)
        try:
            with self._app.redis.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.hgetall(self._app.keys(name).shards)
                replies = pipe.execute()
        except Exception as exc:  # see _failed
            return self._failed(queue, exc)
        for name, raw in zip(names, replies, strict=True):
            self._learn(name, raw)
        return self._known[queue][1]

    async def aget(self, queue: str) -> Layout:
        """Async twin of :meth:`get`."""
        layout = self._fresh(queue)
        if layout is not None:
            return layout
        names = self._to_read(queue)
        try:
            async with self._app.aredis().pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.hgetall(self._app.keys(name).shards)
                replies = await pipe.execute()
        except Exception as exc:  # see _failed
            return self._failed(queue, exc)
        for name, raw in zip(names, replies, strict=True):
            self._learn(name, raw)
        return self._known[queue][1]

    def known(self, queue: str) -> bool:
        return queue in self._known

    def place(self, layout: Layout, tenant: str | None, key: str | None) -> str:
        return place(layout, tenant, key, next(self._turn))

    def spread(self, layout: Layout, count: int) -> list[str]:
        """Shards for ``count`` jobs with neither tenant nor key, in turn."""
        start = next(self._turn)
        active = layout.active
        return [active[(start + i) % len(active)] for i in range(count)]


# -- served shards (workers) -------------------------------------------------------------


def served_from(layout: Layout, indexed: Sequence[str]) -> list[str]:
    """Every shard of ``layout.queue`` that may hold jobs: the layout's and any shard of it
    that the index of queues names."""
    prefix = layout.queue + SEPARATOR
    return list(dict.fromkeys((*layout.served,
                               *sorted(n for n in indexed if n.startswith(prefix)))))


async def aserved(app: Conveyor, client: Any, queues: Sequence[str]
                  ) -> dict[str, tuple[Layout, list[str]]]:
    """queue -> its layout and the shards of it a worker must serve, for each of
    ``queues``."""
    indexed = [_text(n) for n in await client.smembers(keyspace.queues_key(app.namespace))]
    out: dict[str, tuple[Layout, list[str]]] = {}
    for queue in queues:
        layout = parse_layout(queue, await client.hgetall(app.keys(queue).shards))
        out[queue] = (layout, served_from(layout, indexed))
    return out


# -- layout changes (set_shards) ---------------------------------------------------------


def _primaries(app: Conveyor) -> dict[int, str] | None:
    """slot -> primary (host:port) on a Cluster; None elsewhere."""
    client = app.redis
    manager = getattr(client, "nodes_manager", None)
    if manager is None:
        return None
    out: dict[int, str] = {}
    for slot, nodes in manager.slots_cache.items():
        if nodes:
            out[slot] = nodes[0].name
    return out


def _new_names(app: Conveyor, queue: str, taken: Sequence[str], want: int) -> list[str]:
    """``want`` new shard names, each on the Cluster primary that holds fewest of ``taken``
    (the first free number anywhere else)."""
    slots = _primaries(app)
    used = set(taken)
    numbers = (n for n in itertools.count(1) if shard_name(queue, n) not in used)
    if not slots:
        return [shard_name(queue, next(numbers)) for _ in range(want)]

    def primary(name: str) -> str | None:
        return slots.get(key_slot(app.keys(name).tag[1:-1].encode()))

    load: dict[str, int] = dict.fromkeys(set(slots.values()), 0)
    for name in taken:
        node = primary(name)
        if node is not None:
            load[node] = load.get(node, 0) + 1
    out: list[str] = []
    candidates = [shard_name(queue, n) for n in itertools.islice(numbers, 64 * (want + 1))]
    for _ in range(want):
        least = min(load.values())
        pick = next((c for c in candidates if c not in out and load.get(primary(c) or "", 0)
                     == least), None) or next(c for c in candidates if c not in out)
        out.append(pick)
        node = primary(pick)
        if node is not None:
            load[node] = load.get(node, 0) + 1
    return out


def read_layout(app: Conveyor, queue: str) -> Layout:
    return parse_layout(queue, app.redis.hgetall(app.keys(queue).shards))


def set_shards(app: Conveyor, queue: str, count: int) -> Layout:
    """Spread ``queue`` over ``count`` shards (see :meth:`conveyor.limits.Queue.set_shards`)."""
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_SHARDS:
        raise ConfigurationError(
            f"shards must be an integer from 1 to {MAX_SHARDS}, got {count!r}")
    from redis.exceptions import WatchError

    k = app.keys(queue)
    for _ in range(20):
        with app.redis.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(k.shards)
                old = parse_layout(queue, pipe.hgetall(k.shards))
                if len(old.active) == count:
                    pipe.unwatch()
                    return old
                if count < len(old.active):
                    active = old.active[:count]
                    retired = (*old.retired, *old.active[count:])
                else:
                    reuse = old.retired[:count - len(old.active)]
                    fresh = _new_names(app, queue, old.served, count - len(old.active) - len(reuse))
                    active = (*old.active, *reuse, *fresh)
                    retired = tuple(n for n in old.retired if n not in reuse)
                new = Layout(queue, active, retired, old.concurrency, old.rate)
                if not old.sharded:  # the queue's own limits become the whole queue's
                    own = app.queue(queue).limits()
                    new = Layout(queue, active, retired, own.concurrency, own.rate)
                # Before any job can go there: the shards served so far get their smaller
                # part of the rate, then each new one the tenants' limits, no share of the
                # cap and its part of the rate (the parts never add up to more).
                spread_rate(app, new, old.served)
                _prepare(app, new, [n for n in new.served if n not in old.served])
                pipe.multi()
                pipe.hset(k.shards, mapping=_fields(new))
                pipe.execute()
            except WatchError:
                continue
        app._layouts.learn(queue, _fields(new))
        return new
    raise RuntimeError(f"the layout of queue {queue} kept changing under set_shards; try again")


def _fields(layout: Layout) -> dict[str, str]:
    return {"active": json.dumps(list(layout.active)),
            "retired": json.dumps(list(layout.retired)),
            "concurrency": "" if layout.concurrency is None else str(layout.concurrency),
            "rate": "" if layout.rate is None else repr(layout.rate)}


def _prepare(app: Conveyor, layout: Layout, shards: Sequence[str]) -> None:
    """Give new ``shards`` the queue's tenant limits, no share of its cap, their part of its
    rate, and its events stream if it has one on."""
    from .limits import tenant_changes
    from .scripts import calls

    base = app.queue(layout.queue).own_limits_hash()
    changes = tenant_changes(base)
    if layout.concurrency is not None:
        changes.append(("concurrency", "0"))
    if layout.rate is not None:
        changes.append(("rate", repr(layout.rate / len(layout.served))))
    streaming = bool(app.redis.exists(app.keys(layout.queue).events_on))
    for shard in shards:
        app.scripts.run(calls.set_limits(app.keys(shard), changes, clear=True))
        if streaming:  # a sink reads the queue: it reads this shard too, from its first job
            app.redis.set(app.keys(shard).events_on, "1")


def spread_rate(app: Conveyor, layout: Layout, shards: Sequence[str] | None = None) -> None:
    """Give each shard served (or each of ``shards``) its part of the queue's rate."""
    from .scripts import calls

    if not layout.sharded and layout.rate is None:
        return
    part = "" if layout.rate is None else repr(layout.rate / len(layout.served))
    for shard in layout.served if shards is None else shards:
        app.scripts.run(calls.set_limits(app.keys(shard), [("rate", part)]))


def write_global(app: Conveyor, layout: Layout) -> None:
    """Store the whole queue's cap and rate in its layout."""
    fields = _fields(layout)
    app.redis.hset(app.keys(layout.queue).shards,
                   mapping={name: fields[name] for name in ("concurrency", "rate")})


# -- rebalancing the concurrency cap (workers) -------------------------------------------


def targets(cap: int, shares: Sequence[tuple[int, int]]) -> list[int]:
    """The share of ``cap`` each shard should have, from its (running, ready) jobs: at least
    what it runs, then the rest in proportion to what waits, and what nobody waits for
    spread evenly (so that a job arriving on any shard can start before the next round)."""
    n = len(shares)
    out = [running for running, _ in shares]
    left = cap - sum(out)
    if left <= 0:
        return out
    waiting = [ready for _, ready in shares]
    total = sum(waiting)
    if total > 0:
        give = [min(w, left * w // total) for w in waiting]
        for i, g in enumerate(give):
            out[i] += g
        left -= sum(give)
        # What rounding left over goes to the shards with the most still waiting.
        for i in sorted(range(n), key=lambda i: waiting[i] - give[i], reverse=True):
            if left <= 0:
                break
            if waiting[i] > give[i]:
                out[i] += 1
                left -= 1
    for i in itertools.islice(itertools.cycle(range(n)), max(0, left)):
        out[i] += 1
    return out


async def rebalance(app: Conveyor, client: Any, runner: Any, queue: str,
                    served: Sequence[str]) -> int | None:
    """One rebalancing round of ``queue``'s concurrency cap over ``served``: how many
    shares it changed, or None when another round holds the lock, or a newer round
    overtook this one (nothing more was written; what was lowered stays lowered: the next
    round gives it back)."""
    k = app.keys(queue)
    token = os.urandom(8).hex()
    if not await client.set(k.shards_lock, token, nx=True, px=LOCK_MS):
        return None
    try:
        return await _round(app, client, runner, queue, list(served))
    finally:
        # Let the next round start now rather than when the lock lapses (a lock taken over
        # meanwhile may be deleted too: the epochs, not the lock, keep the rounds apart).
        with contextlib.suppress(Exception):
            if _text(await client.get(k.shards_lock) or b"") == token:
                await client.delete(k.shards_lock)


async def _round(app: Conveyor, client: Any, runner: Any, queue: str, shards: list[str]
                 ) -> int | None:
    from .scripts import calls

    k = app.keys(queue)
    layout = parse_layout(queue, await client.hgetall(k.shards))
    if not layout.sharded or layout.garbled:
        # Never sharded (its cap is its own), or its layout is lost or written over (a hand
        # edit, a copy older than the sharding): the shares stay as they are, within the
        # cap they were given, rather than be moved by a cap this round cannot know.
        return 0
    epoch = int(await client.incr(k.shards_epoch))
    read = [await runner.run(calls.shard_allot(app.keys(s), epoch)) for s in shards]
    if any(r.stale for r in read):
        # A shard has seen a newer round than the counter gives: another round overtook
        # this one, or the counter went back (its node restarted from an older copy, or
        # failed over). The counter moves past it, so the next round is not refused too.
        newest = max(r.seen for r in read)
        if newest >= epoch:
            await client.incrby(k.shards_epoch, newest - epoch + 1)
        return None
    cap = layout.concurrency
    if cap is None:  # the cap was removed: so are the shares
        changed = 0
        for shard, r in zip(shards, read, strict=True):
            if r.share is not None:
                await runner.run(calls.shard_allot(app.keys(shard), epoch, None))
                changed += 1
        return changed
    return await _share_out(app, runner, epoch, cap, shards, read)


async def _share_out(app: Conveyor, runner: Any, epoch: int, cap: int, shards: list[str],
                     read: list[Any]) -> int | None:
    """Move the shares toward :func:`targets`: lower first (each shard keeps at least what
    it runs and says what it kept), then raise within what the cap leaves; stop at the
    first shard that a newer round has seen (None). How many shares changed."""
    from .scripts import calls

    want = targets(cap, [(r.running, r.ready) for r in read])
    now = [r.share if r.share is not None else r.running for r in read]
    changed = 0
    for i, shard in enumerate(shards):
        if want[i] < now[i] or read[i].share is None:
            r = await runner.run(calls.shard_allot(app.keys(shard), epoch, want[i]))
            if r.stale:
                return None
            changed += 1
            now[i] = r.share if r.share is not None else now[i]
    room = cap - sum(now)
    for i, shard in enumerate(shards):
        if room <= 0:
            break
        if want[i] > now[i]:
            give = min(want[i] - now[i], room)
            r = await runner.run(calls.shard_allot(app.keys(shard), epoch, now[i] + give))
            if r.stale:
                return None
            changed += 1
            room -= give
            now[i] += give
    return changed
