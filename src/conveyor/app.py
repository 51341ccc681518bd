"""The application object: settings, the task registry and the Redis clients."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import weakref
from collections.abc import Callable, Coroutine, Sequence
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, overload

from . import clients
from . import keys as keyspace
from .encoding import DEFAULT_MAX_PAYLOAD, Codec, Format
from .errors import ConfigurationError, NotReplicated, PartialEnqueue
from .hooks import Hook
from .job import Job, JobInfo
from .scripts import AsyncScriptRunner, ScriptRunner, calls, plain
from .scripts.resend import aresend, resend
from .task import AsyncTask, Task
from .workflow import Workflow, WorkflowHandle
from .workflow import batch as _batch

if TYPE_CHECKING:
    from .alerts import Webhook
    from .deadletters import DeadLetters
    from .flow import Queue
    from .monitor import Monitor
    from .schedule import Periodic
    from .testing import InlineRunner
    from .worker import Worker

log = logging.getLogger("conveyor")
DEFAULT_URL = "redis://127.0.0.1:6379/0"
ENQUEUE_CHUNK = 2000  # jobs per script call; a bulk enqueue pipelines its chunks
# A bulk enqueue whose connection broke sends the same requests again (each chunk's reply
# is kept, so a chunk is never stored twice) for up to this long, through a Redis restart
# or a failover, before it gives up and says which jobs it cannot confirm.
RESOLVE_SECONDS = 15.0
P = ParamSpec("P")
R = TypeVar("R")


class TaskDecorator(Protocol):
    """What ``@app.task(...)`` with arguments returns: a decorator that keeps the
    function's parameters and return type (the awaited one for a coroutine function)."""

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]]) -> AsyncTask[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R]) -> Task[P, R]: ...


class Conveyor:
    """A conveyor application: where jobs are stored and which tasks exist.

    :param url: Redis URL; default ``$CONVEYOR_REDIS_URL``, else ``redis://127.0.0.1:6379/0``
    :param namespace: prefix of every key, so several applications can share a Redis
    :param encoding: ``"json"`` (default) or ``"msgpack"`` for arguments and results
    :param max_payload: largest encoded argument payload accepted, in bytes (default 1 MiB)
    :param limits: retention, dead-letter cap and other bounds on Redis memory
    :param alert_webhook: URL (or :class:`~conveyor.alerts.Webhook`) that receives a
        Slack-compatible message when jobs go dead, batched and rate-limited
    :param durable_replicas: replicas that must confirm a ``durable=True`` enqueue
    :param durable_timeout: seconds a durable enqueue waits for them (``WAIT``)
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        namespace: str = "conveyor",
        encoding: Format = "json",
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        limits: calls.Limits | None = None,
        alert_webhook: str | Webhook | None = None,
        durable_replicas: int = 1,
        durable_timeout: float = 1.0,
    ) -> None:
        self.url = url or os.environ.get("CONVEYOR_REDIS_URL") or DEFAULT_URL
        if not namespace or any(c in namespace for c in "{}"):
            raise ConfigurationError(f"namespace must be non-empty without braces: {namespace!r}")
        self.namespace = namespace
        self.codec = Codec(encoding, max_payload)
        self.limits = limits or calls.Limits()
        self.alert_webhook = alert_webhook
        self.durable_replicas = durable_replicas
        self.durable_timeout = durable_timeout
        self.tasks: dict[str, Task[Any, Any]] = {}
        self.periodics: list[Periodic] = []
        self.dead_hooks: list[Callable[[JobInfo], Any]] = []
        self._async: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[Any, AsyncScriptRunner]
        ] = weakref.WeakKeyDictionary()
        self._registered_queues: set[str] = set()
        self.hooks: list[Hook] = []  # tracing and test helpers: see conveyor.hooks
        self._inline: InlineRunner | None = None  # set by conveyor.testing.inline

    def __repr__(self) -> str:
        return f"<Conveyor {self.url} namespace={self.namespace!r} tasks={len(self.tasks)}>"

    # -- clients ---------------------------------------------------------------------------

    @cached_property
    def redis(self) -> Any:  # redis.Redis; its stubs type replies as unions of everything
        """The synchronous client (thread-safe connection pool), replies as bytes."""
        return clients.sync_client(self.url)

    @cached_property
    def scripts(self) -> ScriptRunner:
        return ScriptRunner(self.redis)

    def _async_pair(self) -> tuple[Any, AsyncScriptRunner]:
        loop = asyncio.get_running_loop()
        pair = self._async.get(loop)
        if pair is None:
            client = clients.async_client(self.url)
            pair = (client, AsyncScriptRunner(client))
            self._async[loop] = pair
        return pair

    def aredis(self) -> Any:  # redis.asyncio.Redis
        """The asyncio client of the running event loop (one per loop), replies as bytes."""
        return self._async_pair()[0]

    def ascripts(self) -> AsyncScriptRunner:
        return self._async_pair()[1]

    def close(self) -> None:
        """Close the synchronous client's connections."""
        if "redis" in self.__dict__:
            self.redis.close()
            del self.__dict__["redis"]
            self.__dict__.pop("scripts", None)

    async def aclose(self) -> None:
        """Close the running loop's asyncio client."""
        loop = asyncio.get_running_loop()
        pair = self._async.pop(loop, None)
        if pair is not None:
            await pair[0].aclose()

    def keys(self, queue: str) -> keyspace.QueueKeys:
        return keyspace.queue_keys(self.namespace, queue)

    # -- tasks -----------------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[P, Coroutine[Any, Any, R]]) -> AsyncTask[P, R]: ...

    @overload
    def task(self, fn: Callable[P, R]) -> Task[P, R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        *,
        name: str | None = None,
        queue: str = "default",
        retries: int = 3,
        backoff: float = 1.0,
        timeout: float | None = None,
        visibility_timeout: float = 30.0,
        idle_threshold: float = 300.0,
    ) -> TaskDecorator: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        queue: str = "default",
        retries: int = 3,
        backoff: float = 1.0,
        timeout: float | None = None,
        visibility_timeout: float = 30.0,
        idle_threshold: float = 300.0,
    ) -> Any:
        """Register a function (sync or async) as a task.

        The task keeps the function's types: ``enqueue`` takes its parameters, and the
        :class:`~conveyor.Job` it returns has its return type (for a coroutine function,
        what the coroutine returns).

        :param name: task name stored with its jobs (default ``module.function``)
        :param queue: queue its jobs go to
        :param retries: runs allowed after the first before the job goes dead
        :param backoff: base seconds of the exponential, jittered, capped retry delay
        :param timeout: seconds a run may take; an async run is cancelled, a sync one is
            abandoned and failed (a supervised worker process is replaced)
        :param visibility_timeout: lease length in seconds; heartbeats keep it alive while
            the job runs, so it only bounds how soon a dead worker's job runs again
        :param idle_threshold: seconds without a finished job after which the type is idle
        """

        def register(func: Callable[..., Any]) -> Task[Any, Any]:
            task_name = name or f"{func.__module__}.{func.__qualname__}"
            existing = self.tasks.get(task_name)
            if existing is not None and existing.fn is not func:
                raise ConfigurationError(f"a task named {task_name!r} is already registered")
            kind = AsyncTask if inspect.iscoroutinefunction(func) else Task
            task: Task[Any, Any] = kind(
                self, func, name=task_name, queue=queue, retries=retries, backoff=backoff,
                timeout=timeout, visibility_timeout=visibility_timeout,
                idle_threshold=idle_threshold,
            )
            self.tasks[task_name] = task
            return task

        return register(fn) if fn is not None else register

    def periodic(
        self,
        cron: str,
        *,
        queue: str = "default",
        name: str | None = None,
        catch_up: bool = False,
        **task_options: Any,
    ) -> TaskDecorator:
        """Register a task that fires on a cron schedule (UTC), once per tick across workers.

        :param cron: five fields (minute precision) or six (the first is seconds)
        :param queue: queue the fired jobs go to
        :param name: task name (default ``module.function``)
        :param catch_up: after an outage fire every missed tick, not just the latest
        :param task_options: other :meth:`task` settings (retries, timeout, ...)
        """
        from .schedule import Periodic

        def register(func: Callable[..., Any]) -> Task[Any, Any]:
            task: Task[Any, Any] = self.task(name=name, queue=queue, **task_options)(func)
            self.periodics.append(Periodic(task=task, cron=cron, catch_up=catch_up))
            return task

        decorator: TaskDecorator = register  # type: ignore[assignment]
        return decorator

    def queues(self) -> list[str]:
        """Every queue the app's tasks and periodic jobs name, sorted."""
        return sorted({t.queue for t in self.tasks.values()})

    def queue(self, name: str) -> Queue:
        """A handle on queue ``name``: its flow-control limits and pause switch (no I/O)."""
        from .flow import Queue

        if not isinstance(name, str) or not name or keyspace.JOB_ID_SEPARATOR in name:
            raise ConfigurationError(f"queue name must be a non-empty string without"
                                     f" {keyspace.JOB_ID_SEPARATOR!r}, got {name!r}")
        return Queue(self, name)

    def pause(self, queue: str) -> None:
        """Stop handing out jobs of ``queue``; it keeps accepting new ones."""
        self.redis.set(self.keys(queue).paused, 1)

    def resume(self, queue: str) -> None:
        """Hand out jobs of ``queue`` again, and wake its idle workers (a wake key of the
        wrong type wakes nobody: idle workers also look for work after each quiet spell)."""
        k = self.keys(queue)
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.delete(k.paused).lpush(k.wake, b"1").ltrim(k.wake, 0, 0)
            resumed = pipe.execute(raise_on_error=False)[0]
        if isinstance(resumed, Exception):
            raise resumed

    def is_paused(self, queue: str) -> bool:
        return bool(self.redis.exists(self.keys(queue).paused))

    def job(self, id: str) -> Job[Any]:
        """A handle on the job with this id (no Redis call is made)."""
        return Job(self, id)

    def workflow(self) -> Workflow:
        """A new, empty :class:`~conveyor.Workflow` builder (no I/O until it is enqueued)."""
        return Workflow(self)

    def workflow_handle(self, id: str) -> WorkflowHandle:
        """A handle on an existing workflow, by its id (no I/O)."""
        return WorkflowHandle(self, id)

    def batch(
        self, task: Task[Any, Any], items: Sequence[Any], then: Task[Any, Any] | None = None,
        *, then_args: Sequence[Any] = (), run_if: str = "succeeded",
    ) -> WorkflowHandle:
        """Enqueue a batch: one ``task`` job per item (a tuple of arguments, a dict of
        keyword arguments, or a single argument) and, with ``then``, a completion job that
        runs once after all of them (``run_if="finished"``: however they ended). The
        completion job reads their results with ``parent_results()``. One workflow, one
        call; the handle's :meth:`~conveyor.WorkflowHandle.result` waits for all."""
        wf = self.workflow()
        _batch(wf, task, items, then=then, then_args=then_args, run_if=run_if)
        return wf.enqueue()

    def dead_letters(self, queue: str = "default") -> DeadLetters:
        """The dead-letter set of ``queue``: list, inspect, requeue, purge."""
        from .deadletters import DeadLetters

        return DeadLetters(self, queue)

    def on_dead(self, callback: Callable[[JobInfo], Any]) -> Callable[[JobInfo], Any]:
        """Call ``callback(JobInfo)`` in the worker process whenever a job goes dead."""
        self.dead_hooks.append(callback)
        return callback

    @cached_property
    def monitor(self) -> Monitor:
        """Read-only views: active and idle task types, stats, scaling advice."""
        from .monitor import Monitor

        return Monitor(self)

    def worker(
        self, queues: Sequence[str] | None = None, concurrency: int = 32, **options: Any
    ) -> Worker:
        """A worker consuming ``queues`` (default: every queue the app's tasks name)."""
        from .worker import Worker

        return Worker(self, queues=queues, concurrency=concurrency, **options)

    # -- storing jobs ----------------------------------------------------------------------

    def _chunks(
        self, queue: str, spec: calls.JobSpec, jobs: Sequence[tuple[str, bytes]]
    ) -> list[Any]:
        k = self.keys(queue)
        return [
            calls.enqueue(k, spec, jobs[i : i + ENQUEUE_CHUNK], self.limits)
            for i in range(0, len(jobs), ENQUEUE_CHUNK)
        ]

    def store(
        self, queue: str, spec: calls.JobSpec, jobs: Sequence[tuple[str, bytes]],
        durable: bool = False,
    ) -> list[tuple[str, bool]]:
        """Store jobs given as (short id, encoded arguments), all as ``spec`` says, in one
        round trip; (short id, created) for each.

        :param durable: also wait (``WAIT``, on the same connection) until
            :attr:`durable_replicas` replicas have the jobs
        :raises NotReplicated: durable, and fewer replicas confirmed in time
        """
        if self._inline is not None:  # conveyor.testing.inline: run here, no Redis
            return self._inline.store(queue, spec, jobs)
        if len(jobs) == 1 and queue in self._registered_queues and not durable:
            return self.scripts.enqueue_one(self.keys(queue), spec, self.limits, jobs[0],
                                            lambda: self._chunks(queue, spec, jobs)[0])
        chunks = self._chunks(queue, spec, jobs)
        if not self.scripts.pipelined:  # a cluster: its pipelines refuse script calls
            if durable:
                raise ConfigurationError("durable enqueue is not available on a Redis"
                                         " Cluster (WAIT must follow the writes on their"
                                         " connection)")
            return self._store_apart(queue, chunks)
        register = ("SADD", keyspace.queues_key(self.namespace), queue)
        wait = [("WAIT", self.durable_replicas, max(1, int(self.durable_timeout * 1000)))]
        try:  # the same requests until answered: each chunk is stored once (keep_reply)
            replies = resend(lambda: self.scripts.send_all(
                chunks, before=[register], after=wait if durable else ()), RESOLVE_SECONDS)
        except plain.BROKEN as exc:
            raise self._unconfirmed(queue, [], chunks, exc) from exc
        acked: Any = replies.pop() if durable else 0
        stored = self._stored(queue, chunks, replies)
        self._registered_queues.add(queue)
        if durable and (isinstance(acked, Exception) or int(acked) < self.durable_replicas):
            confirmed = 0 if isinstance(acked, Exception) else int(acked)
            raise NotReplicated(
                f"{len(stored)} job(s) of queue {queue!r} are stored on the primary, but"
                f" {confirmed} of {self.durable_replicas} replica(s) confirmed them within"
                f" {self.durable_timeout} s", [Job._of(self, queue, s) for s, _ in stored],
                confirmed)
        return stored

    def _unconfirmed(self, queue: str, stored: list[tuple[str, bool]], chunks: list[Any],
                     error: BaseException) -> PartialEnqueue:
        """The error of a bulk enqueue whose last replies never came, however often it was
        sent: ``stored`` are stored, the jobs of ``chunks`` may be (each chunk all or
        none); their records tell (``job.info()`` raises :class:`JobNotFound` if not)."""
        jobs = [Job._of(self, queue, short) for short, _ in stored]
        unsure = [Job._of(self, queue, str(short)) for call in chunks
                  for short in call.args[call.fixed::2]]
        raised = PartialEnqueue(
            f"{len(jobs)} job(s) of queue {queue!r} are stored and {len(unsure)} may be:"
            f" Redis stopped answering ({type(error).__name__}: {error}); .jobs lists the"
            " stored ones, .unconfirmed the others (job.info() tells whether each exists)",
            jobs, unsure)
        raised.__cause__ = error
        return raised

    def _partial(self, queue: str, stored: list[tuple[str, bool]], error: BaseException
                 ) -> BaseException:
        """The error to raise when a bulk enqueue failed after ``stored``: the original
        one when nothing was stored, else :class:`PartialEnqueue` naming what was."""
        if not stored:
            return error
        jobs = [Job._of(self, queue, short) for short, _ in stored]
        raised = PartialEnqueue(
            f"{len(jobs)} job(s) of queue {queue!r} were stored before Redis refused the"
            f" rest ({type(error).__name__}: {error}); .jobs lists the stored ones", jobs)
        raised.__cause__ = error
        return raised

    def _stored(self, queue: str, chunks: list[Any], replies: list[Any]
                ) -> list[tuple[str, bool]]:
        """What a pipelined store stored: (short id, created) for each job, read from the
        replies of the queue's registration and of each chunk.

        :raises PartialEnqueue: a chunk failed (the ones before it are stored)
        """
        stored: list[tuple[str, bool]] = []
        for call, reply in zip(chunks, replies[1:], strict=True):
            if isinstance(reply, Exception):
                raise self._partial(queue, stored, reply)
            stored.extend(call.parse(reply))
        if isinstance(replies[0], Exception):
            raise self._partial(queue, stored, replies[0])
        return stored

    def _store_apart(self, queue: str, chunks: list[Any]) -> list[tuple[str, bool]]:
        """:meth:`store` without a pipeline: register the queue once, then one script call
        per chunk (each in the queue's slot, so each reaches the node that owns it)."""
        if queue not in self._registered_queues:
            self.redis.sadd(keyspace.queues_key(self.namespace), queue)
            self._registered_queues.add(queue)
        stored: list[tuple[str, bool]] = []
        for i, call in enumerate(chunks):
            try:
                stored.extend(resend(partial(self.scripts.run, call), RESOLVE_SECONDS))
            except plain.BROKEN as exc:
                raise self._unconfirmed(queue, stored, chunks[i:], exc) from exc
            except Exception as exc:
                raise self._partial(queue, stored, exc) from exc
        return stored

    async def astore(
        self, queue: str, spec: calls.JobSpec, jobs: Sequence[tuple[str, bytes]],
        durable: bool = False,
    ) -> list[tuple[str, bool]]:
        """Async twin of :meth:`store`."""
        if self._inline is not None:
            return await self._inline.astore(queue, spec, jobs)
        if durable:  # the writes and their WAIT share one connection: the sync pipeline's
            return await asyncio.to_thread(self.store, queue, spec, jobs, True)
        client, runner = self._async_pair()
        if len(jobs) == 1 and queue in self._registered_queues:
            return await runner.enqueue_one(self.keys(queue), spec, self.limits, jobs[0],
                                            lambda: self._chunks(queue, spec, jobs)[0])
        chunks = self._chunks(queue, spec, jobs)
        if runner.pipelined:  # one round trip, as the sync store
            register = ("SADD", keyspace.queues_key(self.namespace), queue)
            try:
                replies = await aresend(lambda: runner.send_all(chunks, [register]),
                                        RESOLVE_SECONDS)
            except plain.BROKEN as exc:
                raise self._unconfirmed(queue, [], chunks, exc) from exc
            stored = self._stored(queue, chunks, replies)
            self._registered_queues.add(queue)
            return stored
        if queue not in self._registered_queues:
            await client.sadd(keyspace.queues_key(self.namespace), queue)
            self._registered_queues.add(queue)
        out: list[tuple[str, bool]] = []
        for i, call in enumerate(chunks):
            try:
                out.extend(await aresend(partial(runner.run, call), RESOLVE_SECONDS))
            except plain.BROKEN as exc:
                raise self._unconfirmed(queue, out, chunks[i:], exc) from exc
            except Exception as exc:
                raise self._partial(queue, out, exc) from exc
        return out

    def known_queues(self) -> list[str]:
        """Every queue that has ever received a job in this namespace, sorted."""
        names = self.redis.smembers(keyspace.queues_key(self.namespace))
        return sorted({n.decode() for n in names} | set(self.queues()))
