"""The application object: settings, the task registry and the Redis clients."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from . import clients, producer, sharding
from . import keys as keyspace
from .declaring import TaskDeclarations
from .encoding import DEFAULT_MAX_PAYLOAD, Codec, Format
from .encryption import Encryption
from .errors import ConfigurationError
from .hooks import Hook
from .job import Job, JobInfo
from .limits import Queue
from .scripts import AsyncScriptRunner, ScriptRunner, calls
from .task import Task
from .urls import check_url, public_url, with_tls
from .workflow import Workflow, WorkflowHandle
from .workflow import batch as _batch

if TYPE_CHECKING:
    from .alerts import Webhook
    from .deadletters import DeadLetters
    from .monitor import Monitor
    from .schedule import Periodic
    from .worker import Worker

log = logging.getLogger("conveyor")
DEFAULT_URL = "redis://127.0.0.1:6379/0"


class Conveyor(TaskDeclarations):
    """A conveyor application: where jobs are stored and which tasks exist.

    :param url: Redis URL; default ``$CONVEYOR_REDIS_URL``, else ``redis://127.0.0.1:6379/0``
        (checked now: see :func:`conveyor.urls.check_url` for the schemes accepted)
    :param namespace: prefix of every key, so several applications can share a Redis
    :param encoding: ``"json"`` (default) or ``"msgpack"`` for arguments and results
    :param max_payload: largest encoded argument payload accepted, in bytes (default 1 MiB)
    :param limits: retention, dead-letter cap and other bounds on Redis memory
    :param alert_webhook: URL (or :class:`~conveyor.alerts.Webhook`) that receives a
        Slack-compatible message when jobs go dead, batched and rate-limited
    :param durable_replicas: replicas that must confirm a ``durable=True`` enqueue
    :param durable_timeout: seconds a durable enqueue waits for them (``WAIT``)
    :param encryption: the keys that seal the arguments and results of tasks declared
        ``encrypt=True`` (see ``docs/security.md``)
    :param ssl: TLS options for a ``rediss://`` (``rediss+cluster://``,
        ``rediss+sentinel://``) URL: redis-py's ``ssl_*`` options without the prefix, e.g.
        ``{"ca_certs": "ca.pem", "certfile": "c.pem", "keyfile": "k.pem"}``; they are added
        to the URL's query, so ``app.url`` carries them to every client made from it (see
        :func:`conveyor.urls.with_tls`). A ``ValueError`` for a URL without TLS.
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
        encryption: Encryption | None = None,
        ssl: Mapping[str, Any] | None = None,
    ) -> None:
        self.url = check_url(url or os.environ.get("CONVEYOR_REDIS_URL") or DEFAULT_URL)
        if ssl is not None:
            self.url = with_tls(self.url, ssl)
        if not namespace or any(c in namespace for c in "{}"):
            raise ConfigurationError(f"namespace must be non-empty without braces: {namespace!r}")
        self.namespace = namespace
        self.codec = Codec(encoding, max_payload)
        self.limits = limits or calls.Limits()
        self.alert_webhook = alert_webhook
        self.durable_replicas = durable_replicas
        self.durable_timeout = durable_timeout
        if encryption is not None and not isinstance(encryption, Encryption):
            raise ConfigurationError("encryption= takes a conveyor.Encryption")
        self.encryption = encryption  # seals the tasks declared encrypt=True
        self.tasks: dict[str, Task[Any, Any]] = {}
        self.periodics: list[Periodic] = []
        self.dead_hooks: list[Callable[[JobInfo], Any]] = []
        self.expire_hooks: list[Callable[[JobInfo], Any]] = []
        self._async = clients.PerLoop()  # asyncio clients, one per event loop
        self._registered_queues: set[str] = set()
        self._layouts = sharding.Layouts(self)  # where the jobs of sharded queues go
        self.hooks: list[Hook] = []  # tracing and test helpers: see conveyor.hooks
        # where jobs go: Redis, or conveyor.testing.inline's runner (see conveyor.producer)
        self._sender: producer.Sender = producer.RedisSender(self)

    def __repr__(self) -> str:
        return (f"<Conveyor {public_url(self.url)} namespace={self.namespace!r}"
                f" tasks={len(self.tasks)}>")

    # -- clients ---------------------------------------------------------------------------

    @cached_property
    def redis(self) -> Any:  # redis.Redis; its stubs type replies as unions of everything
        """The synchronous client (thread-safe connection pool), replies as bytes."""
        return clients.sync_client(self.url)

    @cached_property
    def scripts(self) -> ScriptRunner:
        return ScriptRunner(self.redis)

    def aredis(self) -> Any:  # redis.asyncio.Redis
        """The asyncio client of the running event loop (one per loop), replies as bytes."""
        return self._async.get(self.url)[0]

    def ascripts(self) -> AsyncScriptRunner:
        return self._async.get(self.url)[1]

    def close(self) -> None:
        """Close the synchronous client's connections."""
        if "redis" in self.__dict__:
            self.redis.close()
            del self.__dict__["redis"]
            self.__dict__.pop("scripts", None)

    async def aclose(self) -> None:
        """Close the running loop's asyncio client."""
        await self._async.aclose()

    def keys(self, queue: str) -> keyspace.QueueKeys:
        return keyspace.queue_keys(self.namespace, queue)

    def queues(self) -> list[str]:
        """Every queue the app's tasks and periodic jobs name, sorted."""
        return sorted({t.queue for t in self.tasks.values()})

    def queue(self, name: str) -> Queue:
        """A handle on queue ``name``: its flow-control limits and pause switch (no I/O)."""
        if not isinstance(name, str) or not name or keyspace.JOB_ID_SEPARATOR in name:
            raise ConfigurationError(f"queue name must be a non-empty string without"
                                     f" {keyspace.JOB_ID_SEPARATOR!r}, got {name!r}")
        return Queue(self, name)

    def pause(self, queue: str) -> None:
        """Stop handing out jobs of ``queue``; it keeps accepting new ones."""
        Queue(self, queue).pause()

    def resume(self, queue: str) -> None:
        """Hand out jobs of ``queue`` again, and wake its idle workers."""
        Queue(self, queue).resume()

    def is_paused(self, queue: str) -> bool:
        return Queue(self, queue).is_paused()

    def job(self, id: str) -> Job[Any]:
        """A handle on the job with this id (no Redis call is made)."""
        return Job(self, id)

    def signal(self, job_id: str, name: str, payload: Any = None) -> bool:
        """Send signal ``name`` to job ``job_id`` (see :meth:`Job.signal`); False when the
        job has ended."""
        return Job(self, job_id).signal(name, payload)

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

    def on_expire(self, callback: Callable[[JobInfo], Any]) -> Callable[[JobInfo], Any]:
        """Call ``callback(JobInfo)`` in a worker process whenever a job expires (it was not
        started by its ``expires``, or not done by its ``deadline``)."""
        self.expire_hooks.append(callback)
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

    # -- storing jobs (see conveyor.producer) ----------------------------------------------

    def store(
        self, queue: str, spec: calls.JobSpec, jobs: Sequence[tuple[str, bytes]],
        durable: bool = False,
    ) -> list[tuple[str, bool]]:
        """Store jobs given as (short id, encoded arguments), all as ``spec`` says, in one
        round trip; (short id, created) for each. No task: no enqueue hooks run (a task's
        ``enqueue`` is the usual way).

        :param durable: also wait (``WAIT``, on the same connection) until
            :attr:`durable_replicas` replicas have the jobs
        :raises NotReplicated: durable, and fewer replicas confirmed in time
        """
        return self._sender.send(producer.encoded(self, queue, spec, jobs, durable))

    async def astore(
        self, queue: str, spec: calls.JobSpec, jobs: Sequence[tuple[str, bytes]],
        durable: bool = False,
    ) -> list[tuple[str, bool]]:
        """Async twin of :meth:`store`."""
        return await self._sender.asend(producer.encoded(self, queue, spec, jobs, durable))

    def known_queues(self) -> list[str]:
        """Every queue that has ever received a job in this namespace, sorted."""
        names = self.redis.smembers(keyspace.queues_key(self.namespace))
        return sorted({n.decode() for n in names} | set(self.queues()))
