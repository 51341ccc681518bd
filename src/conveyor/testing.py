"""Testing your own tasks: run them inline without Redis, or drain a real Redis in process.

>>> from conveyor import testing
>>> with testing.inline(app):            # no Redis: enqueue runs the task at once
...     assert add.enqueue(1, 2).result() == 3
>>> infos = testing.drain(app)           # real Redis: run every ready job here

:func:`inline` keeps what matters for a test of a task and drops what needs a server:
arguments and results go through the app's real encoder (an argument that would fail
at ``enqueue`` fails here too) and are converted to the task's type hints as on a worker;
a failing task is retried at once up to its ``retries`` (no backoff sleeps; ``retry_on``,
``no_retry_on`` and :class:`~conveyor.Fail` apply) and then goes dead (``result()``
raises :class:`~conveyor.JobFailed`, ``on_dead`` callbacks run); and jobs a task enqueues
run as well, depth first. Job options (``delay``, ``priority``, ``tenant``, ``key``) are
accepted and not acted on: every job runs at once. A batch task is called with the items
of one ``enqueue`` (a list of one) or of one ``enqueue_many`` (all of them) at once.

:func:`drain` runs the app's real worker in this process until no job is ready, and
returns what it ran. :func:`isolated` gives a test its own key namespace on a shared
Redis and removes its keys afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from . import hooks
from . import keys as keyspace
from .encryption import Unsealable, open_payload, seal_result
from .errors import Fail
from .hints import ArgumentMismatch, convert_arguments
from .inline_batches import run_batch
from .job import JobInfo
from .producer import RedisSender, Sent
from .record import ARGS, ENQUEUED_MS, MAX_ATTEMPTS, PRIORITY, STATE, TASK
from .waits import due_now

if TYPE_CHECKING:
    from .app import Conveyor
    from .producer import Plan
    from .scripts import ScriptCall
    from .scripts.calls import JobSpec
    from .task import Task

__all__ = ["InlineRunner", "adrain", "drain", "inline", "isolated"]


class InlineRunner:
    """What :func:`inline` installs on an app: the sender (see :mod:`conveyor.producer`)
    that stores jobs as records in memory and runs each at once, in this process. The
    producer plans jobs as for Redis and runs the enqueue hooks as for Redis; only the
    sending differs. A workflow's calls still go to Redis: its nodes wait for each other,
    which needs the real scripts (use :func:`drain`)."""

    def __init__(self, app: Conveyor) -> None:
        self.app = app
        self.records: dict[tuple[str, str], dict[bytes, bytes]] = {}
        self._lock = threading.RLock()

    def record(self, queue: str, short_id: str) -> dict[bytes, bytes]:
        """The job's record as Redis would hold it (empty when there is no such job)."""
        with self._lock:
            return dict(self.records.get((queue, short_id), {}))

    def _new(self, queue: str, spec: JobSpec, short_id: str, payload: bytes) -> None:
        record = {
            TASK.encode(): spec.task.encode(), ARGS.encode(): payload, STATE.encode(): b"ready",
            PRIORITY.encode(): str(spec.priority).encode(), b"tenant": spec.tenant.encode(),
            b"attempts": b"0", MAX_ATTEMPTS.encode(): str(spec.max_attempts).encode(),
            ENQUEUED_MS.encode(): b"%d" % (time.time() * 1000),
        }
        with self._lock:
            self.records[(queue, short_id)] = record

    def _update(self, queue: str, short_id: str, **fields: object) -> None:
        with self._lock:
            record = self.records[(queue, short_id)]
            for name, value in fields.items():
                field = STATE if name == "state" else name
                record[field.encode()] = value if isinstance(value, bytes) else str(value).encode()

    def send(self, plan: Plan) -> list[tuple[str, bool]]:
        """Store and run the plan's jobs (what :class:`~conveyor.producer.RedisSender`
        does with a Redis)."""
        task = self.app.tasks.get(plan.spec.task)
        if task is not None and task.batch is not None:  # one call for the plan's jobs
            for short_id, payload in plan.jobs:
                self._new(plan.queue, plan.spec, short_id, payload)
            run_batch(self, plan.queue, task, list(plan.jobs), self._call_sync)
            return [(short_id, True) for short_id, _ in plan.jobs]
        for short_id, payload in plan.jobs:
            self._new(plan.queue, plan.spec, short_id, payload)
            self._run(plan.queue, plan.spec.task, short_id, payload, self._call_sync)
        return [(short_id, True) for short_id, _ in plan.jobs]

    async def asend(self, plan: Plan) -> list[tuple[str, bool]]:
        """Async twin of :meth:`send`: async tasks are awaited on the running loop."""
        queue, spec = plan.queue, plan.spec
        batch_task = self.app.tasks.get(spec.task)
        if batch_task is not None and batch_task.batch is not None:
            return self.send(plan)  # (an async batch function runs on a thread of its own)
        for short_id, payload in plan.jobs:
            self._new(queue, spec, short_id, payload)
            task = self.app.tasks.get(spec.task)
            if task is not None and task.is_async:
                await self._arun(queue, task, short_id, payload)
            else:
                self._run(queue, spec.task, short_id, payload, self._call_sync)
        return [(short_id, True) for short_id, _ in plan.jobs]

    def send_together(self, queued: Sequence[tuple[str, ScriptCall[Any]]]) -> Sent:
        """A workflow's calls: sent to Redis (see the class)."""
        return RedisSender(self.app).send_together(queued)

    async def asend_together(self, queued: Sequence[tuple[str, ScriptCall[Any]]]) -> Sent:
        """Async twin of :meth:`send_together`."""
        return await RedisSender(self.app).asend_together(queued)

    @staticmethod
    def _call_sync(task: Task[Any, Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
        if not task.is_async:
            return task.fn(*args, **kwargs)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(task.fn(*args, **kwargs))
        # A loop runs in this thread (a sync enqueue from async code): run it on another.
        result: list[Any] = []

        def target() -> None:
            try:
                result.append((True, asyncio.run(task.fn(*args, **kwargs))))
            except BaseException as exc:
                result.append((False, exc))

        thread = threading.Thread(target=target, name="conveyor-inline")
        thread.start()
        thread.join()
        ok, value = result[0]
        if not ok:
            raise value
        return value

    def _run(self, queue: str, name: str, short_id: str, payload: bytes, call: Any) -> None:
        task = self.app.tasks.get(name)
        if task is None:
            self._dead(queue, short_id, f"unknown task {name!r}")
            return
        payload = self.opened(queue, short_id, task, payload)
        arguments = self._arguments(queue, short_id, task, payload)
        if arguments is None:
            return
        args, kwargs = arguments
        for attempt in range(1, task.max_attempts + 1):
            self._start(queue, short_id, attempt)
            try:
                with self._hooks(task, queue, short_id, attempt, payload):
                    value = call(task, args, kwargs)
                self._succeed(queue, short_id, task, value)
                return
            except Exception as exc:
                if self._failed(queue, short_id, task, attempt, exc):
                    return

    async def _arun(self, queue: str, task: Task[Any, Any], short_id: str, payload: bytes
                    ) -> None:
        payload = self.opened(queue, short_id, task, payload)
        arguments = self._arguments(queue, short_id, task, payload)
        if arguments is None:
            return
        args, kwargs = arguments
        for attempt in range(1, task.max_attempts + 1):
            self._start(queue, short_id, attempt)
            try:
                with self._hooks(task, queue, short_id, attempt, payload):
                    value = await task.fn(*args, **kwargs)
                self._succeed(queue, short_id, task, value)
                return
            except Exception as exc:
                if self._failed(queue, short_id, task, attempt, exc):
                    return

    def opened(self, queue: str, short_id: str, task: Task[Any, Any], payload: bytes) -> bytes:
        """The job's encoded arguments, opened when sealed (as a worker opens them); b""
        when they cannot be (the job is dead then, as on a worker)."""
        try:
            return open_payload(self.app.encryption, payload, task.name, "args",
                                keyspace.job_id(queue, short_id))
        except Unsealable as exc:
            self._start(queue, short_id, 1)
            self._dead(queue, short_id, f"arguments cannot be opened: {exc}")
            return b""

    def _arguments(self, queue: str, short_id: str, task: Task[Any, Any], payload: bytes
                   ) -> tuple[list[Any], dict[str, Any]] | None:
        """The job's arguments converted to the task's type hints, as a worker converts
        them; None when one does not fit (the job is dead then, as on a worker)."""
        if not payload:  # could not be opened: dead already
            return None
        args, kwargs = self.app.codec.decode_args(payload)
        try:
            return convert_arguments(task.hints, task.name, args, kwargs)
        except ArgumentMismatch as exc:
            self._start(queue, short_id, 1)
            self._dead(queue, short_id, str(exc))
            return None

    def _hooks(self, task: Task[Any, Any], queue: str, short_id: str, attempt: int,
               payload: bytes) -> AbstractContextManager[None]:
        return hooks.running(self.app, task, queue, short_id, attempt, task.max_attempts,
                             payload)

    def _start(self, queue: str, short_id: str, attempt: int) -> None:
        self._update(queue, short_id, state="active", attempts=attempt,
                     started_at=repr(time.time()))

    def _succeed(self, queue: str, short_id: str, task: Task[Any, Any], value: Any) -> None:
        encoded = self.app.codec.encode_result(value)  # a result that cannot be stored fails
        if task.encrypt:
            encoded = seal_result(self.app, task, keyspace.job_id(queue, short_id), encoded)
        self._update(queue, short_id, state="succeeded", result=encoded,
                     finished_at=repr(time.time()))

    def _failed(self, queue: str, short_id: str, task: Task[Any, Any], attempt: int,
                exc: Exception) -> bool:
        """Record a failed attempt; True when it was the last one (the job is dead)."""
        from .worker.executor import describe

        error = exc.reason if isinstance(exc, Fail) else describe(exc)
        if attempt < task.max_attempts and task.retries_after(exc):
            self._update(queue, short_id, state="retrying", error=error)
            return False
        self._dead(queue, short_id, error)
        return True

    def _dead(self, queue: str, short_id: str, error: str) -> None:
        self._update(queue, short_id, state="dead", error=error, finished_at=repr(time.time()))
        info = JobInfo.from_record(self.app, queue, short_id, self.record(queue, short_id))
        for callback in self.app.dead_hooks:
            callback(info)


@contextlib.contextmanager
def inline(app: Conveyor) -> Iterator[InlineRunner]:
    """Within the block, ``enqueue`` (and ``aenqueue``, ``enqueue_many``) runs each job at
    once in this process, with no Redis; ``job.result()`` and ``job.info()`` read what it
    did. Use the job handles inside the block: outside it they read Redis again.

    :param app: the application whose tasks run inline
    """
    previous = app._sender
    runner = InlineRunner(app)
    app._sender = runner
    try:
        yield runner
    finally:
        app._sender = previous


class _Ran(hooks.Hook):
    """Notes the jobs a drain runs, in the order they started."""

    def __init__(self) -> None:
        self.ids: dict[str, None] = {}  # insertion-ordered set; appends are thread-safe

    def run(self, task: Task[Any, Any], attempt: hooks.Attempt
            ) -> AbstractContextManager[None]:
        self.ids.setdefault(attempt.job_id)
        return nullcontext()


def _make_due(app: Conveyor, queues: Sequence[str]) -> int:
    """Make every scheduled job and pending retry of ``queues`` due now (each score
    multiplied by zero in one atomic command), and the durable sleeps and wait timeouts
    of its suspended jobs over now; how many there were."""
    total = 0
    for queue in queues:
        k = app.keys(queue)
        for short in app.redis.sscan_iter(k.suspended, count=1000):
            key = k.job(short.decode())
            ended = due_now(app.redis.hget(key, "wt"))
            if ended is not None:
                app.redis.hset(key, "wt", ended)
        total += int(app.redis.zunionstore(k.delayed, {k.delayed: 0}))
    return total


def _burst(app: Conveyor, queues: Sequence[str], deadline: float) -> None:
    """Run a burst worker to its end on a thread of its own: it needs a loop of its own
    (the caller may be async code), and a worker on the main thread would take over the
    process's SIGINT and SIGTERM handlers."""
    worker = app.worker(queues=queues, concurrency=1, grace=0)
    failed: list[BaseException] = []

    def target() -> None:
        try:
            worker.run(burst=True)
        except BaseException as exc:  # surfaced in the caller
            failed.append(exc)

    thread = threading.Thread(target=target, name="conveyor-drain", daemon=True)
    timer = threading.Timer(max(0.0, deadline - time.monotonic()), worker.stop)
    timer.daemon = True
    thread.start()
    timer.start()
    try:
        thread.join()
    except BaseException:  # Ctrl-C in the test: stop the worker, hand its jobs back
        worker.stop()
        thread.join(10)
        raise
    finally:
        timer.cancel()
    if failed:
        raise failed[0]


def drain(app: Conveyor, queues: Sequence[str] | None = None,
          include_scheduled: bool = False, timeout: float = 30) -> list[JobInfo]:
    """Run, in this process, every ready job of ``queues`` on the app's real Redis, until
    none is ready; the :class:`~conveyor.JobInfo` of each job it ran, in the order they
    started (read after the drain: a job that failed and will retry says ``retrying``).
    Jobs run one at a time, as a worker takes them (priority, then tenants in turn).

    :param queues: queues to drain (default: every queue the app's tasks name)
    :param include_scheduled: also run scheduled jobs and pending retries now, as if
        their time had come, until none is left (so a failing job runs to its end);
        durable sleeps and wait timeouts (``ctx.sleep``, ``ctx.wait_for(timeout=...)``)
        end now too
    :param timeout: seconds after which the drain stops and raises
    :raises TimeoutError: jobs were still ready after ``timeout`` seconds
    :raises redis.exceptions.ConnectionError: Redis cannot be reached
    """
    names = list(queues) if queues else app.queues() or ["default"]
    app.redis.ping()  # no Redis: fail now (a worker would retry until the timeout)
    ran = _Ran()
    app.hooks.append(ran)
    deadline = time.monotonic() + timeout
    try:
        while True:
            pending = _make_due(app, names) if include_scheduled else 0
            before = len(ran.ids)
            _burst(app, names, deadline)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"drain: jobs of {names} were still running or ready"
                                   f" after {timeout} s")
            if not include_scheduled or (pending == 0 and len(ran.ids) == before):
                break
    finally:
        app.hooks.remove(ran)
    return [app.job(job_id).info() for job_id in ran.ids]


async def adrain(app: Conveyor, queues: Sequence[str] | None = None,
                 include_scheduled: bool = False, timeout: float = 30) -> list[JobInfo]:
    """Async twin of :func:`drain` (the worker runs on a thread of its own)."""
    return await asyncio.to_thread(drain, app, queues, include_scheduled, timeout)


@contextlib.contextmanager
def isolated(app: Conveyor, namespace: str | None = None) -> Iterator[str]:
    """Give ``app`` a fresh key namespace for the block, then delete every key under it:
    tests sharing one Redis never see each other's jobs.

    :param namespace: the namespace to use (default: a random one)
    :returns: the namespace in use
    """
    name = namespace or f"test-{uuid.uuid4().hex[:12]}"
    previous, registered = app.namespace, set(app._registered_queues)
    app.namespace = name
    app._registered_queues.clear()
    try:
        yield name
    finally:
        with contextlib.suppress(Exception):  # a test that stopped Redis still ends
            for pattern in ("{" + name + ":*", keyspace.queues_key(name)):
                keys = list(app.redis.scan_iter(match=pattern, count=1000))
                for i in range(0, len(keys), 500):
                    app.redis.delete(*keys[i : i + 500])
        app.namespace = previous
        app._registered_queues = registered

