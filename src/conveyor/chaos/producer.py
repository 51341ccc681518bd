"""The run's producer: enqueues the work jobs over time (some delayed, some as workflows:
one job, then the rest of the batch after it, then one after all of those) while faults
happen, and the poison jobs and cancels the fault schedule asks for. It keeps every job
whose enqueue returned: those are the jobs conveyor promises never to lose; and every
dependency of the workflows it enqueued, which the checks hold the ledger to."""

from __future__ import annotations

import math
import random
import threading
import time
from typing import Any

import redis

from ..clock import server_now
from ..job import Job
from .profiles import Profile
from .tasks import QUEUE, ChaosTasks

__all__ = ["Producer"]

TICK = 0.25  # seconds between two batches
WORKFLOW_EVERY = 4  # every 4th batch of 3 or more jobs goes as a fan-out/fan-in workflow
ERRORS = (redis.exceptions.RedisError, OSError)


class Producer:
    """:param tasks: the run's application
    :param profile: how many jobs, over how long
    :param rng: the producer's own seeded generator
    :param stop: set when the run is aborted
    """

    def __init__(self, tasks: ChaosTasks, profile: Profile, rng: random.Random,
                 stop: threading.Event) -> None:
        self.tasks = tasks
        self.profile = profile
        self.rng = rng
        self.stop = stop
        self.lock = threading.Lock()
        self.jobs: dict[str, tuple[str, Job]] = {}  # label -> (kind, job)
        self.delayed: list[tuple[float, str, Job]] = []  # (due, monotonic; label; job)
        self.cancelled: set[str] = set()
        self.cancel_unknown: set[str] = set()  # cancel() raised: it may or may not have
        self.edges: list[tuple[str, str]] = []  # (parent label, child label) of workflows
        self._batches = 0
        self.enqueued = 0  # work jobs whose enqueue returned
        self.failed_calls = 0  # enqueue calls that raised (their jobs are not counted)
        self._labels = 0
        self._poison = 0

    def _label(self) -> str:
        self._labels += 1
        return f"work:{self._labels}"

    def _keep(self, kind: str, label: str, job: Job) -> None:
        with self.lock:
            self.jobs[label] = (kind, job)

    def run(self) -> None:
        p = self.profile
        per = max(1, math.ceil(p.jobs / max(1.0, p.enqueue_seconds / TICK)))
        began, tick = time.monotonic(), 0
        while self.enqueued < p.jobs and not self.stop.is_set():
            self._batch(min(per, p.jobs - self.enqueued))
            tick += 1
            self.stop.wait(max(0.0, began + tick * TICK - time.monotonic()))

    def _batch(self, n: int) -> None:
        p, rng = self.profile, self.rng
        now: list[tuple[str, float]] = []
        later: list[tuple[str, float, float]] = []
        for _ in range(n):
            item = (self._label(), round(rng.uniform(0.0, p.task_seconds), 3))
            if rng.random() < p.delayed_share:
                later.append((*item, round(rng.uniform(0.5, p.max_delay), 1)))
            else:
                now.append(item)
        work = self.tasks.work
        self._batches += 1
        # One batch in three has no tenant and is enqueued a job per call: plain enqueues
        # (one MULTI each, scripts/plain.py). The others go to a tenant each (the limits of
        # the run apply per tenant too), all in one call.
        single = self._batches % 3 == 0
        if p.tenants and not single:
            work = work.options(tenant=f"t{rng.randrange(p.tenants)}")
        if single and self._batches % 2 == 0:  # one single batch in two: the side queue
            work = self.tasks.side
        try:
            if len(now) >= 3 and self._batches % WORKFLOW_EVERY == 0:
                self._workflow(now, work)
            elif now and single:
                for label, seconds in now:
                    job = work.enqueue(label, seconds)
                    self._keep("work", label, job)
                    self.enqueued += 1
            elif now:
                jobs = work.enqueue_many(now)
                for (label, _), job in zip(now, jobs, strict=True):
                    self._keep("work", label, job)
                self.enqueued += len(now)
            for label, seconds, delay in later:
                job = work.options(delay=delay).enqueue(label, seconds)
                self._keep("work", label, job)
                with self.lock:
                    self.delayed.append((time.monotonic() + delay, label, job))
                self.enqueued += 1
        except ERRORS:
            self.failed_calls += 1  # the faults at work: the next tick tries new jobs

    def _workflow(self, items: list[tuple[str, float]], work: Any) -> None:
        """Enqueue ``items`` as one workflow: the first, then the middle ones after it,
        then the last after all of those (raises like an enqueue)."""
        wf = self.tasks.app.workflow()
        first = wf.add(work, *items[0], name=items[0][0])
        middle = [wf.add(work, *item, name=item[0], after=[first]) for item in items[1:-1]]
        wf.add(work, *items[-1], name=items[-1][0], after=middle)
        wf.enqueue()
        with self.lock:
            for node in wf.nodes:
                self.jobs[node.name] = ("work", Job(self.tasks.app, node.id))
                for parent in node.after:
                    self.edges.append((parent if isinstance(parent, str) else parent.name,
                                       node.name))
        self.enqueued += len(items)

    def poison(self, kind: str) -> str | None:
        """Enqueue one poison job of ``kind``; its label, or None if the enqueue raised."""
        self._poison += 1
        label = f"{kind}:{self._poison}"
        try:
            job = self.tasks.by_kind(kind).enqueue(label)
        except ERRORS:
            self.failed_calls += 1
            return None
        self._keep(kind, label, job)
        return label

    def overwritten_keys(self, sets: bool) -> list[str]:
        """The queue's keys that a hand edit may write over, for a while, without losing a
        job: its wake marker and its current and next metric buckets (bookkeeping that
        every call passes over when it has the wrong type), and its delayed and dead sets
        (every call that writes them refuses, having changed nothing, or passes over them:
        put back, they are as they were) when ``sets``."""
        app = self.tasks.app
        k = app.keys(QUEUE)
        width = app.limits.bucket_seconds
        start = int(server_now(app.redis) // width * width)
        keys = [k.wake, f"{k.metrics_prefix}{start}", f"{k.metrics_prefix}{start + width}"]
        if sets:
            keys += [k.delayed, k.dead]
        return keys

    def change_limits(self, cap: int | None, tenant_cap: int | None) -> bool:
        """Set the queue's cap and every tenant's (None: no limit); False if Redis refused."""
        try:
            self.tasks.app.queue(QUEUE).set_limits(concurrency=cap, tenant_concurrency=tenant_cap)
        except ERRORS:
            return False
        return True

    def cancel(self) -> str | None:
        """Cancel a delayed job due in more than a second; its label, or None."""
        soon = time.monotonic() + 1.0
        with self.lock:
            candidates = [(label, job) for due, label, job in self.delayed
                          if due > soon and label not in self.cancelled]
        if not candidates:
            return None
        label, job = self.rng.choice(candidates)
        return self._cancel(label, job)

    def _cancel(self, label: str, job: Job, reason: str | None = None) -> str | None:
        """Cancel ``job``, noting the outcome: ``label`` if it was cancelled, else None
        (a cancel that raised may or may not have been applied)."""
        try:
            done = job.cancel(reason=reason) if reason else job.cancel()
        except ERRORS:
            with self.lock:
                self.cancel_unknown.add(label)
            return None
        if not done:
            return None
        with self.lock:
            self.cancelled.add(label)
        return label

    def cancel_running(self, looks: int = 20) -> str | None:
        """Cancel a work job that is running now (among the latest enqueued); its label, or
        None. A cancel that returns True must end the job cancelled, even when its run
        finishes before its worker hears of the cancel."""
        with self.lock:
            recent = [label for label, (kind, _) in list(self.jobs.items())[-200:]
                      if kind == "work" and label not in self.cancelled
                      and label not in self.cancel_unknown]
        for label in self.rng.sample(recent, min(looks, len(recent))):
            job = self.jobs[label][1]
            try:
                running = job.info().state == "active"
            except ERRORS:
                return None
            if not running:
                continue
            return self._cancel(label, job, reason="chaos")
        return None

    def snapshot(self) -> dict[str, tuple[str, Job]]:
        with self.lock:
            return dict(self.jobs)
