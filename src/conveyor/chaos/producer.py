"""The run's producer: enqueues the work jobs over time (some delayed, some as workflows:
one job, then the rest of the batch after it, then one after all of those) while faults
happen, and the poison jobs and cancels the fault schedule asks for. It keeps every job
whose enqueue returned: those are the jobs conveyor promises never to lose; and every
dependency of the workflows it enqueued, which the checks hold the ledger to.

Some jobs must start within a short time of their enqueue (``expires``), or expire.
Some jobs wait durably for a signal: the producer sends it a moment after their enqueue
(before or after they reach the wait), half of them through the proxy; a signal call that
raised is sent again, the same request (so a reply lost does not deliver it twice).

Half its batches go through a proxy that loses replies, when the run has one. An enqueue
that raised is sent again with the same jobs, as the promise allows (a call that raises
stored nothing, or says what it stored with ``PartialEnqueue``): a job that this stores
twice runs under two ids, which the checks find."""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from ..clock import server_now
from ..errors import JobNotFound, PartialEnqueue
from ..job import Job
from ..scripts import ScriptCall, calls
from .profiles import Profile
from .tasks import QUEUE, SIGNAL, ChaosTasks

__all__ = ["Producer"]

TICK = 0.25  # seconds between two batches
WORKFLOW_EVERY = 4  # every 4th batch of 3 or more jobs goes as a fan-out/fan-in workflow
ERRORS = (redis.exceptions.RedisError, OSError)
RESENDS = 3  # an enqueue that raised is sent again up to this many times
RESEND_PAUSE = 0.3  # seconds before sending it again
WAIT_EVERY = 5  # every 5th batch adds a job that waits for a signal, then for a child
SIGNAL_AFTER = (0.0, 3.0)  # seconds from a wait job's enqueue to its signal (uniform)
EXPIRING_EVERY = 3  # every 3rd tick adds a job that must start within EXPIRES seconds
BATCH_EVERY = 4  # every 4th tick adds a few jobs of the batch task (BATCH_JOBS of them)
BATCH_JOBS = (1, 8)
EXPIRES = (0.2, 3.0)  # (uniform): some expire under the faults, most start in time


class Producer:
    """:param tasks: the run's application
    :param profile: how many jobs, over how long
    :param rng: the producer's own seeded generator
    :param stop: set when the run is aborted
    :param routed: the same tasks on a client that reaches Redis through the producer's
        proxy (lost replies), for half the batches; None: every batch goes direct
    """

    def __init__(self, tasks: ChaosTasks, profile: Profile, rng: random.Random,
                 stop: threading.Event, routed: ChaosTasks | None = None) -> None:
        self.tasks = tasks
        self.routed = routed
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
        self.failed_calls = 0  # enqueue calls given up, still raising after their re-sends
        self.resent = 0  # sends of an enqueue call that had raised
        self._labels = 0
        self._poison = 0
        self._waits = 0
        self._expiring = 0
        self._batched = 0
        # signals still to send: (due, monotonic; label; the call, its request kept)
        self.signals: list[tuple[float, str, ScriptCall[int], ChaosTasks]] = []
        self.signalled = 0  # signals answered

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
            if tick % EXPIRING_EVERY == 0:
                self._expiring_job()
            if tick % BATCH_EVERY == 1:
                self._batch_jobs()
            if tick % WAIT_EVERY == 0:  # half of them through the proxy, when there is one
                routed = self.routed is not None and self.rng.random() < 0.5
                self._wait_job(self.routed if routed and self.routed else self.tasks)
            self._send_signals()
            tick += 1
            self.stop.wait(max(0.0, began + tick * TICK - time.monotonic()))
        while self.signals and not self.stop.is_set():  # the last ones, then done
            self._send_signals()
            self.stop.wait(TICK)

    def _expiring_job(self) -> None:
        """Enqueue a job that must start within a short time, or expire."""
        self._expiring += 1
        label, seconds = f"expiring:{self._expiring}", round(self.rng.uniform(0.0, 0.2), 3)
        task = self.tasks.expiring.options(expires=round(self.rng.uniform(*EXPIRES), 2))
        self._send([(label, seconds)], lambda items: [task.enqueue(*items[0])], "expiring")

    def _batch_jobs(self) -> None:
        """Enqueue a few jobs of the batch task, in one call."""
        items = []
        for _ in range(self.rng.randint(*BATCH_JOBS)):
            self._batched += 1
            items.append((f"batch:{self._batched}", round(self.rng.uniform(0.0, 0.2), 3)))
        self._send(items, self.tasks.batched.enqueue_many, "batch")

    def _wait_job(self, tasks: ChaosTasks) -> None:
        """Enqueue a job that waits for a signal and a child; its signal is sent later."""
        self._waits += 1
        label, seconds = f"wait:{self._waits}", round(self.rng.uniform(0.0, 0.3), 3)
        for kept, job in self._send([(label, seconds)],
                                    lambda items: [tasks.waits.enqueue(*items[0])], "wait"):
            app = tasks.app
            payload = app.codec.encode_result(kept)
            call = calls.signal(app.keys(job.queue), job.short_id, SIGNAL, payload)
            with self.lock:
                self.signals.append((time.monotonic() + self.rng.uniform(*SIGNAL_AFTER),
                                     kept, call, tasks))

    def _send_signals(self) -> None:
        """Send the signals that are due; one whose call raised stays, to be sent again."""
        now = time.monotonic()
        with self.lock:
            due = [s for s in self.signals if s[0] <= now]
        for item in due:
            call, tasks = item[2], item[3]
            try:
                answer = tasks.app.scripts.run(call)
            except ERRORS:
                continue  # the same call next time: its reply is kept if it was applied
            with self.lock:
                self.signals.remove(item)
            if answer != calls.SIGNAL_REFUSED:
                self.signalled += 1

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
        # Half the batches go through the producer's proxy (lost replies), when there is one.
        tasks = self.routed if self.routed is not None and rng.random() < 0.5 else self.tasks
        work: Any = tasks.work
        self._batches += 1
        # One batch in three has no tenant and is enqueued a job per call: plain enqueues
        # (one MULTI each, scripts/plain.py). The others go to a tenant each (the limits of
        # the run apply per tenant too), all in one call.
        single = self._batches % 3 == 0
        if p.tenants and not single:
            work = work.options(tenant=f"t{rng.randrange(p.tenants)}")
        if single and self._batches % 2 == 0:  # one single batch in two: the side queue
            work = tasks.side
        if len(now) >= 3 and self._batches % WORKFLOW_EVERY == 0:
            self._workflow(now, work, tasks)
        elif now and single:
            for item in now:
                self._send([item], lambda items: [work.enqueue(*items[0])])
        elif now:
            self._send(now, work.enqueue_many)
        for label, seconds, delay in later:
            def delayed(items: list[tuple[str, float]], delay: float = delay) -> list[Job]:
                return [work.options(delay=delay).enqueue(*items[0])]

            for kept, job in self._send([(label, seconds)], delayed):
                with self.lock:
                    self.delayed.append((time.monotonic() + delay, kept, job))

    def _send(self, items: list[tuple[str, float]],
              call: Callable[[list[tuple[str, float]]], list[Job]], kind: str = "work"
              ) -> list[tuple[str, Job]]:
        """Enqueue ``items`` with ``call``, as a careful caller does: a call that raised
        stored nothing, so it is sent again; one that raised ``PartialEnqueue`` stored the
        jobs it names (the first ones), so the rest is sent again. Keeps and returns the
        jobs whose enqueue returned; after ``RESENDS`` the rest is given up."""
        left, kept = list(items), []
        for attempt in range(RESENDS + 1):
            if attempt:
                self.resent += 1
                self.stop.wait(RESEND_PAUSE)
            try:
                jobs = call(left)
            except PartialEnqueue as partial:
                found, known = self._stored_after_all(partial.unconfirmed)
                stored = list(partial.jobs) + found
                kept += [(label, job) for (label, _), job in zip(left, stored, strict=False)]
                left = left[len(stored):]
                if not left or not known:  # unknown ones: given up (checked as strays)
                    break
                continue
            except ERRORS:
                continue
            kept += [(label, job) for (label, _), job in zip(left, jobs, strict=True)]
            left = []
            break
        for label, job in kept:
            self._keep(kind, label, job)
        self.enqueued += len(kept)
        if left:
            self.failed_calls += 1  # given up: its jobs may or may not be stored
        return kept

    def _stored_after_all(self, unconfirmed: list[Job]) -> tuple[list[Job], bool]:
        """The leading jobs of ``unconfirmed`` (an enqueue sent, never answered) that turn
        out stored (each chunk is all or none, so their records tell), and whether the rest
        are known not to be (False: Redis could not be asked)."""
        found: list[Job] = []
        for job in unconfirmed:
            try:
                job.info()
            except JobNotFound:
                return found, True
            except ERRORS:
                return found, False
            found.append(job)
        return found, True

    def _workflow(self, items: list[tuple[str, float]], work: Any, tasks: ChaosTasks
                  ) -> None:
        """Enqueue ``items`` as one workflow: the first, then the middle ones after it,
        then the last after all of those. A workflow whose enqueue raised stored nothing and
        is built and sent again; one that raised ``PartialEnqueue`` cancelled what it stored
        and is given up."""
        for attempt in range(RESENDS + 1):
            if attempt:
                self.resent += 1
                self.stop.wait(RESEND_PAUSE)
            wf = tasks.app.workflow()
            first = wf.add(work, *items[0], name=items[0][0])
            middle = [wf.add(work, *item, name=item[0], after=[first]) for item in items[1:-1]]
            wf.add(work, *items[-1], name=items[-1][0], after=middle)
            try:
                wf.enqueue()
            except PartialEnqueue:
                break
            except ERRORS:
                continue
            with self.lock:
                for node in wf.nodes:
                    self.jobs[node.name] = ("work", Job(tasks.app, node.id))
                    for parent in node.after:
                        self.edges.append((parent if isinstance(parent, str) else parent.name,
                                           node.name))
            self.enqueued += len(items)
            return
        self.failed_calls += 1

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

    def change_shards(self, count: int) -> bool:
        """Spread the queue over ``count`` shards; False if Redis refused."""
        try:
            self.tasks.app.queue(QUEUE).set_shards(count)
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
