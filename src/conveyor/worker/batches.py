"""Batch calls: the jobs of batch tasks, gathered into buffers and run many per call.

A job of a batch task is leased as any other (fetch, hand-off), then waits here in a
buffer of its task and queue (and tenant, with ``Batch(by="tenant")``) instead of taking
a slot. A buffer becomes a call when it holds ``max`` items, when ``wait`` seconds have
passed since its first item, or, once it holds ``min``, as soon as the worker can bring
in no more of its jobs: a fetch from its queue found no more ready jobs (or handed-over
jobs arrived, which happens only to a worker that had none), or the worker holds as many
batch items as it may. A call takes one slot of the worker's concurrency, whatever
its size; gathered items take none but count against the worker's batch room
(:meth:`Batches.cap`), so that a worker holds at most a full call for each slot.

The gathered items stay in the worker's running set (:class:`~.slots.Slots`), so their
leases are beaten, their cancels noticed and a stop hands them back like any job that
has not started. Every item's outcome is given to the outbox in the same loop turn when
its call ends, so that one ``finish`` call records them together, each fenced by its own
lease's token.

The tenant of each item (``BatchItem.tenant``, and the buffer of a ``by="tenant"``
task) is read from its record as the items arrive: one pipelined round trip per arrival,
which leaves the fetch and hand-off scripts as they are.

What becomes of each item when its call ends is decided in :mod:`.batch_outcomes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import hooks
from .. import keys as keyspace
from ..batch import BatchItem
from ..clock import ServerClock
from ..scripts.calls import Outcome
from .backoff import REDIS_ERRORS, pause_after
from .batch_outcomes import ItemOutcomes, Settled
from .executor import Executor, Held, describe

if TYPE_CHECKING:
    from ..app import Conveyor
    from ..task import Task

log = logging.getLogger("conveyor.worker")

# An item gathered: its hold, its tenant, and the loop time it arrived.
Gathered = tuple[Held, str | None, float]


@dataclass(eq=False)
class _Buffer:
    task: Task[Any, Any]
    queue: str
    items: deque[Gathered] = field(default_factory=deque)


class Batches:
    """The buffers of batch tasks and their calls in progress.

    :param app: the application whose tasks run here
    :param clock: the server's clock as the worker reads it
    :param executor: decodes jobs and runs sync calls on its threads
    :param concurrency: the worker's slots (the batch room is a full call for each)
    :param slot_free: whether a slot is free for a call now
    :param finished: given each item's outcome (``Slots``: recorded, its hold released)
    :param progress: where items' progress reports go
    """

    def __init__(self, app: Conveyor, clock: ServerClock, executor: Executor, *,
                 concurrency: int, slot_free: Callable[[], bool],
                 finished: Callable[[Held, Outcome], None], progress: Any = None) -> None:
        self._app = app
        self._clock = clock
        self._executor = executor
        self._slot_free = slot_free
        self._finished = finished
        self._progress = progress
        self._outcomes = ItemOutcomes(
            lambda held, task, value: executor.result(held, task, value), clock)
        self._loop = asyncio.get_running_loop()
        self._now = self._loop.time  # the loop's clock: when items arrived, when they are due
        self._buffers: dict[tuple[str, str, str | None], _Buffer] = {}
        self._arrivals: dict[str, list[Held]] = {}  # per queue: tenants being read
        self._placing: dict[str, asyncio.Task[None]] = {}
        self._drained: set[str] = set()  # queues whose last fetch found no more ready jobs
        self._timer: asyncio.TimerHandle | None = None
        self._running: set[asyncio.Future[None]] = set()
        self.held = 0  # batch items held: gathered, or in a call (kept by Slots)
        largest = max((t.batch.max for t in app.tasks.values() if t.batch is not None),
                      default=0)
        self._cap = concurrency * largest  # (asked for each job leased: worked out once)

    @property
    def calls(self) -> int:
        """Calls in progress: each takes one slot."""
        return len(self._running)

    def cap(self) -> int:
        """Most batch items the worker holds at once: a call of the largest ``max`` for
        each slot (0 when the app has no batch task)."""
        return self._cap

    def queues(self) -> set[str]:
        """Queues that batch tasks send their jobs to by default."""
        return {t.queue for t in self._app.tasks.values() if t.batch is not None}

    def room(self) -> int:
        """Batch items the worker may lease now."""
        return max(0, self.cap() - self.held)

    # -- items arrive ----------------------------------------------------------------------

    def add(self, held: Held) -> None:
        """Gather a job of a batch task leased here (once its tenant is read)."""
        self._arrivals.setdefault(held.queue, []).append(held)
        if held.queue not in self._placing:
            self._placing[held.queue] = asyncio.create_task(self._place(held.queue))

    def fetched(self, queue: str, drained: bool) -> None:
        """A fetch from ``queue`` (or a hand-off) told whether more jobs are ready."""
        if drained:
            self._drained.add(queue)
            self.dispatch()
        else:
            self._drained.discard(queue)

    async def _place(self, queue: str) -> None:
        try:
            while self._arrivals.get(queue):
                arrived = self._arrivals.pop(queue)
                tenants = await self._tenants(queue, arrived)
                now = self._now()
                for held, tenant in zip(arrived, tenants, strict=True):
                    self._gather(held, tenant, now)
                self.dispatch()
        finally:
            self._placing.pop(queue, None)

    async def _tenants(self, queue: str, arrived: list[Held]) -> list[str | None]:
        """The tenant of each job, read from its record; tried again until Redis answers
        (meanwhile the jobs' leases are beaten, and a stop hands them back)."""
        keys = self._app.keys(queue)
        client = self._app.aredis()
        failures = 0
        while True:
            try:
                async with client.pipeline(transaction=False) as pipe:
                    for held in arrived:
                        pipe.hget(keys.job(held.leased.short_id), "tenant")
                    raw = await pipe.execute(raise_on_error=False)
                return [r.decode(errors="replace") if isinstance(r, bytes) and r else None
                        for r in raw]
            except REDIS_ERRORS as exc:
                failures += 1
                pause = pause_after(failures)
                log.warning("could not read the tenants of %d batch job(s) of %s (%s);"
                            " retrying in %.2f s", len(arrived), queue, exc, pause)
                await asyncio.sleep(pause)

    def _gather(self, held: Held, tenant: str | None, now: float) -> None:
        if held.withdrawn:
            return  # cancelled or handed back while its tenant was read
        task = self._app.tasks[held.leased.task]
        assert task.batch is not None
        key = (task.name, held.queue, tenant if task.batch.by == "tenant" else None)
        buffer = self._buffers.get(key)
        if buffer is None:
            buffer = self._buffers[key] = _Buffer(task, held.queue)
        buffer.items.append((held, tenant, now))

    # -- buffers become calls --------------------------------------------------------------

    def _ready(self, buffer: _Buffer, now: float, no_room: bool) -> bool:
        batch = buffer.task.batch
        assert batch is not None
        n = len(buffer.items)
        if n >= batch.max or now - buffer.items[0][2] >= batch.wait:
            return True
        return n >= batch.min and (no_room or buffer.queue in self._drained)

    def dispatch(self) -> None:
        """Start a call for each buffer that is ready, oldest first, while slots are free;
        then arm the timer for the next buffer whose ``wait`` runs out."""
        if not self._buffers and self._timer is None:
            return  # no batch task gathering: the path of every plain job
        now = self._now()
        no_room = self.room() <= 0
        for key, buffer in sorted(self._buffers.items(), key=lambda kv: kv[1].items[0][2]):
            while buffer.items and self._ready(buffer, now, no_room) and self._slot_free():
                self._start(buffer, now)
            if not buffer.items:
                del self._buffers[key]
        self._arm(now)

    def _arm(self, now: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        dues = [b.items[0][2] + b.task.batch.wait for b in self._buffers.values()
                if b.task.batch is not None and b.items[0][2] + b.task.batch.wait > now]
        if dues:
            self._timer = self._loop.call_at(min(dues), self.dispatch)

    def _start(self, buffer: _Buffer, now: float) -> None:
        batch = buffer.task.batch
        assert batch is not None
        taken: list[Gathered] = []
        while buffer.items and len(taken) < batch.max:
            gathered = buffer.items.popleft()
            if gathered[0].try_start(self._clock):  # not cancelled or handed back meanwhile
                taken.append(gathered)
        if not taken:
            return
        task = buffer.task
        if task.is_async:
            call: asyncio.Future[None] = asyncio.create_task(self._acall(task, taken))
        else:
            call = self._loop.create_future()
            self._executor.threads.call(self._call_in_thread, (task, taken),
                                        lambda settled: self._ended(call, settled))
            if task.timeout is not None:
                timer = self._loop.call_later(task.timeout, self._overran, call, task, taken)
                call.add_done_callback(lambda _call: timer.cancel())
        self._running.add(call)

    def _overran(self, call: asyncio.Future[None], task: Task[Any, Any],
                 taken: list[Gathered]) -> None:
        """A sync call ran past the task's timeout: its items fail now as after a
        ``TimeoutError``. Its thread cannot be interrupted, so the call keeps its slot
        until it returns, and what it reports then is dropped."""
        if call.done():
            return
        text = f"timeout: the batch call ran longer than {task.timeout} s"
        log.error("a call of batch task %s overran its %s s timeout; its thread cannot be"
                  " interrupted and keeps its slot until it returns", task.name, task.timeout)
        for held, _, _ in taken:
            self._finished(held, self._outcomes.failed(held, task, TimeoutError(text), text))

    # -- running a call --------------------------------------------------------------------

    def _items(self, task: Task[Any, Any], taken: list[Gathered]
               ) -> tuple[list[BatchItem], Settled]:
        """The items to pass, and the outcomes of jobs that cannot be passed (a corrupt
        payload, an unknown task): those end dead as a lone job would."""
        items: list[BatchItem] = []
        settled: Settled = []
        for held, tenant, _ in taken:
            decoded = self._executor.decode(held)
            if isinstance(decoded, Outcome):
                settled.append((held, decoded))
                continue
            leased = held.leased
            items.append(BatchItem(
                keyspace.job_id(held.queue, leased.short_id), decoded[0], decoded[1], tenant,
                leased.attempts, leased.max_attempts, lease=held, progress=self._progress))
        return items, settled

    def _hooks(self, task: Task[Any, Any], items: list[BatchItem]
               ) -> contextlib.AbstractContextManager[Any]:
        """The app's run hooks (tracing, test helpers), entered once per item."""
        stack = contextlib.ExitStack()
        if self._app.hooks:
            for item in items:
                held: Held = item._lease
                leased = held.leased
                stack.enter_context(hooks.running(
                    self._app, task, held.queue, leased.short_id, leased.attempts,
                    leased.max_attempts, held.opened or leased.args))
        return stack

    def _call_in_thread(self, job: tuple[Task[Any, Any], list[Gathered]]) -> Settled:
        task, taken = job
        try:
            items, settled = self._items(task, taken)
            if not items:
                return settled
            try:
                with self._hooks(task, items):
                    task.fn(items)
            except BaseException as exc:  # whatever the function raises settles its items
                return settled + self._outcomes.settle(task, items, exc)
            return settled + self._outcomes.settle(task, items, None)
        except BaseException as exc:  # never leave a call without outcomes
            text = f"the batch call could not be settled: {describe(exc)}"
            return [(held, self._outcomes.retry(held, task, text)) for held, _, _ in taken]

    async def _acall(self, task: Task[Any, Any], taken: list[Gathered]) -> None:
        call = asyncio.current_task()
        assert call is not None
        try:
            items, settled = self._items(task, taken)
            if items:
                settled += await self._arun(task, items)
        except asyncio.CancelledError:
            self._running.discard(call)
            raise  # interrupted by a stop, which hands the items back
        self._ended(call, settled)

    async def _arun(self, task: Task[Any, Any], items: list[BatchItem]) -> Settled:
        try:
            with self._hooks(task, items):
                if task.timeout is None:
                    await task.fn(items)
                else:
                    try:
                        async with asyncio.timeout(task.timeout) as deadline:
                            await task.fn(items)
                    except TimeoutError:
                        if not deadline.expired():
                            raise
                        text = f"timeout: the batch call ran longer than {task.timeout} s"
                        return self._outcomes.settle(task, items, TimeoutError(text), text)
        except asyncio.CancelledError:
            task_now = asyncio.current_task()
            if task_now is not None and task_now.cancelling() > 0:
                raise
            return self._outcomes.settle(task, items, asyncio.CancelledError(),
                                "CancelledError raised by the task")
        except BaseException as exc:
            return self._outcomes.settle(task, items, exc)
        return self._outcomes.settle(task, items, None)

    def _ended(self, call: asyncio.Future[None], settled: Settled) -> None:
        """A call ended: its slot is free, and every item's outcome goes to the outbox in
        this one turn of the loop (so one ``finish`` records them all)."""
        self._running.discard(call)
        if not isinstance(call, asyncio.Task) and not call.done():
            call.set_result(None)  # a sync call's future: what a stop waits on
        for held, outcome in settled:
            self._finished(held, outcome)
        self.dispatch()

    # -- a stop ----------------------------------------------------------------------------

    def running(self) -> list[asyncio.Future[None]]:
        """What to wait on for the calls in progress to end."""
        return list(self._running)

    def interrupt(self) -> None:
        """Cancel the async calls in progress (their items are handed back by the stop;
        what a sync call reports later is dropped, its items being withdrawn)."""
        for call in list(self._running):
            if isinstance(call, asyncio.Task):
                call.cancel()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
