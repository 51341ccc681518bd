"""Periodic jobs: cron schedules (UTC) that fire exactly once per tick however many
workers run.

Every worker that serves a periodic's queue arms a timer, from the server's clock, for
the next tick; at the tick each of them calls the enqueue script with a claim on that
tick, and the script stores the job only for the first caller, with the tick in the
record's ``tick`` field. After an outage, the missed ticks
fire once (for the latest of them), or each of them when ``catch_up=True``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis.exceptions
from croniter import croniter

from .errors import ConfigurationError
from .scripts import calls

if TYPE_CHECKING:
    from .app import Conveyor
    from .task import Task
    from .worker.clock import ServerClock

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
        task = periodic.task
        claim = calls.Claim(periodic.name, round(tick * 1000), only_if_seen)
        call = calls.enqueue(self.app.keys(task.queue), task._spec(), [task._new_job((), {})],
                             self.app.limits, claim=claim)
        stored = await self.app.ascripts().run(call)
        if stored:
            self.fired += 1
            log.info("fired %s for tick %.3f", periodic.name, tick)
        return bool(stored)

    async def _catch_up(self, periodic: Periodic, now: float) -> None:
        latest = periodic.latest_at_or_before(now)
        if not periodic.catch_up:
            await self.fire(periodic, latest, only_if_seen=True)
            return
        key = self.app.keys(periodic.task.queue).schedule_prefix + periodic.name
        last = await self.app.aredis().get(key)
        if last is None:
            await self.fire(periodic, latest, only_if_seen=True)
            return
        for tick in periodic.ticks_between(int(last) / 1000, now):
            await self.fire(periodic, tick)

    async def run(self) -> None:
        """Fire ticks as they come, until cancelled."""
        if not self.periodics:
            return
        await self._sync_clock()
        for periodic in self.periodics:
            await self._catch_up(periodic, self.clock.now())
        failures = 0
        while True:
            now = self.clock.now()
            upcoming = sorted((p.next_after(now), i) for i, p in enumerate(self.periodics))
            tick = upcoming[0][0]
            await asyncio.sleep(max(0.0, tick - self.clock.now()))
            try:
                for due, i in upcoming:
                    if due <= tick:
                        await self.fire(self.periodics[i], due)
                failures = 0
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                failures += 1
                log.warning("could not fire periodic jobs (%s); catching up when back", exc)
                await asyncio.sleep(min(5.0, 0.1 * 2**failures))
                for periodic in self.periodics:
                    await self._catch_up(periodic, self.clock.now())

    async def _sync_clock(self) -> None:
        sec, usec = await self.app.aredis().time()
        self.clock.observe(sec * 1000 + usec / 1000)
