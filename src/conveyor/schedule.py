"""Periodic jobs: cron schedules (UTC) that fire exactly once per tick however many
workers run.

Every worker that serves a periodic's queue arms a timer, from the server's clock, for
the next tick; at the tick each of them enqueues the job (through
:mod:`conveyor.producer`, as every producer does) with a claim on that tick, and the
enqueue script stores it only for the first caller, with the tick in the record's ``tick``
field. After an outage, the missed ticks fire once (for the latest of them), or each of
them when ``catch_up=True``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis.exceptions
from croniter import croniter

from . import producer
from .errors import ConfigurationError
from .scripts import calls

if TYPE_CHECKING:
    from .app import Conveyor
    from .clock import ServerClock
    from .task import Task

# Every error Redis or the way to it can produce (as in the worker's other loops).
REDIS_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError)


def pause_after(failures: int) -> float:
    """Seconds to wait after ``failures`` consecutive failures (capped at 5 s)."""
    return float(min(5.0, 0.05 * 2 ** min(failures, 16)))


log = logging.getLogger("conveyor.schedule")
MAX_CATCH_UP = 1000  # most missed ticks fired at once with catch_up=True


def _cron(expr: str, start: float) -> croniter:
    fields = expr.split()
    return croniter(expr, start, second_at_beginning=len(fields) == 6)


@dataclass(frozen=True)
class Periodic:
    """A task fired on a cron schedule.

    :param task: the task to enqueue (called without arguments)
    :param cron: five fields (minute precision) or six (the first is seconds), in UTC
    :param catch_up: after an outage, fire every missed tick instead of the latest one
    """

    task: Task[Any, Any]
    cron: str
    catch_up: bool = False

    def __post_init__(self) -> None:
        fields = self.cron.split()
        if len(fields) not in (5, 6) or not croniter.is_valid(
            self.cron, second_at_beginning=len(fields) == 6
        ):
            raise ConfigurationError(
                f"invalid cron expression {self.cron!r} for {self.task.name}: use five fields"
                " (minute hour day month weekday) or six with seconds first"
            )

    @property
    def name(self) -> str:
        return self.task.name

    def next_after(self, epoch: float) -> float:
        """The first tick strictly after ``epoch`` (epoch seconds)."""
        return float(_cron(self.cron, epoch).get_next(float))

    def latest_at_or_before(self, epoch: float) -> float:
        """The latest tick at or before ``epoch``."""
        it = _cron(self.cron, epoch + 1e-6)
        return float(it.get_prev(float))

    def ticks_between(self, after: float, until: float) -> list[float]:
        """Ticks in ``(after, until]``, at most :data:`MAX_CATCH_UP` of the latest."""
        it, ticks = _cron(self.cron, after), []
        while (tick := float(it.get_next(float))) <= until:
            ticks.append(tick)
        return ticks[-MAX_CATCH_UP:]


class Scheduler:
    """Fires the periodic jobs of the queues one worker serves."""

    def __init__(self, app: Conveyor, queues: list[str], clock: ServerClock) -> None:
        self.app = app
        self.clock = clock
        self.periodics = [p for p in app.periodics if p.task.queue in queues]
        self.fired = 0

    async def fire(self, periodic: Periodic, tick: float, only_if_seen: bool = False) -> bool:
        """Enqueue ``periodic``'s job for ``tick`` unless another worker already did."""
        claim = calls.Claim(periodic.name, round(tick * 1000), only_if_seen)
        stored = await producer.aenqueue(periodic.task, [((), {})], claim=claim)
        if stored:
            self.fired += 1
            log.info("fired %s for tick %.3f", periodic.name, tick)
        return bool(stored)

    async def _catch_up(self, periodic: Periodic, now: float) -> None:
        latest = periodic.latest_at_or_before(now)
        if not periodic.catch_up:
            await self.fire(periodic, latest, only_if_seen=True)
            return
        key = self.app.keys(periodic.task.queue).schedule(periodic.name)
        last = _tick_ms(await self.app.aredis().get(key))
        if last is None:
            await self.fire(periodic, latest, only_if_seen=True)
            return
        for tick in periodic.ticks_between(last / 1000, now):
            await self.fire(periodic, tick)

    async def run(self) -> None:
        """Fire ticks as they come, until cancelled. Redis errors of any kind (unreachable,
        out of memory, read-only during a failover...) are waited out; the ticks missed
        meanwhile are caught up once Redis answers again."""
        if not self.periodics:
            await asyncio.Event().wait()  # nothing to fire: idle until the worker stops
        failures = 0
        caught_up = False
        while True:
            try:
                if not caught_up:
                    await self._sync_clock()
                    for periodic in self.periodics:
                        await self._catch_up(periodic, self.clock.now())
                    caught_up = True
                await self._fire_next()
                failures = 0
            except REDIS_ERRORS as exc:
                failures += 1
                pause = pause_after(failures)
                log.warning("could not fire periodic jobs (%s: %s); catching up in %.2f s",
                            type(exc).__name__, exc, pause)
                await asyncio.sleep(pause)
                caught_up = False

    async def _fire_next(self) -> None:
        now = self.clock.now()
        upcoming = sorted((p.next_after(now), i) for i, p in enumerate(self.periodics))
        tick = upcoming[0][0]
        await asyncio.sleep(max(0.0, tick - self.clock.now()))
        for due, i in upcoming:
            if due <= tick:
                await self.fire(self.periodics[i], due)

    async def _sync_clock(self) -> None:
        await self.clock.arefresh(self.app.aredis())


def _tick_ms(raw: Any) -> int | None:
    """A stored last tick (ms), or None when absent or mangled (then only the latest tick
    fires, as on a first start)."""
    try:
        return int(raw) if raw is not None else None
    except (TypeError, ValueError):
        log.warning("the latest tick claimed for a periodic job is not a number: %r", raw)
        return None
