"""The supervisor: one parent process running N worker processes, and the only place that
decides how many there are.

* A child that dies (crash, SIGKILL, out of memory) is replaced at once; when children
  keep dying the replacements back off exponentially. The dead child's leased jobs come
  back through lease expiry, so nothing is lost.
* A child holding a thread stuck in a sync task past its ``timeout`` (which Python cannot
  interrupt) is drained and replaced: its replacement starts at once, the child stops
  fetching, finishes or hands back its other jobs, and exits, taking the thread with it.
  The overrun job was already failed with reason ``timeout`` (retried or dead).
* ``--max-jobs-per-child`` / ``--max-memory-per-child`` recycle children the same way.
* SIGTERM/SIGINT drain every child gracefully; a second signal stops them at once.
* With an :class:`~conveyor.fleet.autoscale.Autoscaler`, the number of children follows
  the queues' signals between a minimum and a maximum. Decisions are logged and published
  in Redis, where ``conveyor info`` shows them.

Children report to the parent over a pipe, so watching them costs Redis nothing; Redis is
read only while scaling could change something (children saturated, or idle above MIN).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import socket
import time
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import wait
from types import FrameType
from typing import TYPE_CHECKING, Any

import redis.exceptions

from ..clock import ServerClock
from ..loading import import_app
from . import child as child_process
from .autoscale import Autoscaler, Decision, SignalReader, Signals
from .child import Child, describe_exit
from .published import HEARTBEAT_SECONDS, Publisher

if TYPE_CHECKING:
    from ..app import Conveyor

__all__ = ["Supervisor"]

log = logging.getLogger("conveyor.supervisor")
TICK = 0.25  # longest wait for a child's report or exit
EVALUATE_SECONDS = 1.0  # autoscaling looks at the queues at most this often
ADVICE_SECONDS = 5.0
RATE_WINDOW = 3.0  # seconds over which the children's finishing rate is measured
KILL_MARGIN = 10.0  # beyond the grace period before a draining child is killed
FORCE_SECONDS = 5.0  # after a second signal, before children are killed
CRASH_WINDOW = 10.0  # a child dying within this of the previous crash backs off
BACKOFF_MAX = 30.0
DECISIONS_KEPT = 50  # kept in memory (Redis keeps its own capped list)
ERRORS = (redis.exceptions.RedisError, OSError)


class Supervisor:
    """Runs and scales worker processes for the application ``app_spec`` names.

    :param app_spec: ``MODULE:APP``; each child imports the application by it
    :param processes: children to run (without autoscaling)
    :param autoscale: ``(MIN, MAX)`` children, scaled on the queues' signals
    :param target_wait: seconds a job may wait before autoscaling adds children
    :param cooldown: seconds between scale-in steps (default: the shortest idle threshold
        of the served task types, between 2 and 60 s)
    :param queues: queues the children serve (default: every queue of the app's tasks)
    :param concurrency: jobs at once per child
    :param grace: seconds a draining child's running jobs get to finish
    :param burst: children exit once nothing is ready; the supervisor exits after them
    :param max_jobs_per_child: recycle a child after this many jobs
    :param max_memory_per_child: recycle a child whose resident memory exceeds this (bytes)
    :param app: the application, when already loaded
    :param verbose: log verbosity of the children (see :func:`conveyor.logs.configure`)
    :param log_format: the children's log lines: ``text`` or ``json``
    """

    def __init__(self, app_spec: str, *, processes: int = 1,
                 autoscale: tuple[int, int] | None = None, target_wait: float = 2.0,
                 cooldown: float | None = None, queues: Sequence[str] = (),
                 concurrency: int = 32, grace: float = 30.0, burst: bool = False,
                 max_jobs_per_child: int | None = None,
                 max_memory_per_child: int | None = None, app: Conveyor | None = None,
                 verbose: int = 0, log_format: str = "text") -> None:
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        if app is None:
            app = import_app(app_spec)
        self.app = app
        self.id = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"
        self.queues = list(queues) or app.queues() or ["default"]
        self.concurrency = concurrency
        self.grace = grace
        self.burst = burst
        self.max_memory = max_memory_per_child
        self.options = child_process.ChildOptions(
            app_spec=app_spec, queues=tuple(self.queues), concurrency=concurrency,
            grace=grace, burst=burst, max_jobs=max_jobs_per_child, supervisor_id=self.id,
            verbose=verbose, log_format=log_format)
        self.scaler: Autoscaler | None = None
        self.reader: SignalReader | None = None
        self.target = processes
        if autoscale is not None:
            self.reader = SignalReader(app, self.queues, target_wait)
            self.scaler = Autoscaler(autoscale[0], autoscale[1], target_wait,
                                     cooldown if cooldown is not None else self._cooldown())
            self.target = autoscale[0]
        self.children: list[Child] = []
        self.decisions: deque[dict[str, Any]] = deque(maxlen=DECISIONS_KEPT)
        self.signals: Signals | None = None
        self._spawned = 0
        self._finished = 0  # jobs processed by all children, from their reports
        self._rates: deque[tuple[float, int]] = deque()
        self._stop_requests = 0
        self._stops_sent = 0
        self._drained = False  # burst: a child found nothing left, start no more
        self._not_before = 0.0  # crash back-off: no spawn before this (monotonic)
        self._backoff = 0.0
        self._last_crash = -math.inf
        self._ready_since: float | None = None
        self._last_evaluation = -math.inf
        self._last_advice: tuple[float, int | None] = (-math.inf, None)
        self._last_publish = -math.inf
        self._dirty = True
        self.clock = ServerClock()  # the local clock until run() reads the server's
        self._started_at = self.clock.now()
        self.publisher = Publisher(app, self.id)

    def _cooldown(self) -> float:
        thresholds = [t.idle_threshold for t in self.app.tasks.values() if t.queue in self.queues]
        return min(60.0, max(2.0, min(thresholds, default=60.0)))

    # -- running ---------------------------------------------------------------------------

    @property
    def active(self) -> list[Child]:
        """Children not asked to drain."""
        return [c for c in self.children if c.retiring is None]

    def run(self) -> int:
        """Supervise until stopped by a signal (or, with ``burst``, until the work is done)."""
        previous = {sig: signal.signal(sig, self._on_signal)
                    for sig in (signal.SIGTERM, signal.SIGINT)}
        self._sync_clock()
        log.info("supervisor %s: %s, serving %s with concurrency %d per process", self.id,
                 self._describe_scaling(), self.queues, self.concurrency)
        try:
            while self.children or not (self._stop_requests or self._drained):
                self._tick()
        finally:
            for c in self.children:  # only after an error: nothing may outlive us
                c.process.kill()
                c.process.wait()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._unpublish()
        log.info("supervisor %s stopped; children ran %d jobs", self.id, self._finished)
        return 0

    def _describe_scaling(self) -> str:
        if self.scaler is None:
            return f"{self.target} worker process(es)"
        return (f"autoscaling {self.scaler.minimum}..{self.scaler.maximum} worker processes"
                f" for a target wait of {self.scaler.target_wait:g} s")

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop_requests += 1

    def _tick(self) -> None:
        handles = [c.conn for c in self.children]  # readable on a report, or at exit (EOF)
        if handles:
            wait(handles, timeout=TICK)
        else:
            time.sleep(TICK)
        now = time.monotonic()
        self._read_reports()
        self._reap(now)
        if self._stop_requests:
            self._stop_children(now)
        else:
            self._check_health(now)
            if self.scaler is not None:
                self._autoscale(now)
            self._fill(now)
        self._kill_overdue(now)
        self._publish(now)

    # -- children --------------------------------------------------------------------------

    def _spawn(self, now: float) -> None:
        self._spawned += 1
        c = Child.start(self._spawned, self.options, now)
        self.children.append(c)
        self._dirty = True
        log.info("started worker process %d (pid %s)", c.number, c.pid)

    def _fill(self, now: float) -> None:
        if self._drained:
            return
        while len(self.active) < self.target and now >= self._not_before:
            self._spawn(now)

    def _read_reports(self) -> None:
        for c in self.children:
            c.read()
            processed = int(c.report.get("processed", 0))
            self._finished += processed - c.counted
            c.counted = processed

    def _reap(self, now: float) -> None:
        for c in [c for c in self.children if c.process.poll() is not None]:
            c.read()
            c.conn.close()
            self.children.remove(c)
            self._dirty = True
            self._on_exit(c, c.process.returncode, now)

    def _on_exit(self, c: Child, code: int, now: float) -> None:
        lived = now - c.started
        ran = f"after {lived:.1f} s and {c.counted} jobs"
        if code == child_process.EXIT_RECYCLE:
            self._event("recycle", f"worker process {c.number} (pid {c.pid}) ran its jobs"
                        f" per child and exited {ran}: replacing it")
        elif c.retiring is not None or self._stop_requests:
            log.info("worker process %d (pid %s) exited with %s %s", c.number, c.pid,
                     describe_exit(code), ran)
        elif self.burst and code == child_process.EXIT_OK:
            log.info("worker process %d (pid %s) found no work left %s", c.number, c.pid, ran)
            self._drained = True
        else:
            self._backoff = (min(BACKOFF_MAX, max(0.5, self._backoff * 2))
                             if now - self._last_crash < CRASH_WINDOW else 0.0)
            self._last_crash = now
            self._not_before = now + self._backoff
            self._event("restart", f"worker process {c.number} (pid {c.pid}) died"
                        f" ({describe_exit(code)}) {ran}: replacing it"
                        + (f" in {self._backoff:g} s" if self._backoff else " at once"))

    def _retire(self, c: Child, reason: str, now: float) -> None:
        c.retiring = reason
        self._terminate(c, now + self.grace + KILL_MARGIN)
        self._dirty = True

    def _terminate(self, c: Child, kill_at: float) -> None:
        c.terms += 1
        c.kill_at = kill_at if c.kill_at is None else min(c.kill_at, kill_at)
        with contextlib.suppress(ProcessLookupError):
            os.kill(c.pid, signal.SIGTERM)

    def _check_health(self, now: float) -> None:
        for c in self.active:
            stuck = c.report.get("stuck") or {}
            rss = int(c.report.get("rss", 0))
            if stuck:
                job = next(iter(stuck))
                self._retire(c, "stuck thread", now)
                self._event("replace", f"worker process {c.number} (pid {c.pid}) holds a"
                            f" thread stuck in job {job} past its timeout: draining it and"
                            " starting a replacement")
            elif self.max_memory is not None and rss > self.max_memory:
                self._retire(c, "memory", now)
                self._event("recycle", f"worker process {c.number} (pid {c.pid}) uses"
                            f" {rss / 2**20:.0f} MiB, over the {self.max_memory / 2**20:.0f}"
                            " MiB per child: draining it and starting a replacement")

    def _stop_children(self, now: float) -> None:
        if self._stops_sent == 0:
            log.warning("stopping %d worker process(es) gracefully (up to %g s; a second"
                        " signal stops them at once)", len(self.children), self.grace)
            for c in self.children:
                if c.terms == 0:
                    self._terminate(c, now + self.grace + KILL_MARGIN)
            self._stops_sent = 1
        if self._stop_requests >= 2 and self._stops_sent < 2:
            log.warning("second stop request: stopping worker processes at once (their"
                        " jobs are retried)")
            for c in self.children:
                while c.terms < 2:
                    self._terminate(c, now + FORCE_SECONDS)
            self._stops_sent = 2

    def _kill_overdue(self, now: float) -> None:
        for c in self.children:
            if c.kill_at is not None and now >= c.kill_at and c.process.poll() is None:
                log.warning("worker process %d (pid %s) did not stop in time: killing it (its"
                            " leased jobs come back when their leases expire)", c.number, c.pid)
                c.process.kill()
                c.kill_at = math.inf

    # -- autoscaling -----------------------------------------------------------------------

    def _rate(self, now: float) -> float:
        self._rates.append((now, self._finished))
        while len(self._rates) > 2 and now - self._rates[1][0] >= RATE_WINDOW:
            self._rates.popleft()
        (t0, n0), (t1, n1) = self._rates[0], self._rates[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0

    def _autoscale(self, now: float) -> None:
        assert self.scaler is not None and self.reader is not None
        if now - self._last_evaluation < EVALUATE_SECONDS:
            return
        self._last_evaluation = now
        active = self.active
        rate = self._rate(now)
        saturated = bool(active) and all(c.jobs >= self.concurrency for c in active)
        resting = all(c.jobs == 0 for c in active)
        scale_in_possible = len(active) > self.scaler.minimum and resting
        if not (saturated or scale_in_possible or self._ready_since is not None):
            # Children have free slots, so nothing waits: Redis need not be asked.
            self.signals = Signals(0, rate, None, 0.0, False, False)
            return
        try:
            signals = self._read_signals(now, rate, saturated, scale_in_possible)
        except ERRORS as exc:
            log.warning("autoscaling could not read the queues (%s)", exc)
            return
        self.signals = signals
        decision = self.scaler.decide(len(active), signals, now)
        if decision is not None:
            self._apply(decision, now)

    def _read_signals(self, now: float, rate: float, saturated: bool,
                      scale_in_possible: bool) -> Signals:
        assert self.reader is not None
        ready, p95 = self.reader.backlog(self.clock.now())
        if ready > 0 and self._ready_since is None:
            self._ready_since = now
        elif ready == 0:
            self._ready_since = None
        age = now - self._ready_since if self._ready_since is not None else 0.0
        idle = scale_in_possible and ready == 0 and self.reader.idle()
        advice = None
        if saturated and ready > 0:
            if now - self._last_advice[0] >= ADVICE_SECONDS:
                self._last_advice = (now, self.reader.advice())
            advice = self._last_advice[1]
        return Signals(ready, rate, p95, age, saturated, idle, advice)

    def _apply(self, decision: Decision, now: float) -> None:
        self.target = decision.after
        self._event(decision.action, f"{decision.before} -> {decision.after} worker processes:"
                    f" {decision.reason}", before=decision.before, after=decision.after)
        surplus = len(self.active) - decision.after
        for c in sorted(self.active, key=lambda c: (c.jobs, -c.started))[:max(0, surplus)]:
            self._retire(c, "scale in", now)

    # -- publishing ------------------------------------------------------------------------

    def _event(self, kind: str, text: str, **extra: Any) -> None:
        """Log a decision and publish it in the supervisor's capped list."""
        log.log(logging.WARNING if kind == "restart" else logging.INFO, "%s: %s", kind, text)
        entry = {"at": round(self.clock.now(), 3), "kind": kind,
                 "text": text, **extra}
        self.decisions.appendleft(entry)
        self._dirty = True
        try:
            self.publisher.decision(entry)
        except ERRORS as exc:
            log.debug("could not publish a decision (%s)", exc)

    def _sync_clock(self) -> None:
        try:
            self._started_at = self.clock.refresh(self.app.redis)
        except ERRORS as exc:
            log.warning("Redis unreachable at start (%s); using the local clock", exc)

    def state(self) -> dict[str, str]:
        """The fields of the supervisor's hash in Redis."""
        fields = {
            "host": socket.gethostname(), "pid": str(os.getpid()),
            "queues": ",".join(self.queues), "concurrency": str(self.concurrency),
            "children": str(len(self.children)), "active": str(len(self.active)),
            "target": str(self.target), "started_at": f"{self._started_at:.3f}",
            "processed": str(self._finished),
        }
        if self.scaler is not None:
            fields.update(min=str(self.scaler.minimum), max=str(self.scaler.maximum),
                          target_wait=f"{self.scaler.target_wait:g}")
        s = self.signals
        if s is not None:
            fields.update(ready=str(s.ready), rate=f"{s.rate:.2f}",
                          p95_wait="" if s.p95_wait is None else f"{s.p95_wait:.3f}")
        return fields

    def _publish(self, now: float) -> None:
        # Changes show within a second; otherwise a slow heartbeat keeps Redis quiet.
        if now - self._last_publish < (1.0 if self._dirty else HEARTBEAT_SECONDS):
            return
        self._last_publish, self._dirty = now, False
        try:
            self.publisher.beat(self.state(), self.clock.now())
        except ERRORS as exc:
            log.debug("could not publish the supervisor's state (%s)", exc)

    def _unpublish(self) -> None:
        try:
            self.publisher.remove()
        except ERRORS as exc:
            log.debug("could not remove the supervisor's state (%s)", exc)
