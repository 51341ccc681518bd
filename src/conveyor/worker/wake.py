"""Waking idle workers: a marker on a queue's wake key means "there may be work".

An idle worker blocks on its queues' wake keys (one BLPOP for all of them), so it sends
a few commands a minute and starts new work within milliseconds of its enqueue. On a
Redis Cluster one BLPOP may only name keys of one slot, so there the worker blocks once
per slot its queues hash to (in practice once per queue), each as cheap as the one BLPOP.

An idle worker with free slots also waits for jobs handed to it (:mod:`.handoff`): it is
registered as a waiter of its queues and blocks on its own hand-off lists in the same
BLPOP, so an enqueue that finds it leases the new job to it and the pop returns the job
ready to run, with no fetch in between. The registration costs little while idle: the
worker's own fetch makes it, and a renewal every few seconds (one command per queue) keeps
it from lapsing while the worker lives.

A marker wakes one worker, so no worker may sit on one: a worker that is stopping or has
no free slot passes the marker on, and a stopping worker leaves one behind for each of
its queues (a marker popped as it stopped would otherwise be lost with its connection).
Markers can still be lost (a worker killed between taking one and acting on it), so
after each quiet spell every idle worker looks for itself: at the ready backlog, the
earliest delayed job and the earliest lease deadline of each queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.crc import key_slot

from .. import clients
from .backoff import REDIS_ERRORS, pause_after
from .handoff import Waiting
from .handoff import parse as parse_handoff

if TYPE_CHECKING:
    from ..clock import ServerClock
    from .consumer import Consumer
    from .handback import HandBack
    from .slots import Slots

log = logging.getLogger("conveyor.worker")
WAKE_BLOCK_SECONDS = 20.0  # longest BLPOP; after each quiet spell the queues are looked at
SHUNNED_LOOK_SECONDS = 1.0  # a queue whose wake key is written over is looked at this often


@dataclass(frozen=True, slots=True)
class Listening:
    """What the wake listener works with.

    :param url: the Redis URL (the listener opens a client of its own)
    :param queues: the queues whose wake keys it blocks on
    :param keys: queue name -> its key names
    :param runner: the async script runner (registrations as a waiter)
    :param waiting: the worker's registrations as a waiter
    :param slots: the running set (its free slots, and when one comes free)
    :param consumer: told of what the listener learns; says when the worker stops
    :param hand_back: hands back what was handed over beyond the free slots
    :param clock: the server's clock as the worker reads it
    """

    url: str
    queues: Sequence[str]
    keys: Callable[[str], Any]
    runner: Any
    waiting: Waiting
    slots: Slots
    consumer: Consumer
    hand_back: HandBack
    clock: ServerClock


async def listen_for_wakeups(parts: Listening) -> None:
    """Block on the queues' wake keys; a marker means "there may be work"."""
    # A client of its own: its socket timeout must outlast the longest block.
    client = clients.async_client(
        parts.url, socket_timeout=WAKE_BLOCK_SECONDS + 5, socket_connect_timeout=5
    )
    try:
        if clients.is_cluster(parts.url):
            await asyncio.gather(*(_wait_for_markers(parts, client, queues)
                                   for queues in _by_slot(parts.queues, parts.keys)))
        else:
            await _wait_for_markers(parts, client, parts.queues)
    finally:
        await client.aclose()


def _by_slot(queues: Sequence[str], keys: Callable[[str], Any]) -> list[list[str]]:
    """``queues`` grouped by the cluster slot of their wake keys."""
    groups: dict[int, list[str]] = {}
    for queue in queues:
        groups.setdefault(key_slot(keys(queue).wake.encode()), []).append(queue)
    return list(groups.values())


async def _wait_for_markers(parts: Listening, client: Any, queues: Sequence[str]) -> None:
    wake_keys = {parts.keys(q).wake: q for q in queues}
    handoffs = parts.waiting.lists(queues)
    runner = parts.runner
    failures = 0
    # Keys of these lists found holding another type (written over by hand): one such key
    # fails every BLPOP that names it, so it is left out, and its queue looked at now and
    # then instead, until it is a list again.
    shunned: set[str] = set()
    notes = _Notes()
    while True:
        try:
            if parts.consumer.stopping:
                await asyncio.Event().wait()  # a stopping worker takes no more markers
            _answered_after(failures, await _offer_free_slots(parts, runner, queues))
            # Hand-off lists too when full: a job handed on an offer that went stale is
            # handed back at once rather than wait for a free slot.
            reply = await _pop(client, [key for key in (*handoffs, *wake_keys)
                                        if key not in shunned],
                               SHUNNED_LOOK_SECONDS if shunned else WAKE_BLOCK_SECONDS)
            if reply is None:
                if shunned:
                    # Those still of another type stay out (a failed read: all go back
                    # in, and the next wait finds them again).
                    shunned &= (await _mistyped(client, dict.fromkeys(shunned, "list"))).keys()
                    for key in shunned & wake_keys.keys():
                        parts.consumer.look_again(wake_keys[key])
                refused = await look_for_work(parts, client, queues)
                if refused:
                    expected = _looked_at(parts, queues)
                    notes.warn(await _mistyped(client, {k: expected[k] for k in refused}),
                               "read as nothing while looking for work")
            elif _text(reply[0]) in handoffs:
                await _take_handed(parts, handoffs[_text(reply[0])], reply[1])
            elif parts.consumer.stopping or parts.slots.free() <= 0:
                await _pass_on(client, reply[0])
                await _wait_for_a_free_slot(parts)
            else:
                parts.consumer.wake_all()
            failures = 0
        except REDIS_ERRORS as exc:
            if str(exc).startswith("WRONGTYPE"):  # name the key: Redis's error does not
                lists = dict.fromkeys((*wake_keys, *handoffs), "list")
                wrong = await _mistyped(client, lists)
                if wrong:  # left out from now on: no pause, the other queues wait on
                    shunned |= wrong.keys()
                    notes.warn(wrong, "left out of the wait for wake-ups: its queue is looked"
                                      f" at every {SHUNNED_LOOK_SECONDS:g} s until it is a list")
                    parts.consumer.wake_all()
                    continue
            failures += 1
            pause = pause_after(failures)
            log.log(logging.WARNING if failures > 3 else logging.DEBUG,
                    "wake listener: %s: %s; retrying in %.2f s", type(exc).__name__, exc, pause)
            await asyncio.sleep(pause)
            parts.consumer.wake_all()  # markers may have been missed meanwhile


def _answered_after(failures: int, called: bool) -> None:
    """When a call went through after ``failures`` failed ones, say Redis is back (the
    worker's log folds this into one line per outage: see
    :class:`conveyor.logs.OutageFilter`)."""
    if failures and called:
        log.info("wake listener: Redis answers again", extra={"redis_back": True})


async def _offer_free_slots(parts: Listening, runner: Any, queues: Sequence[str]) -> bool:
    """Register as a waiter of ``queues`` with the worker's free slots, if any, once its
    own fetches are done (an offer made during one would count slots it is filling).
    True if Redis answered an offer."""
    if parts.slots.free() <= 0:
        return False
    await parts.consumer.idle.wait()
    slots = parts.slots.free()
    if slots <= 0 or parts.consumer.stopping:
        return False
    now = await parts.waiting.register(runner, queues, slots)
    if now is None:
        return False  # every offer stood: nothing was sent
    parts.clock.observe(now)
    return True


async def _pop(client: Any, keys: list[str], block: float) -> Any:
    """BLPOP ``keys`` for up to ``block`` seconds (with none, just wait that long)."""
    if keys:
        return await client.blpop(keys, timeout=block)
    await asyncio.sleep(block)
    return None


async def _take_handed(parts: Listening, queue: str, entry: bytes) -> None:
    """Start the jobs an enqueue handed over; hand back those beyond the free slots."""
    parts.waiting.offered(queue, 0)  # the enqueue used the registration
    handed = parse_handoff(entry)
    if handed is None:
        return
    extra = parts.consumer.take_handed(queue, handed)
    if extra:
        await parts.hand_back(queue, [(job.short_id, job.token) for job in extra])


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def _pass_on(client: Any, wake_key: Any) -> None:
    """Put a marker back for another worker (the list keeps at most one)."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.lpush(wake_key, b"1").ltrim(wake_key, 0, 0)
        await pipe.execute()


async def _wait_for_a_free_slot(parts: Listening) -> None:
    # Before a slot is free this worker would take its own marker back, again and again.
    while parts.slots.free() <= 0 and not parts.consumer.stopping:
        parts.slots.freed.clear()
        await parts.slots.freed.wait()


async def leave_markers(client: Any, keys: Callable[[str], Any], queues: Sequence[str]
                        ) -> None:
    """On the way out: one marker per queue, for the marker this worker may have taken as
    it stopped (best effort; the other workers' own checks are the backstop)."""
    with contextlib.suppress(*REDIS_ERRORS):
        async with asyncio.timeout(2.0):
            for queue in queues:
                await _pass_on(client, keys(queue).wake)


async def look_for_work(parts: Listening, client: Any, queues: Sequence[str]) -> list[str]:
    """After a quiet spell, read each queue's ready backlog, earliest delayed job and
    earliest lease deadline (three commands per queue, pipelined). A wake-up can be lost —
    its worker died or left before acting — and a worker that dies holding jobs wakes
    nobody: without this, such work would wait for an unrelated enqueue. A key of the wrong
    type (written over by hand) tells nothing, and the other keys are read all the same:
    returns those keys. Any other refusal raises."""
    looked = list(_looked_at(parts, queues))  # per queue: counts, delayed, leases
    async with client.pipeline(transaction=False) as pipe:
        for i in range(0, len(looked), 3):
            pipe.hget(looked[i], "ready")
            pipe.zrange(looked[i + 1], 0, 0, withscores=True)
            pipe.zrange(looked[i + 2], 0, 0, withscores=True)
        replies = await pipe.execute(raise_on_error=False)
    refused = [key for key, reply in zip(looked, replies, strict=True)
               if isinstance(reply, Exception)]
    for reply in replies:
        if isinstance(reply, Exception) and not str(reply).startswith("WRONGTYPE"):
            raise reply
    for i, queue in enumerate(queues):
        ready, delayed, leases = replies[3 * i: 3 * i + 3]
        if not isinstance(ready, Exception) and _number(ready) > 0:
            parts.consumer.look_again(queue)
        for first in (delayed, leases):
            if first and not isinstance(first, Exception):
                parts.consumer.due_at(queue, float(first[0][1]))
    return refused


def _looked_at(parts: Listening, queues: Sequence[str]) -> dict[str, str]:
    """The keys :func:`look_for_work` reads, with their types, in its order."""
    out = {}
    for queue in queues:
        k = parts.keys(queue)
        out.update({k.counts: "hash", k.delayed: "zset", k.leases: "zset"})
    return out


class _Notes:
    """Warnings about keys written over, each logged at most once a minute."""

    EVERY_S = 60.0

    def __init__(self) -> None:
        self._said: dict[str, float] = {}

    def warn(self, wrong: dict[str, str], then: str) -> None:
        """:param wrong: key -> what is wrong with it
        :param then: what the listener does about it"""
        now = time.monotonic()
        for key, text in wrong.items():
            if now - self._said.get(key, -self.EVERY_S) >= self.EVERY_S:
                self._said[key] = now
                log.warning("wake listener: %s; %s", text, then)


async def _mistyped(client: Any, expected: dict[str, str]) -> dict[str, str]:
    """Which of ``expected`` (key -> type) hold another type: key -> a phrase naming it;
    best effort (nothing when they cannot be read)."""
    try:
        async with client.pipeline(transaction=False) as pipe:
            for key in expected:
                pipe.type(key)
            kinds = [_text(kind) for kind in await pipe.execute()]
    except REDIS_ERRORS:
        return {}
    return {key: f"key {key} holds a {kind} where a {want} belongs: written over by hand?"
            for (key, want), kind in zip(expected.items(), kinds, strict=True)
            if kind not in ("none", want)}


def _number(value: Any) -> float:
    try:
        return float(value or 0)
    except (TypeError, ValueError):
        return 0.0
