"""The worker: one asyncio loop per process that owns all Redis I/O.

A worker leases jobs in batches no larger than its free slots (so priorities and fairness
are decided in Redis, not in a prefetch buffer), runs them, and records outcomes in
batches. When there is nothing to do it blocks on its queues' wake keys and arms a timer,
from the server's clock, for the earliest delayed job or lease deadline: an idle worker
sends almost no commands, and due work starts within milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import signal
import socket
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..alerts import alerter_for
from ..clock import ServerClock
from ..schedule import Scheduler
from ..scripts import calls
from ..workflow.handover import HandOvers
from .backoff import REDIS_ERRORS, QueueBackoff, pause_after
from .dead import DeadNotices
from .doubt import InDoubt
from .executor import Executor, Held
from .handoff import WAITER_TTL_MS, Waiting, keep_renewed
from .leases import LeaseKeeper
from .loops import LoopDied, Loops, where
from .outbox import Outbox
from .progress import ProgressWriter
from .registry import keep_registered
from .server_check import check_server
from .wake import WAKE_BLOCK_SECONDS, leave_markers, listen_for_wakeups

if TYPE_CHECKING:
    from ..app import Conveyor

__all__ = ["LoopDied", "Worker"]
INTERRUPTED = "interrupted: the worker shut down"
STOP_STEP_SECONDS = 5.0  # the longest a step of the way out that has no bound of its own may take

log = logging.getLogger("conveyor.worker")


class Worker:
    """Consumes jobs from ``queues`` with up to ``concurrency`` running at once.

    :param app: the application whose tasks run here
    :param queues: queues to serve, in order of preference (default: all the app's queues)
    :param concurrency: most jobs running at once (also the most leased at once)
    :param grace: seconds running jobs get to finish after SIGTERM/SIGINT
    :param max_jobs: stop gracefully after this many jobs (a supervisor then replaces the
        process, which bounds what a leaky task can accumulate)
    """

    def __init__(
        self,
        app: Conveyor,
        queues: Sequence[str] | None = None,
        concurrency: int = 32,
        *,
        grace: float = 30.0,
        name: str | None = None,
        max_jobs: int | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.app = app
        self.queues = list(queues) if queues else app.queues() or ["default"]
        self.concurrency = concurrency
        self.grace = grace
        self.id = name or f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"
        self.clock = ServerClock()
        self.held: dict[tuple[str, str], Held] = {}
        self.processed = 0
        self.max_jobs = max_jobs
        self.supervised = False  # set by a supervisor's child process before it runs
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self.nudge: asyncio.Event | None = None
        self._more: dict[str, bool] = {}
        self._held_back: dict[str, bool] = {}  # a limit held ready jobs at the last fetch
        # Queues whose last fetch failed wait out a pause of their own; the others are
        # served meanwhile.
        self._fetch_backoff = QueueBackoff()
        self._fetches: InDoubt[str] = InDoubt()  # per queue: a fetch whose reply was lost
        self._wakes = 0  # wake-ups seen so far (one that arrives during a fetch is kept)
        self.next_due: dict[str, float | None] = {}
        self._rotation = 0
        self.started = threading.Event()
        self.waiting = Waiting(app.keys, self.id)  # registrations for jobs handed over

    # -- entry points ----------------------------------------------------------------------

    def run(self, burst: bool = False) -> None:
        """Run until stopped (SIGTERM/SIGINT or :meth:`stop`), or, with ``burst``, until no
        job is ready (scheduled jobs and retries not yet due are not waited for)."""
        try:
            import uvloop

            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self.arun(burst=burst))
        finally:
            try:
                _end_leftovers(loop, STOP_STEP_SECONDS)
            finally:
                loop.close()

    def stop(self) -> None:
        """Ask the worker to stop gracefully; safe to call from any thread or signal."""
        loop = self._loop
        if loop is None or loop.is_closed():
            self._stopping = True
            return
        loop.call_soon_threadsafe(self._request_stop)

    def _request_stop(self) -> None:
        if self._stopping:
            log.warning("second stop request: not waiting for running jobs")
            self.grace = 0
        self._stopping = True
        if self.nudge is not None:
            self.nudge.set()

    async def arun(self, burst: bool = False) -> None:
        """The worker's main coroutine (what :meth:`run` runs on a fresh loop).

        :raises LoopDied: one of the worker's loops could not be kept alive; the worker
            stopped (gracefully) so that its supervisor replaces it
        """
        self._loop = asyncio.get_running_loop()
        self.waiting.enabled = not burst  # a burst worker leaves once idle: no offers
        self.nudge = asyncio.Event()
        self.slot_freed = asyncio.Event()  # a job finished: the wake listener may block again
        self.leased = asyncio.Event()  # a job was leased: its heartbeat may be due sooner
        self.idle = asyncio.Event()  # the consumer waits: no fetch of its own is under way
        self._more = dict.fromkeys(self.queues, True)
        self.next_due = dict.fromkeys(self.queues)
        client, runner = self.app.aredis(), self.app.ascripts()
        self.progress = ProgressWriter(runner, self.app.keys)
        self.executor = Executor(self.app, self.clock, self.concurrency,
                                 supervised=self.supervised, on_slot_back=self._slot_back,
                                 progress=self.progress)
        self.notices = DeadNotices(self.app, alerter_for(self.app.alert_webhook))
        handovers = HandOvers(self.app, self.queues, self._nodes_ready)
        self.outbox = Outbox(self.app, runner, before_flush=self.progress.flush,
                             notices=self.notices, on_handover=handovers.now)
        self._install_signals()
        await check_server(client)
        self.loops = Loops(on_fatal=lambda _exc: self._request_stop())
        self.loops.start("wake listener", lambda: listen_for_wakeups(self))
        # A job is held until its outcome is acknowledged: running here, or its outcome
        # waiting in the outbox.
        self.lease_keeper = LeaseKeeper(
            lambda: itertools.chain(self.held.values(), self.outbox.leases()), self.leased,
            runner, self.app.keys, on_cancel=self._cancel, client=client)
        self.loops.start("lease heartbeat", self.lease_keeper.run)
        self.loops.start("progress writer", self.progress.run)
        self.loops.start("outcome outbox", self.outbox.run)
        self.loops.start("worker registry", lambda: keep_registered(self))
        self.loops.start("waiter renewal", lambda: keep_renewed(self.waiting, client,
                                                                 self.clock))
        scheduler = Scheduler(self.app, self.queues, ServerClock())
        self.loops.start("periodic scheduler", scheduler.run)
        self.loops.start("workflow hand-over", handovers.run)
        log.info("worker %s serving %s with concurrency %d", self.id, self.queues,
                 self.concurrency)
        self.started.set()
        try:
            await self._consume(runner, burst)
            await self._drain()
        finally:
            await self._leave_waiting()
            await self.notices.flush()
            await self.outbox.flush_all()
            await self.loops.cancel()
            await leave_markers(self)
            self.executor.shutdown()
            self._remove_signals()
            try:
                async with asyncio.timeout(STOP_STEP_SECONDS):
                    await self.app.aclose()
            except TimeoutError:
                log.warning("closing the worker's Redis connections took over %.0f s; left"
                            " to the operating system", STOP_STEP_SECONDS)
            log.info("worker %s stopped after %d jobs", self.id, self.processed)
        if self.loops.fatal is not None:
            raise self.loops.fatal

    @property
    def stopping(self) -> bool:
        """True once a stop was asked for: the worker takes no new work."""
        return self._stopping

    @property
    def stuck(self) -> int:
        """Slots held by sync runs that overran their timeout (capacity lost until they
        return)."""
        return len(self.executor.stuck)

    def free_slots(self) -> int:
        """Jobs this worker could lease now. A sync run that overran its timeout keeps its
        thread, and so its slot, until it returns."""
        free = (self.concurrency - len(self.held) - len(self.executor.stuck)
                - len(self.executor.winding_down))
        if self.max_jobs is not None:  # never lease more than it will run
            free = min(free, self.max_jobs - self.processed - len(self.held))
        return free

    # -- consuming -------------------------------------------------------------------------

    async def _consume(self, runner: Any, burst: bool) -> None:
        assert self.nudge is not None
        while not self._stopping:
            self.nudge.clear()
            took = await self._fill(runner)
            if took:
                continue
            if burst and not self.held and not any(self._more.values()) \
                    and not any(self._held_back.values()):
                await self.notices.flush()
                await self.outbox.flush_all()
                if not self.held and not any(self._more.values()):
                    return  # (a hand-over while flushing may have made nodes ready)
            await self._sleep()

    async def _fill(self, runner: Any) -> bool:
        """Lease jobs for every free slot from queues that may have work; True if any."""
        took = False
        n = len(self.queues)
        for i in range(n):
            free = self.free_slots()
            if free <= 0 or self._stopping:
                break
            queue = self.queues[(self._rotation + i) % n]
            if ((not self._more[queue] and not self._is_due(queue))
                    or self._fetch_backoff.waiting(queue)):
                continue
            wakes = self._wakes
            try:
                fetched, want = await self._fetch(runner, queue, free)
            except REDIS_ERRORS as exc:
                self._fetch_failed(queue, exc)
                continue
            self._fetch_backoff.succeeded(queue)
            self.waiting.offered(queue, fetched.offered)
            self.clock.observe(fetched.now_ms)
            self.next_due[queue] = fetched.next_due_ms
            # A wake-up that came while the fetch was on the wire may be for a job stored
            # after the script ran: look again rather than lose it.
            self._more[queue] = len(fetched.jobs) == want or self._wakes != wakes
            self._held_back[queue] = fetched.held
            if fetched.dead:
                self.notices.dead(queue, fetched.dead)
            if fetched.trimmed:
                self.notices.trimmed(queue, fetched.trimmed)
            # A fetch sent again may have leased for more slots than are free now (jobs
            # were handed over meanwhile): the rest goes back at once, attempt refunded.
            room = 0 if self._stopping else max(0, self.free_slots())
            for leased in fetched.jobs[:room]:
                self._start(queue, leased)
            if fetched.jobs[room:]:
                await self.hand_back(queue, [(j.short_id, j.token) for j in fetched.jobs[room:]])
            took = took or bool(fetched.jobs)
        self._rotation = (self._rotation + 1) % n
        return took

    async def _fetch(self, runner: Any, queue: str, free: int) -> tuple[calls.Fetched, int]:
        """Fetch from ``queue`` up to ``free`` jobs, or send again the fetch whose reply was
        lost (see :mod:`.doubt`: it may have leased jobs that nobody else will run); the
        reply and how many jobs the call asked for. The worker's own overdue heartbeats in
        ``queue`` go first, so that the fetch reclaims no lease this worker still holds."""
        await self.lease_keeper.catch_up(queue)
        doubt = self._fetches.get(queue)
        if doubt is not None:
            call, want = doubt.call, doubt.carried
        else:
            call, want = calls.fetch(self.app.keys(queue), free, self.app.limits,
                                     worker=self.id if self.waiting.enabled else "",
                                     waiter_ttl_ms=WAITER_TTL_MS), free
        fetched: calls.Fetched = await self._fetches.send(runner, queue, call, want)
        return fetched, want

    def _fetch_failed(self, queue: str, exc: BaseException) -> None:
        """A fetch from ``queue`` failed: Redis unreachable, or refusing (out of memory, a
        key of this queue written over by hand). The worker keeps serving the jobs in hand
        and its other queues, and tries this one again after a pause that grows with each
        failure in a row (one queue's trouble, a key or a Cluster node of its own, must not
        stop the others)."""
        pause = self._fetch_backoff.failed(queue)
        self._more[queue] = True
        log.warning("could not fetch jobs from queue %s (%s: %s); retrying it in %.2f s",
                    queue, type(exc).__name__, exc, pause)

    def take_handed(self, queue: str, handed: calls.Fetched) -> list[calls.Leased]:
        """Start jobs an enqueue handed to this worker; returns those beyond its free slots
        (or all, once stopping), which the caller hands back, and those whose lease ended
        while the entry waited (a stopped process): never run, they are handed back too,
        their attempts refunded (a lease reclaimed meanwhile refuses the hand-back)."""
        self.clock.passed(handed.now_ms)  # the entry may have waited in its list
        if handed.dead:
            self.notices.dead(queue, handed.dead)
        if handed.trimmed:
            self.notices.trimmed(queue, handed.trimmed)
        jobs = [j for j in handed.jobs
                if self.clock.seconds_until(handed.now_ms + j.visibility_ms) > 0]
        ended = [j for j in handed.jobs if j not in jobs]
        if ended:
            log.warning("%d job(s) of %s were handed over %.1f s ago: their leases have ended;"
                        " handing them back", len(ended), queue,
                        -self.clock.seconds_until(handed.now_ms))
        free = 0 if self._stopping else max(0, self.free_slots())
        for leased in jobs[:free]:
            self._start(queue, leased)
            # As a fetch's next due time would: look again when the lease ends, in case
            # this run stalls past it.
            self.due_at(queue, handed.now_ms + leased.visibility_ms)
        return ended + jobs[free:]

    async def _leave_waiting(self) -> None:
        """Unregister as a waiter and hand back what was handed over but not taken."""
        left: dict[str, list[calls.Leased]] = {}
        with contextlib.suppress(*REDIS_ERRORS):
            async with asyncio.timeout(2.0):
                left = await self.waiting.leave(self.app.aredis(), self.queues)
        for queue, jobs in left.items():
            await self.hand_back(queue, [(j.short_id, j.token) for j in jobs], within=2.0)

    def _is_due(self, queue: str) -> bool:
        due = self.next_due.get(queue)
        return due is not None and self.clock.seconds_until(due) <= 0

    def _start(self, queue: str, leased: calls.Leased) -> None:
        running = self.held.get((queue, leased.short_id))
        if running is not None:
            # Its lease lapsed while it ran here (a stalled loop, a Redis pause) and this
            # worker leased it again: the run in progress becomes the new lease's run, with
            # the new token, rather than a second run of the same job beside it.
            log.warning("job %s was leased again while it still runs here: the run goes on"
                        " under the new lease", leased.short_id)
            running.leased, running.lease_lost, running.next_beat = leased, False, None
            self.leased.set()
            return
        held = Held(queue, leased)
        self.held[(queue, leased.short_id)] = held
        self.leased.set()
        task = self.app.tasks.get(leased.task)
        if task is not None and not task.is_async and not leased.problem:
            self.executor.start_sync(held, task, self._finished)
        else:
            held.task = asyncio.create_task(self._execute(held))

    async def _execute(self, held: Held) -> None:
        try:
            outcome = await self.executor.run(held)
        except asyncio.CancelledError:
            return  # withdrawn by a stop, which hands the job back itself
        if outcome is not None:
            self._finished(held, outcome)

    def _finished(self, held: Held, outcome: calls.Outcome) -> None:
        """Record an attempt's outcome and free its slot (once per run)."""
        key = (held.queue, held.leased.short_id)
        if self.held.get(key) is not held or held.withdrawn:
            return  # already handed back, interrupted or timed out
        if held.task is not None and not held.task.done() and \
                not isinstance(held.task, asyncio.Task):
            held.task.set_result(None)  # a sync attempt's future: the job is settled
        if outcome.token != held.leased.token:  # leased again while it ran: the new lease
            outcome = dataclasses.replace(outcome, token=held.leased.token)
        self.outbox.add(held.queue, outcome, held)  # its lease is kept until acknowledged
        self.processed += 1
        if self.max_jobs is not None and self.processed >= self.max_jobs and not self._stopping:
            log.info("worker %s has run its %d jobs: stopping", self.id, self.max_jobs)
            self._request_stop()
        del self.held[key]
        self._more[held.queue] = self._more[held.queue] or len(self.held) == 0
        self.slot_freed.set()
        self._nudge()

    def _cancel(self, held: Held) -> None:
        """Someone cancelled a job held here (its heartbeat said so): end the run now. An
        async task is cancelled; a sync one sees ``ctx.cancelled`` and keeps its thread
        until it returns. The job ends cancelled at once either way."""
        if held.cancel_requested:
            return
        held.cancel_requested = True
        if self.held.get((held.queue, held.leased.short_id)) is not held or held.withdrawn:
            return
        log.info("job %s~%s was cancelled while it ran here: stopping it", held.queue,
                 held.leased.short_id)
        self._finished(held, self.executor.cancelled(held))
        held.withdraw(running_too=True)  # what the run reports later is dropped
        if isinstance(held.task, asyncio.Task):
            held.task.cancel()

    async def _sleep(self) -> None:
        """Wait for a wake-up, a free slot, or the earliest due time, whichever comes first."""
        assert self.nudge is not None
        timeout = None
        dues = [d for d in self.next_due.values() if d is not None]
        if dues and self.free_slots() > 0:
            # A full worker cannot act on a due time (it would wake at once, again and again,
            # once the time has passed); a finishing job nudges it instead.
            timeout = max(0.0, self.clock.seconds_until(min(dues)))
        if self.held and not any(self._more.values()):
            # Busy but the queues looked empty: look again now and then for new work.
            timeout = WAKE_BLOCK_SECONDS if timeout is None else min(timeout, WAKE_BLOCK_SECONDS)
        retry = self._fetch_backoff.next_retry()
        if retry is not None and self.free_slots() > 0:  # a failed queue's next try
            timeout = retry if timeout is None else min(timeout, retry)
        if not self.nudge.is_set():
            self.idle.set()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.nudge.wait(), timeout)
        finally:
            self.idle.clear()

    def wake_all(self) -> None:
        """Look at every queue again now (a wake marker arrived, or Redis came back)."""
        for queue in self.queues:
            self._more[queue] = True
        self._wakes += 1
        self._nudge()

    def _nudge(self) -> None:
        """Wake the consumer; it is no longer idle until it has fetched and sleeps again."""
        assert self.nudge is not None
        self.idle.clear()
        self.nudge.set()

    def _slot_back(self) -> None:
        self.slot_freed.set()
        self.wake_all()

    def look_again(self, queue: str) -> None:
        """``queue`` has ready jobs: fetch from it at the next chance."""
        self._more[queue] = True
        self._wakes += 1
        self._nudge()

    def _nodes_ready(self, queue: str) -> None:
        """A hand-over made workflow nodes ready in ``queue``."""
        if queue in self._more:
            self.look_again(queue)

    def due_at(self, queue: str, due_ms: float) -> None:
        """Something in ``queue`` (a delayed job, a lease deadline) is due at ``due_ms``."""
        known = self.next_due.get(queue)
        if known is None or due_ms < known:
            self.next_due[queue] = due_ms
            assert self.nudge is not None
            self.nudge.set()

    # -- stopping --------------------------------------------------------------------------

    async def _drain(self) -> None:
        """After a stop: hand back at once the jobs that have not started, give running
        ones the grace period, then interrupt the rest. Every job goes back to its queue
        without using up an attempt (a shutdown never dead-letters a job)."""
        await self._leave_waiting()  # no more hand-overs to a worker on its way out
        unstarted = [h for h in list(self.held.values()) if h.withdraw(running_too=False)]
        for held in unstarted:
            del self.held[(held.queue, held.leased.short_id)]
        await self._release(unstarted, "")
        running = [h.task for h in self.held.values() if h.task is not None]
        if running:
            log.info("waiting up to %.1f s for %d running job(s)", self.grace, len(running))
            hurry = asyncio.ensure_future(self._hurried())
            waiters: list[asyncio.Future[Any]] = [
                asyncio.gather(*running, return_exceptions=True), hurry]
            await asyncio.wait(waiters, timeout=self.grace, return_when=asyncio.FIRST_COMPLETED)
            hurry.cancel()
        interrupted = list(self.held.values())
        for held in interrupted:
            held.withdraw(running_too=True)
            if isinstance(held.task, asyncio.Task):
                held.task.cancel()
        self.held.clear()
        if interrupted:
            log.warning("interrupting %d running job(s); they go back to their queues",
                        len(interrupted))
        await self._release(interrupted, INTERRUPTED)

    async def _hurried(self) -> None:
        """Return once a second stop request has cut the grace period short."""
        assert self.nudge is not None
        while self.grace > 0:
            self.nudge.clear()
            await self.nudge.wait()

    async def _release(self, jobs: list[Held], reason: str, within: float = 10.0) -> None:
        """Hand ``jobs`` back to their queues (see :meth:`hand_back`), all within
        ``within`` seconds."""
        by_queue: dict[str, list[tuple[str, str, str]]] = {}
        for held in jobs:
            lease = (held.leased.short_id, held.leased.token)
            by_queue.setdefault(held.queue, []).append((*lease, reason))
        clock = asyncio.get_running_loop().time
        deadline = clock() + within
        for queue, leases in by_queue.items():
            await self.hand_back(queue, leases, within=max(0.0, deadline - clock()))

    async def hand_back(self, queue: str,
                        leases: Sequence[tuple[str, str] | tuple[str, str, str]],
                        within: float = 10.0) -> None:
        """Hand leased jobs of ``queue`` back, their attempts refunded (see
        ``calls.release``), trying Redis again for up to ``within`` seconds with the same
        call (its reply, if lost, is kept: see :mod:`.doubt`); past that their leases
        expire and they are reclaimed."""
        runner = self.app.ascripts()
        clock = asyncio.get_running_loop().time
        deadline = clock() + within
        call = calls.release(self.app.keys(queue), leases)
        failures = 0
        while True:
            try:
                await runner.run(call)
                return
            except REDIS_ERRORS as exc:
                failures += 1
                if clock() > deadline:
                    log.error("could not hand back %d job(s) of %s (%s); they run again"
                              " when their leases expire", len(leases), queue, exc)
                    return
                await asyncio.sleep(pause_after(failures))

    def _install_signals(self) -> None:
        self._signals: list[int] = []
        if threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._request_stop)
                self._signals.append(sig)
            except (NotImplementedError, RuntimeError):
                pass

    def _remove_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in self._signals:
            loop.remove_signal_handler(sig)


def _end_leftovers(loop: asyncio.AbstractEventLoop, timeout: float) -> None:
    """After the worker's coroutine ended: cancel whatever it left running and wait a
    bounded time, then shut down async generators and the default executor, each bounded.
    (``asyncio.Runner`` waits for all three without a bound: a task that swallowed its
    cancellation inside a client call, or a stuck executor thread, would hold the stop.)"""
    leftovers = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in leftovers:
        task.cancel()
    if leftovers:
        _, stuck = loop.run_until_complete(asyncio.wait(leftovers, timeout=timeout))
        for task in stuck:
            log.warning("task %s did not stop within %.1f s of being cancelled (at %s); the"
                        " worker exits without it", task.get_name(), timeout, where(task))

    async def shut_down() -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await loop.shutdown_asyncgens()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await loop.shutdown_default_executor()

    loop.run_until_complete(shut_down())
