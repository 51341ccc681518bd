"""The worker: one asyncio loop per process that owns all Redis I/O.

A worker leases jobs in batches no larger than its free slots (so priorities and fairness
are decided in Redis, not in a prefetch buffer), runs them, and records outcomes in
batches. When there is nothing to do it blocks on its queues' wake keys and arms a timer,
from the server's clock, for the earliest delayed job or lease deadline: an idle worker
sends almost no commands, and due work starts within milliseconds.

:class:`Worker` is the entry point and puts the parts together, each owning one thing:

* :mod:`.slots` — the running set: held jobs, free slots, the runs on them
  (:mod:`.executor` runs one job);
* :mod:`.consumer` — filling the free slots, and sleeping until there may be work;
* :mod:`.wake` — wake markers and hand-offs (:mod:`.handoff`) for an idle worker;
* :mod:`.outbox` — outcomes, recorded in batches; :mod:`.dead` tells the hooks of dead jobs;
* :mod:`.leases` — heartbeats for every job held until its outcome is acknowledged;
* :mod:`.shutdown` — the stop request, the grace period, the jobs given back
  (:mod:`.handback`);
* :mod:`.loops` — supervision of the long-lived loops, :mod:`.registry` — who is alive.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import redaction
from ..alerts import alerter_for
from ..clock import ServerClock
from ..schedule import Scheduler
from ..workflow.release import HandOvers
from .banner import announce
from .consumer import Consumer
from .dead import DeadNotices
from .executor import Executor, Held
from .handback import HandBack
from .handoff import Waiting, keep_renewed
from .leases import LeaseKeeper
from .loops import LoopDied, Loops
from .outbox import Outbox
from .progress import ProgressWriter
from .reach import wait_for_redis
from .registry import keep_registered
from .server_check import check_server
from .shards import ShardWatch
from .shutdown import Shutdown, end_leftovers, install_signals, leave_waiting, remove_signals
from .slots import Slots
from .wake import Listening, leave_markers, listen_for_wakeups

if TYPE_CHECKING:
    from ..app import Conveyor

__all__ = ["LoopDied", "Worker"]
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
    :param supervised: a supervisor runs this process and replaces it when a job gets
        stuck (what the log says of a sync task that overran its timeout)
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
        supervised: bool = False,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.app = app
        self.bases = list(queues) if queues else app.queues() or ["default"]
        # What it serves: the queues, and, once it has read their layouts, their shards.
        self.queues = list(self.bases)
        self.concurrency = concurrency
        self.id = name or f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"
        self.clock = ServerClock()
        self.max_jobs = max_jobs
        self.supervised = supervised
        self.shutdown = Shutdown(grace)
        self.started = threading.Event()
        self.waiting = Waiting(app.keys, self.id)  # registrations for jobs handed over
        self._loop: asyncio.AbstractEventLoop | None = None
        # The parts of a run (see arun); none before the first.
        self.slots: Slots | None = None
        self.consumer: Consumer | None = None
        self._processed = 0
        self._stop_asked: asyncio.Event | None = None  # set by a stop (of the current run)
        self._client: Any = None  # the asyncio client of the current run

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
                end_leftovers(loop, STOP_STEP_SECONDS)
                # A leftover that sent a command after arun closed the client opened its
                # connections again (redis-py reconnects on use), or made the app a new
                # client for this loop: both closed here, when nothing can use them, so the
                # loop does not close over live sockets.
                if self._client is not None:
                    loop.run_until_complete(self._close(self._client))
                loop.run_until_complete(self._close(self.app))
            finally:
                loop.close()

    def stop(self) -> None:
        """Ask the worker to stop gracefully; safe to call from any thread or signal."""
        loop = self._loop
        if loop is None or loop.is_closed():
            self.shutdown.requested = True
            return
        loop.call_soon_threadsafe(self._request_stop)

    def _request_stop(self) -> None:
        self.shutdown.request(len(self.slots.running()) if self.slots is not None else 0)
        if self._stop_asked is not None:
            self._stop_asked.set()
        if self.consumer is not None:
            self.consumer.nudge.set()

    def _ran_quota(self) -> None:
        if not self.shutdown.requested:
            log.info("worker %s has run its %d jobs: stopping", self.id, self.max_jobs)
            self._request_stop()

    async def arun(self, burst: bool = False) -> None:
        """The worker's main coroutine (what :meth:`run` runs on a fresh loop).

        :raises LoopDied: one of the worker's loops could not be kept alive; the worker
            stopped (gracefully) so that its supervisor replaces it
        """
        self._loop = asyncio.get_running_loop()
        self.waiting.enabled = not burst  # a burst worker leaves once idle: no offers
        app, client, runner = self.app, self.app.aredis(), self.app.ascripts()
        self._client = client
        self.progress = ProgressWriter(runner, app.keys)
        self.notices = DeadNotices(app, alerter_for(app.alert_webhook))
        self.queues[:] = self.bases  # (a run after a stop starts from the queues asked for)
        handovers = HandOvers(app, self.queues, lambda queue: consumer.nodes_ready(queue))
        self.outbox = Outbox(app, runner, before_flush=self.progress.flush,
                             notices=self.notices, on_handover=handovers.now)
        slots = self.slots = Slots(
            app, self.clock, self.concurrency, max_jobs=self.max_jobs,
            processed=self._processed, supervised=self.supervised, progress=self.progress,
            record=self.outbox.add, on_freed=lambda queue, empty: consumer.freed(queue, empty),
            on_back=lambda: consumer.wake_all(), on_quota=self._ran_quota,
            tell_start=lambda held: self.lease_keeper.tell_start(held))
        # A job is held until its outcome is acknowledged: running here, or its outcome
        # waiting in the outbox.
        self.lease_keeper = LeaseKeeper(
            lambda: itertools.chain(slots.held.values(), self.outbox.leases()), slots.leased,
            runner, app.keys, on_cancel=slots.cancel, client=client)
        hand_back = HandBack(runner, app.keys)
        consumer = self.consumer = Consumer(
            self.queues, slots, runner, app.keys, app.limits, self.id, self.waiting,
            self.clock, catch_up=self.lease_keeper.catch_up, notices=self.notices,
            hand_back=hand_back, settle=self._settle, stopping=lambda: self.shutdown.requested)
        self._stop_asked = asyncio.Event()
        signals = install_signals(self._request_stop)
        if not self.shutdown.requested and not await wait_for_redis(client, app.url,
                                                                    self._stop_asked):
            remove_signals(signals)  # stopped before Redis ever answered: nothing to undo
            await self._close(app)
            return
        await check_server(client, app.namespace)
        await redaction.apublish(app, client)  # for views that do not know our tasks
        self.loops = Loops(on_fatal=lambda _exc: self._request_stop())
        listening = Listening(app.url, self.queues, app.keys, runner, self.waiting, slots,
                              consumer, hand_back, self.clock)

        def serve(shards: list[str]) -> None:
            self.queues.extend(shards)  # (the list the listener and hand-overs read)
            consumer.serve(shards)
            if listening_started:  # it blocks on the keys it began with: again, with these
                self.loops.restart("wake listener", lambda: listen_for_wakeups(listening))

        listening_started = False
        shard_watch = ShardWatch(app, client, runner, self.bases, serve,
                                 work=lambda: slots.processed + len(slots.held))
        await shard_watch.first_look()
        self.loops.start("wake listener", lambda: listen_for_wakeups(listening))
        listening_started = True
        self.loops.start("shard watch", shard_watch.run)
        self.loops.start("lease heartbeat", self.lease_keeper.run)
        self.loops.start("progress writer", self.progress.run)
        self.loops.start("outcome outbox", self.outbox.run)
        self.loops.start("worker registry", lambda: keep_registered(self))
        self.loops.start("waiter renewal", lambda: keep_renewed(self.waiting, client,
                                                                 self.clock))
        scheduler = Scheduler(app, self.bases, ServerClock())
        self.loops.start("periodic scheduler", scheduler.run)
        self.loops.start("workflow hand-over", handovers.run)
        announce(self.id, app.url, app.namespace, self.queues, self.concurrency,
                 list(app.tasks))
        self.started.set()
        try:
            await consumer.run(burst)
            # No more hand-overs to a worker on its way out.
            await leave_waiting(self.waiting, client, self.queues, hand_back)
            await self.shutdown.drain(slots, hand_back)
        finally:
            await leave_waiting(self.waiting, client, self.queues, hand_back)
            await self._settle()
            await self.loops.cancel()
            await leave_markers(client, app.keys, self.queues)
            slots.shutdown()
            remove_signals(signals)
            self._processed = slots.processed
            await self._close(app)
            log.info("worker %s stopped after %d jobs", self.id, self.processed)
        if self.loops.fatal is not None:
            raise self.loops.fatal

    @staticmethod
    async def _close(app_or_client: Any) -> None:
        """Close the app's client of this loop (or the client given), bounded."""
        try:
            async with asyncio.timeout(STOP_STEP_SECONDS):
                await app_or_client.aclose()
        except TimeoutError:
            log.warning("closing the worker's Redis connections took over %.0f s; left"
                        " to the operating system", STOP_STEP_SECONDS)

    async def _settle(self) -> None:
        """Post the alerts counted so far, then wait until every outcome is recorded."""
        await self.notices.flush()
        await self.outbox.flush_all()

    # -- what others read ------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """True once a stop was asked for: the worker takes no new work."""
        return self.shutdown.requested

    @property
    def grace(self) -> float:
        """Seconds running jobs get to finish after a stop request (0 after a second)."""
        return self.shutdown.grace

    @property
    def held(self) -> dict[tuple[str, str], Held]:
        """The jobs held now, by (queue, short id)."""
        return {} if self.slots is None else self.slots.held

    @property
    def processed(self) -> int:
        """Runs ended in the worker's life."""
        return self._processed if self.slots is None else self.slots.processed

    @property
    def executor(self) -> Executor | None:
        """What runs the jobs of the current run (None before the first)."""
        return None if self.slots is None else self.slots.executor

    @property
    def stuck(self) -> int:
        """Slots held by sync runs that overran their timeout (capacity lost until they
        return)."""
        return 0 if self.slots is None else self.slots.stuck

    def free_slots(self) -> int:
        """Jobs this worker could lease now (see :meth:`Slots.free`)."""
        return self.concurrency if self.slots is None else self.slots.free()
