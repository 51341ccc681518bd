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
3. the app's :class:`~conveyor.producer.send.Sender` sends it (:mod:`.send`):
   :class:`~conveyor.producer.send.RedisSender`, or, within ``conveyor.testing.inline``,
   the inline runner, which runs each job at once in this process. Both take the same
   plans.

A workflow takes the same steps with its own plan (one ``workflow_enqueue`` call per
queue, see :mod:`conveyor.workflow.store`): the hooks are entered once for each kind of
job among its nodes. A periodic tick is stored under a claim, which every worker serving
the queue makes and only the first wins: it runs no hooks (the others' spans would each
announce a job that was never stored), and its scheduler fires it again after an error.

Whatever the next producer feature is, it is written here once and every producer has it.
"""

from __future__ import annotations

import base64
import datetime
import os
import weakref
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import keys as keyspace
from ..encryption import Encryption
from ..errors import ConfigurationError
from ..hooks import enqueueing, enqueueing_kinds, take_trace_id
from ..job import Job
from ..scripts import ScriptCall, calls, max_items
from .send import RedisSender, Sender, Sent, Stored

if TYPE_CHECKING:
    from ..app import Conveyor
    from ..sharding import Layout
    from ..task import Task
    from ..workflow import Workflow, WorkflowHandle

__all__ = ["ENQUEUE_CHUNK", "Arguments", "Plan", "RedisSender", "Sender", "Sent", "Stored",
           "aenqueue", "astore_workflow", "encoded", "enqueue", "enqueue_child", "job_spec",
           "new_short_id", "new_short_ids", "plan", "seal_args", "shard_for", "store",
           "store_workflow"]

# Jobs per script call; a bulk enqueue pipelines its chunks. As many as fit in
# MAX_COMMAND_ARGS (3,999): 7 words of EVALSHA and the transport, 26 keys and 24 fixed
# arguments leave 3,942 for jobs of 2 words each, so 1,971.
ENQUEUE_CHUNK = max_items("enqueue")

Arguments = tuple[tuple[Any, ...], dict[str, Any]]  # one job's (args, kwargs)
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
            key=_dedupe_key(task),
            visibility_ms=max(1, int(task.visibility_timeout * 1000)),
            debounce_ms=None if o.debounce is None else o.debounce * 1000,
            debounce_max_ms=None if o.debounce_max is None else o.debounce_max * 1000,
            throttle_ms=None if o.throttle is None else o.throttle * 1000,
            expires=_when(o.expires),
            deadline=_when(o.deadline),
        )
    return spec


def _encryption(task: Task[Any, Any]) -> Encryption:
    encryption = task.app.encryption
    if encryption is None:
        raise ConfigurationError(
            f"task {task.name!r} is declared encrypt=True, but the app has no encryption"
            " keys: Conveyor(..., encryption=conveyor.Encryption(keys=..., current=...))")
    return encryption


def _dedupe_key(task: Task[Any, Any]) -> str:
    """The dedupe key as stored: an encrypted task's is its keyed HMAC, never the text
    (a key is often made of the arguments)."""
    key = task.job_options.key or ""
    return _encryption(task).mac(key) if key and task.encrypt else key


def _sealed(task: Task[Any, Any], spec: calls.JobSpec, jobs: list[tuple[str, bytes]],
            queue: str) -> list[tuple[str, bytes]]:
    """An encrypted task's jobs with their arguments sealed, each bound to its job (a
    debounced job's to its key: each enqueue with the key replaces its arguments)."""
    seal, name = _encryption(task).seal, task.name
    if spec.debounce_ms is not None:
        bound = "key:" + spec.key
        return [(short_id, seal(data, bound, name, "args")) for short_id, data in jobs]
    return [(short_id, seal(data, keyspace.job_id(queue, short_id), name, "args"))
            for short_id, data in jobs]


def seal_args(task: Task[Any, Any], job_id: str, data: bytes) -> bytes:
    """``data`` (a job's encoded arguments) as stored: sealed when the task is encrypted."""
    return _encryption(task).seal(data, job_id, task.name, "args") if task.encrypt else data


def _when(value: float | datetime.datetime | None) -> str:
    """An ``expires`` or ``deadline`` option as the enqueue script takes it: '+<ms>' from
    the enqueue (seconds), '<ms>' an epoch time (a datetime), '' none."""
    if value is None:
        return ""
    if isinstance(value, datetime.datetime):
        return f"{int(value.timestamp() * 1000)}"
    return f"+{int(value * 1000)}"


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
         claim: calls.Claim | None = None, queue: str | None = None) -> Plan:
    """The plan that stores one job of ``task`` per (args, kwargs) of ``arguments`` (no
    I/O): the arguments are encoded now, so one that cannot be fails here.

    :param meta: what the enqueue hooks gave (its trace id goes onto the spec)
    :param ids: the jobs' short ids (default: new ones)
    :param claim: a periodic tick's claim
    :param queue: the shard of a sharded queue the jobs go to (default: the task's queue)
    :raises SerializationError: an argument cannot be encoded (nothing is written)
    :raises PayloadTooLarge: the encoded arguments are over the limit
    """
    app, options = task.app, task.job_options
    queue = task.queue if queue is None else queue
    spec = job_spec(task)
    trace_id = take_trace_id(meta)  # before encoding: the trace id is no payload entry
    if trace_id:
        spec = spec._replace(trace=trace_id)
    encode, name = app.codec.encode_args, task.name
    if len(arguments) == 1:  # the common case, on the hot path: no loop
        args, kwargs = arguments[0]
        jobs = [(new_short_id() if ids is None else ids[0], encode(name, args, kwargs, meta))]
    else:
        ids = new_short_ids(len(arguments)) if ids is None else ids
        jobs = [(short_id, encode(name, args, kwargs, meta))
                for short_id, (args, kwargs) in zip(ids, arguments, strict=True)]
    if task.encrypt:
        jobs = _sealed(task, spec, jobs, queue)
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


def _placed(task: Task[Any, Any], arguments: Sequence[Arguments], layout: Layout | None
            ) -> list[tuple[str, list[int]]]:
    """Where the jobs of a sharded queue go: (shard, positions in ``arguments``) for each
    shard that takes some (see :mod:`conveyor.sharding`)."""
    everything = list(range(len(arguments)))
    if layout is None or len(layout.active) == 1:
        return [(task.queue, everything)]
    layouts, options = task.app._layouts, task.job_options
    if options.tenant is not None or options.key is not None or len(arguments) == 1:
        return [(layouts.place(layout, options.tenant, options.key), everything)]
    groups: dict[str, list[int]] = {}
    for i, shard in enumerate(layouts.spread(layout, len(arguments))):
        groups.setdefault(shard, []).append(i)
    return list(groups.items())


def _spreads(task: Task[Any, Any], claim: calls.Claim | None) -> bool:
    """Whether the task's jobs may be spread over shards (a periodic tick's claim and the
    inline runner of conveyor.testing keep them on the queue itself)."""
    return claim is None and isinstance(task.app._sender, RedisSender)


def _layout(task: Task[Any, Any], claim: calls.Claim | None) -> Layout | None:
    """The layout of the task's queue, when its jobs may be spread."""
    app = task.app
    if not _spreads(task, claim):
        return None
    if _peek(app, task.queue):
        return app._layouts.peek(task.queue)
    return app._layouts.get(task.queue)


async def _alayout(task: Task[Any, Any], claim: calls.Claim | None) -> Layout | None:
    """Async twin of :func:`_layout`."""
    app = task.app
    if not _spreads(task, claim):
        return None
    if _peek(app, task.queue):
        return app._layouts.peek(task.queue)
    return await app._layouts.aget(task.queue)


def _peek(app: Conveyor, queue: str) -> bool:
    """Whether the layout last read will do: it is known, and the send registers the queue
    (so reads the layout again in its own round trip, see ``send._registration``). A layout
    never read is read before the first job is placed."""
    return app._layouts.known(queue) and queue not in app._registered_queues


def shard_for(task: Task[Any, Any]) -> str:
    """The queue (or shard of it) one job of ``task`` goes to now."""
    return _placed(task, [((), {})], _layout(task, None))[0][0]


def _plans(task: Task[Any, Any], arguments: Sequence[Arguments], meta: dict[str, str] | None,
           claim: calls.Claim | None, placed: list[tuple[str, list[int]]]
           ) -> list[tuple[list[int], Plan]]:
    """One plan per shard the jobs go to, with the positions in ``arguments`` it stores
    (every job is encoded before any is sent)."""
    if len(placed) == 1:
        return [(placed[0][1], plan(task, arguments, meta=meta, claim=claim,
                                    queue=placed[0][0]))]
    return [(positions, plan(task, [arguments[i] for i in positions], meta=meta, queue=shard))
            for shard, positions in placed]


def _in_order(count: int, sent: list[tuple[list[int], list[Job[Any]]]]) -> list[Job[Any]]:
    """The jobs of every plan sent, in the order of the arguments they were made from."""
    if len(sent) == 1:
        return sent[0][1]
    out: list[Job[Any] | None] = [None] * count
    for positions, jobs in sent:
        for i, job in zip(positions, jobs, strict=True):
            out[i] = job
    return out  # type: ignore[return-value]  # every position was filled


def enqueue(task: Task[Any, Any], arguments: Sequence[Arguments],
            claim: calls.Claim | None = None) -> list[Job[Any]]:
    """Store one job of ``task`` per (args, kwargs): hooks, plans, send."""
    app = task.app
    with _hooks(app, task, len(arguments), claim) as meta:
        placed = _placed(task, arguments, _layout(task, claim))
        return _in_order(len(arguments), [
            (positions, _jobs(p, app._sender.send(p)))
            for positions, p in _plans(task, arguments, meta, claim, placed)])


async def aenqueue(task: Task[Any, Any], arguments: Sequence[Arguments],
                   claim: calls.Claim | None = None) -> list[Job[Any]]:
    """Async twin of :func:`enqueue`."""
    app = task.app
    with _hooks(app, task, len(arguments), claim) as meta:
        placed = _placed(task, arguments, await _alayout(task, claim))
        return _in_order(len(arguments), [
            (positions, _jobs(p, await app._sender.asend(p)))
            for positions, p in _plans(task, arguments, meta, claim, placed)])


def enqueue_child(task: Task[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                  short_id: str, parent: str) -> Job[Any]:
    """Store the child job a durable wait planned (``ctx.child``) under ``short_id``, linked
    to the job ``parent`` that waits for it. Sent again as often as the parent's runs reach
    the wait: the script stores it once, and never over a record that exists."""
    app = task.app
    with _hooks(app, task, 1, None) as meta:
        p = plan(task, [(args, kwargs)], meta=meta, ids=[short_id])
        p.spec, p.single = p.spec._replace(parent=parent), False
        app._sender.send(p)
    return Job._of(app, p.queue, short_id)


def store(p: Plan) -> list[Job[Any]]:
    """Send a plan made earlier by :func:`plan` (the Django backend stores its jobs when
    the transaction commits). The hooks run now, around the send; when they give meta, the
    jobs are encoded again with it, under the same ids."""
    task = p.task
    if task is None:
        return _jobs(p, p.app._sender.send(p))
    with _hooks(p.app, task, len(p.jobs), p.claim) as meta:
        if meta is not None:
            p = plan(task, p.arguments, meta=meta, ids=[s for s, _ in p.jobs], claim=p.claim,
                     queue=p.queue)
        return _jobs(p, p.app._sender.send(p))


def _hooks(app: Conveyor, task: Task[Any, Any], count: int, claim: calls.Claim | None
           ) -> AbstractContextManager[dict[str, str] | None]:
    return _UNHOOKED if claim is not None else enqueueing(app, task, count)


def store_workflow(app: Conveyor, wf: Workflow) -> WorkflowHandle:
    """Store a workflow: hooks once for each kind of job among its nodes, its plan, one
    send of the calls of every queue; a failure after some queues were stored cancels
    those (see :func:`conveyor.workflow.store.partly_stored`)."""
    from ..workflow import WorkflowHandle
    from ..workflow.store import partly_stored
    from ..workflow.store import plan as plan_workflow

    with enqueueing_kinds(app, [node.task for node in wf.nodes]) as meta_of:
        p = plan_workflow(app, wf, meta_of)
        sent = app._sender.send_together([(queue, call) for queue, call, _ in p.calls])
        if sent.error is not None:
            raise partly_stored(app, p, sent.stored, sent.error, sent.unsure)
    return WorkflowHandle(app, p.id)


async def astore_workflow(app: Conveyor, wf: Workflow) -> WorkflowHandle:
    """Async twin of :func:`store_workflow`."""
    from ..workflow import WorkflowHandle
    from ..workflow.store import partly_stored
    from ..workflow.store import plan as plan_workflow

    with enqueueing_kinds(app, [node.task for node in wf.nodes]) as meta_of:
        p = plan_workflow(app, wf, meta_of)
        sent = await app._sender.asend_together([(queue, call) for queue, call, _ in p.calls])
        if sent.error is not None:
            raise partly_stored(app, p, sent.stored, sent.error, sent.unsure)
    return WorkflowHandle(app, p.id)
