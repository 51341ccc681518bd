"""Storing jobs: the one path every producer takes.

Tasks (``enqueue``, ``enqueue_many`` and their a-twins), the periodic scheduler, workflows
and the Django backend all store their jobs here, in three steps:

1. the enqueue hooks (:mod:`conveyor.hooks`) are entered once per call, around everything
   that follows, and give the meta each job carries in its payload;
2. a :class:`Plan` is built, once: the jobs (ids and encoded arguments), the spec they
   share (the task's options and the call's trace id), the enqueue script calls (chunks of
   at most :data:`ENQUEUE_CHUNK` jobs, made on first use), whether the queue must be in the
   namespace's index of queues, whether to wait for replicas, and whether the one-job path
   applies (a plain ``MULTI`` when the spec allows it, else the script);
3. the app's :class:`Sender` sends it: :class:`RedisSender`, or, within
   ``conveyor.testing.inline``, the inline runner, which runs each job at once in this
   process. Both take the same plans.

A workflow takes the same steps with its own plan (one ``workflow_enqueue`` call per
queue, see :mod:`conveyor.workflow.store`): the hooks are entered once for each kind of
job among its nodes. A periodic tick is stored under a claim, which every worker serving
the queue makes and only the first wins: it runs no hooks (the others' spans would each
announce a job that was never stored), and its scheduler fires it again after an error.

Whatever the next producer feature is, it is written here once and every producer has it.
"""

from __future__ import annotations

import asyncio
import base64
import os
import weakref
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from . import keys as keyspace
from .errors import ConfigurationError, NotReplicated, PartialEnqueue
from .hooks import enqueueing, enqueueing_kinds, take_trace_id
from .job import Job
from .scripts import ScriptCall, calls, plain
from .scripts.resend import aresend, resend

if TYPE_CHECKING:
    from .app import Conveyor
    from .task import Task
    from .workflow import Workflow, WorkflowHandle

ENQUEUE_CHUNK = 2000  # jobs per script call; a bulk enqueue pipelines its chunks
# A bulk enqueue whose connection broke sends the same requests again (each chunk's reply
# is kept, so a chunk is never stored twice) for up to this long, through a Redis restart
# or a failover, before it gives up and says which jobs it cannot confirm.
RESOLVE_SECONDS = 15.0

Arguments = tuple[tuple[Any, ...], dict[str, Any]]  # one job's (args, kwargs)
Stored = list[tuple[str, bool]]  # (short id, created) of each job, as the script replies
_UNHOOKED: AbstractContextManager[None] = nullcontext()


def new_short_id() -> str:
    """A random 96-bit job id, 16 URL-safe characters: short, so queued jobs cost little
    memory."""
    return base64.urlsafe_b64encode(os.urandom(12)).decode()


def new_short_ids(n: int) -> list[str]:
    """``n`` ids as :func:`new_short_id` makes them, from one read of the OS's randomness
    (12 bytes encode to 16 characters without padding, so each id is a slice)."""
    text = base64.urlsafe_b64encode(os.urandom(12 * n)).decode()
    return [text[i:i + 16] for i in range(0, 16 * n, 16)]


_specs: weakref.WeakKeyDictionary[Task[Any, Any], calls.JobSpec] = weakref.WeakKeyDictionary()


def job_spec(task: Task[Any, Any]) -> calls.JobSpec:
    """What every job of ``task`` (with its options) shares, made once per task object: the
    options of a task never change, ``task.options(...)`` makes a new one."""
    spec = _specs.get(task)
    if spec is None:
        o = task.job_options
        spec = _specs[task] = calls.JobSpec(
            task=task.name,
            priority=o.priority,
            tenant=o.tenant or "",
            delay_ms=None if o.delay is None else o.delay * 1000,
            at_ms=None if o.at is None else o.at * 1000,
            max_attempts=task.max_attempts,
            key=o.key or "",
            visibility_ms=max(1, int(task.visibility_timeout * 1000)),
            debounce_ms=None if o.debounce is None else o.debounce * 1000,
            debounce_max_ms=None if o.debounce_max is None else o.debounce_max * 1000,
            throttle_ms=None if o.throttle is None else o.throttle * 1000,
        )
    return spec


# Built on every enqueue, so not frozen (a frozen dataclass sets each field through
# object.__setattr__, several times dearer): treat it as a value all the same.
@dataclass(slots=True, eq=False)
class Plan:
    """What one enqueue stores, decided before anything is sent.

    :ivar app: the application the jobs belong to
    :ivar queue: the queue they go to
    :ivar spec: what every job shares: the task's options and the call's trace id
    :ivar jobs: (short id, encoded arguments) of each job
    :ivar durable: wait until replicas have the jobs (``WAIT``) before returning
    :ivar register: make sure the namespace's index of queues holds the queue (not for a
        periodic tick's claim: the scheduler that makes it serves the queue)
    :ivar single: one job, to a queue this process has registered, not durable: the
        transport's one-job path, a plain ``MULTI`` when the spec allows, else the script
    :ivar claim: a periodic tick's claim: the jobs are stored only by its first claimer
    :ivar task: the task whose enqueue hooks run around the send (None: jobs encoded by
        the caller, :meth:`Conveyor.store`)
    :ivar arguments: each job's (args, kwargs), to encode them again when hooks give meta
    """

    app: Conveyor
    queue: str
    spec: calls.JobSpec
    jobs: list[tuple[str, bytes]]
    durable: bool = False
    register: bool = True
    single: bool = False
    claim: calls.Claim | None = None
    task: Task[Any, Any] | None = None
    arguments: Sequence[Arguments] = ()
    _chunks: list[ScriptCall[Stored]] | None = field(default=None, init=False, repr=False)

    @property
    def job_ids(self) -> list[str]:
        """The public ids the jobs have once stored."""
        return [keyspace.job_id(self.queue, short_id) for short_id, _ in self.jobs]

    def chunks(self) -> list[ScriptCall[Stored]]:
        """The enqueue script calls that store the jobs, made once: a call sent again is
        the same request, so Redis answers it from its kept reply instead of storing twice
        (see :mod:`conveyor.scripts.resend`). The one-job path seldom needs them."""
        if self._chunks is None:
            k, jobs, limits = self.app.keys(self.queue), self.jobs, self.app.limits
            self._chunks = [calls.enqueue(k, self.spec, jobs[i:i + ENQUEUE_CHUNK], limits,
                                          claim=self.claim)
                            for i in range(0, len(jobs), ENQUEUE_CHUNK)]
        return self._chunks

    def first_chunk(self) -> ScriptCall[Stored]:
        return self.chunks()[0]


def plan(task: Task[Any, Any], arguments: Sequence[Arguments], *,
         meta: dict[str, str] | None = None, ids: Sequence[str] | None = None,
         claim: calls.Claim | None = None) -> Plan:
    """The plan that stores one job of ``task`` per (args, kwargs) of ``arguments`` (no
    I/O): the arguments are encoded now, so one that cannot be fails here.

    :param meta: what the enqueue hooks gave (its trace id goes onto the spec)
    :param ids: the jobs' short ids (default: new ones)
    :param claim: a periodic tick's claim
    :raises SerializationError: an argument cannot be encoded (nothing is written)
    :raises PayloadTooLarge: the encoded arguments are over the limit
    """
    app, queue, options = task.app, task.queue, task.job_options
    spec = job_spec(task)
    trace_id = take_trace_id(meta)  # before encoding: the trace id is no payload entry
    if trace_id:
        spec = spec._replace(trace=trace_id)
    if ids is None:
        ids = [new_short_id()] if len(arguments) == 1 else new_short_ids(len(arguments))
    encode, name = app.codec.encode_args, task.name
    jobs = [(short_id, encode(name, args, kwargs, meta))
            for short_id, (args, kwargs) in zip(ids, arguments, strict=True)]
    if options.key is not None and len(jobs) > 1:
        raise ConfigurationError("a dedupe key names one job: use it with enqueue, not"
                                 " enqueue_many")
    register = claim is None
    single = (len(jobs) == 1 and register and not options.durable
              and queue in app._registered_queues)
    return Plan(app, queue, spec, jobs, options.durable, register, single, claim, task,
                arguments)


def encoded(app: Conveyor, queue: str, spec: calls.JobSpec,
            jobs: Sequence[tuple[str, bytes]], durable: bool = False) -> Plan:
    """The plan of jobs the caller encoded itself (no task: no hooks run)."""
    single = len(jobs) == 1 and not durable and queue in app._registered_queues
    return Plan(app, queue, spec, list(jobs), durable, True, single)


def _jobs(p: Plan, stored: Stored) -> list[Job[Any]]:
    return [Job._of(p.app, p.queue, short_id) for short_id, _ in stored]


def enqueue(task: Task[Any, Any], arguments: Sequence[Arguments],
            claim: calls.Claim | None = None) -> list[Job[Any]]:
    """Store one job of ``task`` per (args, kwargs): hooks, plan, send."""
    app = task.app
    with _hooks(app, task, len(arguments), claim) as meta:
        p = plan(task, arguments, meta=meta, claim=claim)
        return _jobs(p, app._sender.send(p))


async def aenqueue(task: Task[Any, Any], arguments: Sequence[Arguments],
                   claim: calls.Claim | None = None) -> list[Job[Any]]:
    """Async twin of :func:`enqueue`."""
    app = task.app
    with _hooks(app, task, len(arguments), claim) as meta:
        p = plan(task, arguments, meta=meta, claim=claim)
        return _jobs(p, await app._sender.asend(p))


def store(p: Plan) -> list[Job[Any]]:
    """Send a plan made earlier by :func:`plan` (the Django backend stores its jobs when
    the transaction commits). The hooks run now, around the send; when they give meta, the
    jobs are encoded again with it, under the same ids."""
    task = p.task
    if task is None:
        return _jobs(p, p.app._sender.send(p))
    with _hooks(p.app, task, len(p.jobs), p.claim) as meta:
        if meta is not None:
            p = plan(task, p.arguments, meta=meta, ids=[s for s, _ in p.jobs], claim=p.claim)
        return _jobs(p, p.app._sender.send(p))


def _hooks(app: Conveyor, task: Task[Any, Any], count: int, claim: calls.Claim | None
           ) -> AbstractContextManager[dict[str, str] | None]:
    return _UNHOOKED if claim is not None else enqueueing(app, task, count)


def store_workflow(app: Conveyor, wf: Workflow) -> WorkflowHandle:
    """Store a workflow: hooks once for each kind of job among its nodes, its plan, one
    send of the calls of every queue; a failure after some queues were stored cancels
    those (see :func:`conveyor.workflow.store.partly_stored`)."""
    from .workflow import WorkflowHandle
    from .workflow.store import partly_stored
    from .workflow.store import plan as plan_workflow

    with enqueueing_kinds(app, [node.task for node in wf.nodes]) as meta_of:
        p = plan_workflow(app, wf, meta_of)
        sent = app._sender.send_together([(queue, call) for queue, call, _ in p.calls])
        if sent.error is not None:
            raise partly_stored(app, p, sent.queues, sent.error)
    return WorkflowHandle(app, p.id)


async def astore_workflow(app: Conveyor, wf: Workflow) -> WorkflowHandle:
    """Async twin of :func:`store_workflow`."""
    from .workflow import WorkflowHandle
    from .workflow.store import partly_stored
    from .workflow.store import plan as plan_workflow

    with enqueueing_kinds(app, [node.task for node in wf.nodes]) as meta_of:
        p = plan_workflow(app, wf, meta_of)
        sent = await app._sender.asend_together([(queue, call) for queue, call, _ in p.calls])
        if sent.error is not None:
            raise partly_stored(app, p, sent.queues, sent.error)
    return WorkflowHandle(app, p.id)


class Sent(NamedTuple):
    """What :meth:`Sender.send_together` stored: the queues whose call succeeded, and the
    error of the first that failed (None when none did)."""

    queues: list[str]
    error: BaseException | None


class Sender(Protocol):
    """Where plans go: Redis (:class:`RedisSender`), or the inline runner of
    ``conveyor.testing``."""

    def send(self, plan: Plan) -> Stored:
        """Store the plan's jobs; (short id, created) for each.

        :raises PartialEnqueue: some of the jobs were stored (or may have been) before the
            rest failed
        :raises NotReplicated: durable, and fewer replicas confirmed in time
        """

    async def asend(self, plan: Plan) -> Stored:
        """Async twin of :meth:`send`."""

    def send_together(self, queued: Sequence[tuple[str, ScriptCall[Any]]]) -> Sent:
        """Register every queue, then send each queue's call (a workflow's nodes)."""

    async def asend_together(self, queued: Sequence[tuple[str, ScriptCall[Any]]]) -> Sent:
        """Async twin of :meth:`send_together`."""


class RedisSender:
    """Sends plans to the app's Redis: one round trip for a single job; for many, every
    chunk in one pipeline with the queue's registration (one call per chunk on a Cluster,
    whose pipelines refuse scripts), each sent again until answered (see
    :data:`RESOLVE_SECONDS`)."""

    def __init__(self, app: Conveyor) -> None:
        self.app = app

    def send(self, plan: Plan) -> Stored:
        app = self.app
        if plan.single:
            return app.scripts.enqueue_one(app.keys(plan.queue), plan.spec, app.limits,
                                           plan.jobs[0], plan.first_chunk)
        if not plan.register:  # a claim: its scheduler fires again after an error
            return app.scripts.run(plan.first_chunk())
        if not app.scripts.pipelined:  # a cluster: its pipelines refuse script calls
            if plan.durable:
                raise ConfigurationError("durable enqueue is not available on a Redis"
                                         " Cluster (WAIT must follow the writes on their"
                                         " connection)")
            return self._send_apart(plan)
        return self._send_pipelined(plan)

    def _send_pipelined(self, plan: Plan) -> Stored:
        """Register the queue and store every chunk (then ``WAIT``, when durable) in one
        round trip; the same requests again until answered: each chunk is stored once."""
        app, queue, chunks = self.app, plan.queue, plan.chunks()
        wait = [("WAIT", app.durable_replicas, max(1, int(app.durable_timeout * 1000)))]
        try:
            replies = resend(lambda: app.scripts.send_all(
                chunks, before=[_registration(app, queue)],
                after=wait if plan.durable else ()), RESOLVE_SECONDS)
        except plain.BROKEN as exc:
            raise _unconfirmed(app, queue, [], chunks, exc) from exc
        acked: Any = replies.pop() if plan.durable else 0
        stored = _stored(app, queue, chunks, replies)
        app._registered_queues.add(queue)
        if plan.durable and (isinstance(acked, Exception) or int(acked) < app.durable_replicas):
            confirmed = 0 if isinstance(acked, Exception) else int(acked)
            raise NotReplicated(
                f"{len(stored)} job(s) of queue {queue!r} are stored on the primary, but"
                f" {confirmed} of {app.durable_replicas} replica(s) confirmed them within"
                f" {app.durable_timeout} s", [Job._of(app, queue, s) for s, _ in stored],
                confirmed)
        return stored

    def _send_apart(self, plan: Plan) -> Stored:
        """:meth:`send` without a pipeline: register the queue once, then one script call
        per chunk (each in the queue's slot, so each reaches the node that owns it)."""
        app, queue, chunks = self.app, plan.queue, plan.chunks()
        if queue not in app._registered_queues:
            app.redis.sadd(keyspace.queues_key(app.namespace), queue)
            app._registered_queues.add(queue)
        stored: Stored = []
        for i, call in enumerate(chunks):
            try:
                stored.extend(resend(partial(app.scripts.run, call), RESOLVE_SECONDS))
            except plain.BROKEN as exc:
                raise _unconfirmed(app, queue, stored, chunks[i:], exc) from exc
            except Exception as exc:
                raise _partial(app, queue, stored, exc) from exc
        return stored

    async def asend(self, plan: Plan) -> Stored:
        app = self.app
        if plan.durable:  # the writes and their WAIT share one connection: the sync pipeline's
            return await asyncio.to_thread(self.send, plan)
        runner = app.ascripts()
        if plan.single:
            return await runner.enqueue_one(app.keys(plan.queue), plan.spec, app.limits,
                                            plan.jobs[0], plan.first_chunk)
        if not plan.register:  # a claim: its scheduler fires again after an error
            return await runner.run(plan.first_chunk())
        if runner.pipelined:
            return await self._asend_pipelined(plan)
        return await self._asend_apart(plan)

    async def _asend_pipelined(self, plan: Plan) -> Stored:
        """Async twin of :meth:`_send_pipelined` (never durable: see :meth:`asend`)."""
        app, queue, chunks = self.app, plan.queue, plan.chunks()
        runner = app.ascripts()
        try:
            replies = await aresend(lambda: runner.send_all(
                chunks, [_registration(app, queue)]), RESOLVE_SECONDS)
        except plain.BROKEN as exc:
            raise _unconfirmed(app, queue, [], chunks, exc) from exc
        stored = _stored(app, queue, chunks, replies)
        app._registered_queues.add(queue)
        return stored

    async def _asend_apart(self, plan: Plan) -> Stored:
        """Async twin of :meth:`_send_apart`."""
        app, queue, chunks = self.app, plan.queue, plan.chunks()
        runner = app.ascripts()
        if queue not in app._registered_queues:
            await app.aredis().sadd(keyspace.queues_key(app.namespace), queue)
            app._registered_queues.add(queue)
        stored: Stored = []
        for i, call in enumerate(chunks):
            try:
                stored.extend(await aresend(partial(runner.run, call), RESOLVE_SECONDS))
            except plain.BROKEN as exc:
                raise _unconfirmed(app, queue, stored, chunks[i:], exc) from exc
            except Exception as exc:
                raise _partial(app, queue, stored, exc) from exc
        return stored

    def send_together(self, queued: Sequence[tuple[str, ScriptCall[Any]]]) -> Sent:
        """One pipeline on a single Redis: the registration of every queue, then each
        queue's call (they run whatever the others do: any of them may fail); one call per
        queue on a Cluster, stopping at the first that fails."""
        app, queues = self.app, [queue for queue, _ in queued]
        if app.scripts.pipelined:
            register = ("SADD", keyspace.queues_key(app.namespace), *queues)
            replies: list[Any] = app.scripts.send_all([call for _, call in queued],
                                                      before=[register])
            errors = [r for r in replies if isinstance(r, Exception)]
            stored = [queue for (queue, _), reply in zip(queued, replies[1:], strict=True)
                      if not isinstance(reply, Exception)]
            if errors:
                return Sent(stored, errors[0])
            app._registered_queues.update(queues)
            return Sent(stored, None)
        new = [queue for queue in queues if queue not in app._registered_queues]
        if new:  # the index of queues lives outside every queue's slot: once per queue
            app.redis.sadd(keyspace.queues_key(app.namespace), *new)
            app._registered_queues.update(new)
        done: list[str] = []
        for queue, call in queued:
            try:
                app.scripts.run(call)
            except Exception as exc:
                return Sent(done, exc)
            done.append(queue)
        return Sent(done, None)

    async def asend_together(self, queued: Sequence[tuple[str, ScriptCall[Any]]]) -> Sent:
        """Async twin of :meth:`send_together`: one call per queue, in order."""
        app = self.app
        await app.aredis().sadd(keyspace.queues_key(app.namespace),
                                *[queue for queue, _ in queued])
        runner = app.ascripts()
        done: list[str] = []
        for queue, call in queued:
            try:
                await runner.run(call)
            except Exception as exc:
                return Sent(done, exc)
            done.append(queue)
        return Sent(done, None)


def _registration(app: Conveyor, queue: str) -> tuple[str, str, str]:
    return ("SADD", keyspace.queues_key(app.namespace), queue)


def _stored(app: Conveyor, queue: str, chunks: list[ScriptCall[Stored]], replies: list[Any]
            ) -> Stored:
    """What a pipelined send stored: (short id, created) for each job, read from the
    replies of the queue's registration and of each chunk.

    :raises PartialEnqueue: a chunk failed (the ones before it are stored)
    """
    stored: Stored = []
    for call, reply in zip(chunks, replies[1:], strict=True):
        if isinstance(reply, Exception):
            raise _partial(app, queue, stored, reply)
        stored.extend(call.parse(reply))
    if isinstance(replies[0], Exception):
        raise _partial(app, queue, stored, replies[0])
    return stored


def _unconfirmed(app: Conveyor, queue: str, stored: Stored, chunks: list[ScriptCall[Stored]],
                 error: BaseException) -> PartialEnqueue:
    """The error of a bulk enqueue whose last replies never came, however often it was
    sent: ``stored`` are stored, the jobs of ``chunks`` may be (each chunk all or none);
    their records tell (``job.info()`` raises :class:`JobNotFound` if not)."""
    jobs = [Job._of(app, queue, short) for short, _ in stored]
    unsure = [Job._of(app, queue, str(short)) for call in chunks
              for short in call.args[call.fixed::2]]
    raised = PartialEnqueue(
        f"{len(jobs)} job(s) of queue {queue!r} are stored and {len(unsure)} may be:"
        f" Redis stopped answering ({type(error).__name__}: {error}); .jobs lists the"
        " stored ones, .unconfirmed the others (job.info() tells whether each exists)",
        jobs, unsure)
    raised.__cause__ = error
    return raised


def _partial(app: Conveyor, queue: str, stored: Stored, error: BaseException) -> BaseException:
    """The error to raise when a bulk enqueue failed after ``stored``: the original one
    when nothing was stored, else :class:`PartialEnqueue` naming what was."""
    if not stored:
        return error
    jobs = [Job._of(app, queue, short) for short, _ in stored]
    raised = PartialEnqueue(
        f"{len(jobs)} job(s) of queue {queue!r} were stored before Redis refused the"
        f" rest ({type(error).__name__}: {error}); .jobs lists the stored ones", jobs)
    raised.__cause__ = error
    return raised

