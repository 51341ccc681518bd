"""How many workers a queue needs, from Little's law on the measured rates.

With jobs arriving at rate λ and running S seconds each, λ·S slots are busy on average
just to keep up (Little's law). A backlog of B ready jobs behind those drains through
the spare slots; for a job arriving now to wait at most ``target_wait`` the spare slots
must clear B·S slot-seconds within it: ``slots >= λ·S / utilization + B·S / target_wait``.
A deadline asks the same of every pending job (ready, scheduled, running) by then.
Slots are turned into worker processes at the concurrency the live workers run with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..worker.registry import WorkerInfo
from .flow import FlowState
from .stats import Backlog, Stats

ASSUMED_CONCURRENCY = 32  # a worker's default concurrency, used when none is registered
TARGET_UTILIZATION = 0.85  # headroom so that random bursts do not queue up at once


@dataclass(frozen=True, slots=True)
class Advice:
    """What a queue needs now, and why.

    ``workers_needed``: worker processes at the concurrency current workers run with;
    ``eta_seconds``: time to drain the pending jobs at the current capacity (``0.0`` when
    nothing is pending, ``math.inf`` when arrivals outpace the workers, ``None`` when no
    run has finished yet to measure); ``reasons``: plain sentences.
    """

    queue: str
    workers_needed: int
    eta_seconds: float | None
    reasons: list[str] = field(default_factory=list)
    workers: int = 0  # live worker processes serving the queue (or the assumed one)
    concurrency: int = ASSUMED_CONCURRENCY  # slots per worker process
    busy_slots: int = 0  # jobs in hand across those workers at their last heartbeat
    arrival_rate: float = 0.0  # jobs/s enqueued or retried over the window
    run_time: float | None = None  # mean seconds per run
    capacity: float | None = None  # jobs/s the current workers can finish
    backlog: Backlog = field(default_factory=Backlog)
    wait_p95: float | None = None
    target_wait: float = 10.0
    deadline: float | None = None  # epoch s
    assumed_workers: bool = False  # no registry: one worker at ASSUMED_CONCURRENCY assumed


def duration(seconds: float) -> str:
    """Seconds in words an operator reads at a glance: '45 s', '12 min', '3.5 h'."""
    if math.isinf(seconds):
        return "forever"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass
class _Inputs:
    queue: str
    stats: Stats
    run_time: float | None
    workers: list[WorkerInfo]
    registry_present: bool
    target_wait: float
    deadline: float | None
    flow: FlowState | None = None


def decide(queue: str, stats: Stats, run_time: float | None, workers: list[WorkerInfo],
           registry_present: bool, target_wait: float, deadline: float | None,
           flow: FlowState | None = None) -> Advice:
    """Build the advice from measurements (pure: no Redis; tested on its own).

    :param stats: the queue's stats over the advice window
    :param run_time: mean run time (s), possibly from a longer window than ``stats``
    :param workers: live workers serving the queue
    :param registry_present: whether any worker is registered at all
    :param flow: the queue's limits and held jobs: no advice asks for slots they would
        leave idle
    """
    return _Decision(_Inputs(queue, stats, run_time, workers, registry_present,
                             max(target_wait, 1e-3), deadline, flow)).advice()


def limit_ceiling(flow: FlowState | None, run_time: float) -> tuple[float, str] | None:
    """Most slots the queue's own limits can keep busy, and the limit that sets it (None:
    no queue-wide limit). A rate of R jobs/s keeps R x run time slots busy."""
    if flow is None:
        return None
    lim = flow.limits
    options: list[tuple[float, str]] = []
    if lim.concurrency is not None:
        options.append((float(lim.concurrency), f"its concurrency cap of {lim.concurrency}"))
    if lim.rate is not None:
        options.append((lim.rate * run_time, f"its rate of {lim.rate:g}/s"))
    return min(options) if options else None


class _Decision:
    def __init__(self, given: _Inputs) -> None:
        self.given = given
        self.reasons: list[str] = []
        stats = given.stats
        self.arrival = (stats.enqueued + stats.retried) / stats.span
        self.assumed = not given.workers and not given.registry_present
        if self.assumed:
            self.n_workers, self.per_worker = 1, ASSUMED_CONCURRENCY
            self.busy = stats.backlog.active
            self.reasons.append(f"No worker is registered, so one worker at concurrency "
                                f"{ASSUMED_CONCURRENCY} is assumed.")
        else:
            self.n_workers = len(given.workers)
            concurrencies = sorted(w.concurrency for w in given.workers)
            self.per_worker = concurrencies[len(concurrencies) // 2] if concurrencies \
                else ASSUMED_CONCURRENCY
            self.busy = sum(w.jobs for w in given.workers)
        self.slots = self.n_workers * self.per_worker

    def advice(self) -> Advice:
        g, stats = self.given, self.given.stats
        backlog, s = stats.backlog, g.run_time
        if backlog.pending == 0 and self.arrival == 0:
            self.reasons.append(f"Queue {g.queue} is idle: nothing is pending and no job "
                                f"arrived in the last {duration(stats.window)}.")
            return self._make(0, 0.0, None)
        if s is None:
            self.reasons.append(f"No job of queue {g.queue} has finished yet, so run time is "
                                "unknown; keep at least one worker until one does.")
            self._describe_held()  # a limit that holds jobs back binds with or without one
            return self._make(max(1, self.n_workers), None, None)
        capacity = self.slots / max(s, 1e-6)
        ceiling = limit_ceiling(g.flow, s)
        if ceiling is not None:
            capacity = min(capacity, ceiling[0] / max(s, 1e-6))
        self._describe_load(s, capacity)
        startable = max(0, backlog.ready - backlog.held)  # held jobs wait for a limit, not us
        slots_needed = self.arrival * s / TARGET_UTILIZATION + startable * s / g.target_wait
        slots_needed = max(slots_needed, self._deadline_slots(s))
        if ceiling is not None and slots_needed > ceiling[0]:
            limited = max(1, math.ceil(ceiling[0] / self.per_worker - 1e-9))
            self.reasons.append(
                f"Queue {g.queue} is bound by {ceiling[1]}: {limited} worker(s) can use all"
                " of it; more would sit idle. Raise the limit to go faster.")
            slots_needed = ceiling[0]
        self._describe_held()
        needed = max(1, math.ceil(slots_needed / self.per_worker - 1e-9))
        eta = self._eta(capacity)
        self._judge_wait(needed, s)
        self._judge_deadline(eta, needed)
        if needed < self.n_workers and not self.assumed:
            self.reasons.append(f"{needed} worker(s) would be enough; {self.n_workers} run now.")
        return self._make(needed, eta, capacity)

    def _make(self, needed: int, eta: float | None, capacity: float | None) -> Advice:
        g, stats = self.given, self.given.stats
        return Advice(
            queue=g.queue, workers_needed=needed, eta_seconds=eta, reasons=self.reasons,
            workers=self.n_workers, concurrency=self.per_worker, busy_slots=self.busy,
            arrival_rate=self.arrival, run_time=g.run_time, capacity=capacity,
            backlog=stats.backlog, wait_p95=stats.wait.p95, target_wait=g.target_wait,
            deadline=g.deadline, assumed_workers=self.assumed,
        )

    def _describe_held(self) -> None:
        flow = self.given.flow
        if flow is None or flow.held <= 0:
            return
        why = {"paused": "the queue's pause", "concurrency": "the queue's concurrency cap",
               "rate": "the queue's rate"}.get(flow.blocked_by or "", "tenant limits")
        tenants = ", ".join(f"{t} ({n})" for t, n in
                            sorted(flow.held_by_tenant.items(), key=lambda i: -i[1])[:3])
        self.reasons.append(
            f"{flow.held} ready job(s) are held by {why}" + (f": {tenants}" if tenants else "")
            + "; more workers would not start them sooner.")

    def _eta(self, capacity: float) -> float:
        pending = self.given.stats.backlog.pending
        if pending == 0:
            return 0.0
        spare = capacity - self.arrival
        return math.inf if spare <= 0 else pending / spare

    def _deadline_slots(self, s: float) -> float:
        g = self.given
        if g.deadline is None:
            return 0.0
        left = g.deadline - g.stats.now
        if left <= 0:
            return 0.0
        return self.arrival * s + g.stats.backlog.pending * s / left

    def _describe_load(self, s: float, capacity: float) -> None:
        g = self.given
        self.reasons.append(
            f"Over the last {duration(g.stats.window)} jobs arrived at {self.arrival:.3g}/s "
            f"and ran {duration(s)} on average; {self.n_workers} worker(s) with {self.slots} "
            f"slots can finish up to {capacity:.3g}/s ({self.busy} slot(s) busy now).")
        if self.arrival > capacity:
            self.reasons.append(
                f"Jobs arrive faster ({self.arrival:.3g}/s) than the current workers can "
                f"finish them ({capacity:.3g}/s): the backlog grows until workers are added.")

    def _judge_wait(self, needed: int, s: float) -> None:
        g, wait = self.given, self.given.stats.wait
        over = wait.p95 is not None and wait.p95 > g.target_wait
        ready = g.stats.backlog.ready
        if over:
            assert wait.p95 is not None
            self.reasons.append(
                f"Jobs waited {duration(wait.p95)} at p95, over the {duration(g.target_wait)} "
                f"target: scale out to {needed} worker(s).")
        elif ready * s / max(self.slots, 1) > g.target_wait:
            self.reasons.append(
                f"{ready} ready job(s) would wait about {duration(ready * s / max(self.slots, 1))}"
                f" with the current workers, over the {duration(g.target_wait)} target: scale "
                f"out to {needed} worker(s).")
        elif wait.p95 is not None:
            self.reasons.append(f"Jobs waited {duration(wait.p95)} at p95, within the "
                                f"{duration(g.target_wait)} target.")
        mean_wait = wait.mean or 0.0
        if s >= g.target_wait or (over and s > mean_wait):
            self.reasons.append(
                f"Run time dominates: jobs run {duration(s)} on average against "
                f"{duration(mean_wait)} of waiting. More workers shorten the queue, not the "
                "job; split the work into smaller jobs or give the task a larger machine.")

    def _judge_deadline(self, eta: float, needed: int) -> None:
        g = self.given
        if g.deadline is None:
            return
        left = g.deadline - g.stats.now
        pending = g.stats.backlog.pending
        if left <= 0:
            self.reasons.append(f"The deadline passed {duration(-left)} ago with {pending} "
                                "job(s) still pending.")
        elif eta > left:
            self.reasons.append(
                f"At the current capacity the {pending} pending job(s) take {duration(eta)} to "
                f"drain, past the deadline in {duration(left)}: run {needed} worker(s) to "
                "finish in time.")
        else:
            self.reasons.append(f"The {pending} pending job(s) drain in {duration(eta)}, "
                                f"before the deadline in {duration(left)}.")
