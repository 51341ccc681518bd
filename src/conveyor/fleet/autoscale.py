"""Autoscaling: how many worker processes a supervisor should run, and why.

The decision is kept apart from how its inputs are read, so it can be reasoned about (and
tested) as a plain function of :class:`Signals`:

* **Scale out** when jobs wait longer than the target: the wait is the larger of the p95
  wait of recently started jobs, the projected wait of the backlog (ready jobs over the
  rate at which the children finish them) and, while nothing finishes, the age of the
  backlog. The step is proportional (a backlog projected to wait 10x the target asks for
  10x the children, up to the maximum), so a burst reaches the maximum in one decision
  instead of one child per cool-down.
* **Scale in** one child at a time, only when every served task type is idle by its
  ``idle_threshold`` and nothing is ready, and only a cool-down after the last change.
* The two conditions are far apart (waits above the target vs. no job finished for a
  whole idle threshold), which is the hysteresis: a load that keeps the children busy
  without queueing holds the count where it is.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import untrusted
from ..monitor.histogram import Histogram
from ..monitor.stats import bucket_starts, merge, parse_window, queue_window

if TYPE_CHECKING:
    from ..app import Conveyor

__all__ = ["Autoscaler", "Decision", "SignalReader", "Signals"]

log = logging.getLogger("conveyor.supervisor")
SETTLE_SECONDS = 2.0  # after a scale-out, let new children start before judging again


@dataclass(frozen=True, slots=True)
class Signals:
    """What the supervisor observed at one instant.

    :param ready: jobs ready (not delayed) in the served queues
    :param rate: jobs/s the children finished recently
    :param p95_wait: p95 wait (s) of jobs started recently, None when unknown
    :param backlog_age: seconds the ready count has been above zero
    :param saturated: every child runs as many jobs as its concurrency allows
    :param idle: every served task type is idle by its idle threshold
    :param advice: workers the monitor's advice asks for, None when not available
    """

    ready: int
    rate: float
    p95_wait: float | None
    backlog_age: float
    saturated: bool
    idle: bool
    advice: int | None = None

    def projected_wait(self) -> float | None:
        """Seconds the last ready job would wait at the current rate (None: unknown)."""
        if self.ready <= 0:
            return 0.0
        if self.rate > 0:
            return self.ready / self.rate
        return None

    def wait(self) -> float:
        """The wait the decision acts on (see the module docstring)."""
        projected = self.projected_wait()
        observed = self.p95_wait or 0.0
        if projected is None:  # nothing finishes yet: the backlog's age is all we know
            return max(observed, self.backlog_age)
        return max(observed, projected)


@dataclass(frozen=True, slots=True)
class Decision:
    """A change of the number of children, with the reason in plain words."""

    before: int
    after: int
    reason: str

    @property
    def action(self) -> str:
        return "scale out" if self.after > self.before else "scale in"


class Autoscaler:
    """Decides the number of children between ``minimum`` and ``maximum``.

    :param minimum: fewest children, also the count at start
    :param maximum: most children
    :param target_wait: seconds a job may wait before more children are started
    :param cooldown: seconds between a change and the next scale-in step
    """

    def __init__(self, minimum: int, maximum: int, target_wait: float = 2.0,
                 cooldown: float = 30.0) -> None:
        if not 1 <= minimum <= maximum:
            raise ValueError(f"autoscale bounds must satisfy 1 <= MIN <= MAX, got"
                             f" {minimum}:{maximum}")
        if target_wait <= 0:
            raise ValueError(f"target wait must be positive, got {target_wait}")
        self.minimum = minimum
        self.maximum = maximum
        self.target_wait = target_wait
        self.cooldown = cooldown
        self._last_out = -math.inf
        self._last_change = -math.inf

    def decide(self, current: int, signals: Signals, now: float) -> Decision | None:
        """The change to make now (None: keep ``current``).

        :param current: children running (not counting ones already draining)
        :param signals: what was observed
        :param now: monotonic seconds
        """
        if current < self.minimum:
            return self._change(current, self.minimum, now, f"below the minimum of"
                                f" {self.minimum}")
        out = self._scale_out(current, signals, now)
        if out is not None:
            return out
        return self._scale_in(current, signals, now)

    def _change(self, before: int, after: int, now: float, reason: str) -> Decision:
        if after > before:
            self._last_out = now
        self._last_change = now
        return Decision(before, after, reason)

    def _scale_out(self, current: int, s: Signals, now: float) -> Decision | None:
        if current >= self.maximum or s.ready <= 0 or now - self._last_out < SETTLE_SECONDS:
            return None
        wait = s.wait()
        wanted = 0
        reasons = []
        if wait > self.target_wait:
            wanted = max(current + 1, math.ceil(current * wait / self.target_wait))
            reasons.append(f"jobs wait {wait:.1f} s (target {self.target_wait:g} s) with"
                           f" {s.ready} ready at {s.rate:.1f} jobs/s")
        if s.advice is not None and s.advice > current and s.saturated:
            wanted = max(wanted, s.advice)
            reasons.append(f"the advice asks for {s.advice} workers")
        if wanted <= current:
            return None
        return self._change(current, min(self.maximum, wanted), now, "; ".join(reasons))

    def _scale_in(self, current: int, s: Signals, now: float) -> Decision | None:
        if current <= self.minimum or not s.idle or s.ready > 0:
            return None
        if now - self._last_change < self.cooldown:
            return None
        return self._change(current, current - 1, now,
                            "the served task types are idle and nothing is ready")


P95_WINDOW = 20.0  # seconds of recently started jobs the observed p95 wait covers


class SignalReader:
    """Reads the queues' signals from Redis for :class:`Autoscaler`.

    The ready count and the p95 wait come from the queues' counters and metric buckets
    (one pipelined round trip); the monitor's ``advice`` is asked too when it exists.

    :param app: the application
    :param queues: the queues the children serve
    :param target_wait: passed on to the monitor's advice
    """

    def __init__(self, app: Conveyor, queues: Sequence[str], target_wait: float) -> None:
        self.app = app
        self.queues = list(queues)
        self.target_wait = target_wait
        self.tasks = [t.name for t in app.tasks.values() if t.queue in self.queues]

    def backlog(self, now: float) -> tuple[int, float | None]:
        """(ready jobs, p95 wait of recently started jobs) across the served queues. Ready
        jobs that a limit holds back are left out: more children would not start them
        (no scale-out into a cap).

        :param now: server epoch seconds
        """
        starts = bucket_starts(now, P95_WINDOW, self.app.limits.bucket_seconds)
        keys = {q: self.app.keys(q) for q in self.queues}
        with self.app.redis.pipeline(transaction=False) as pipe:
            sent = []
            for k in keys.values():
                pipe.hget(k.counts, "ready")
                sent.append(queue_window(pipe, k, starts))
            replies = iter(pipe.execute())
        ready, waits = 0, Histogram()
        for n in sent:
            ready += max(0, untrusted.integer(next(replies)))
            window = parse_window([next(replies) for _ in range(n)])
            waits.merge(merge([window]).wait)
        return max(0, ready - self._held()), waits.quantile(0.95)

    def _held(self) -> int:
        from ..monitor.flow import read_flow

        held = 0
        for queue in self.queues:
            k = self.app.keys(queue)
            if self.app.redis.exists(k.limits, k.paused):
                held += read_flow(self.app.redis, k).held
        return held

    def idle(self) -> bool:
        """Every served task type is idle by its own threshold (monitor.is_idle)."""
        return all(self.app.monitor.is_idle(task) for task in self.tasks)

    def advice(self) -> int | None:
        """Workers the monitor's advice asks for, summed over the queues (None: none)."""
        advise = getattr(self.app.monitor, "advice", None)
        if advise is None:
            return None
        try:
            return sum(int(advise(queue=q, target_wait=self.target_wait).workers_needed)
                       for q in self.queues)
        except Exception as exc:  # advice is an input among others, never fatal
            log.debug("advice unavailable: %s", exc)
            return None
