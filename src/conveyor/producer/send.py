"""Sending plans: the :class:`Sender` interface, and :class:`RedisSender`.

A sender takes the plans :mod:`conveyor.producer` builds and stores their jobs. The app
holds one (``app._sender``): a :class:`RedisSender`, or, within
``conveyor.testing.inline``, the inline runner, which runs each job at once in the
process. Plans say what to send; a sender only says how.

Every request that stores jobs is sent again until answered (see
:mod:`conveyor.scripts.resend`): each chunk's reply is kept under its request, so a chunk
whose reply was lost is never stored twice, and a bulk enqueue that never hears back says
which jobs it cannot confirm (:attr:`PartialEnqueue.unconfirmed`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from .. import keys as keyspace
from ..errors import ConfigurationError, NotReplicated, PartialEnqueue
from ..job import Job
from ..scripts import ScriptCall, plain
from ..scripts.resend import aresend, resend
from ..sharding import base_queue

if TYPE_CHECKING:
    from ..app import Conveyor
    from . import Plan

# A bulk enqueue whose connection broke sends the same requests again (each chunk's reply
# is kept, so a chunk is never stored twice) for up to this long, through a Redis restart
# or a failover, before it gives up and says which jobs it cannot confirm.
RESOLVE_SECONDS = 15.0
Stored = list[tuple[str, bool]]  # (short id, created) of each job, as the script replies


class Sent(NamedTuple):
    """What :meth:`Sender.send_together` stored, by the calls' places in what it was
    given (a queue may have several calls): the calls that succeeded, the error of the
    first that failed (None when none did), and the calls sent but never answered, however
    often they were sent again (stored or not)."""

    stored: list[int]
    error: BaseException | None
    unsure: list[int] = []


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
        """Register every queue, then send each call (a workflow's nodes of a queue)."""

    async def asend_together(self, queued: Sequence[tuple[str, ScriptCall[Any]]]) -> Sent:
        """Async twin of :meth:`send_together`."""

    def record(self, queue: str, short_id: str) -> dict[bytes, bytes] | None:
        """A job's record when the sender keeps records itself (the inline runner: empty
        for an unknown job); None when they are in Redis."""


class RedisSender:
    """Sends plans to the app's Redis: one round trip for a single job; for many, every
    chunk in one pipeline with the queue's registration (one call per chunk on a Cluster,
    whose pipelines refuse scripts), each sent again until answered (see
    :data:`RESOLVE_SECONDS`)."""

    def __init__(self, app: Conveyor) -> None:
        self.app = app

    def record(self, queue: str, short_id: str) -> None:
        """None: job records are read from Redis."""
        return None

    def send(self, plan: Plan) -> Stored:
        app = self.app
        if plan.single:
            try:
                return app.scripts.enqueue_one(app.keys(plan.queue), plan.spec, app.limits,
                                               plan.jobs[0], plan.first_chunk)
            except plain.BROKEN as exc:
                key = app.keys(plan.queue).job(plan.jobs[0][0])
                try:
                    found = resend(partial(app.redis.exists, key), RESOLVE_SECONDS)
                except plain.BROKEN:
                    raise _unconfirmed(app, plan.queue, [], [plan.first_chunk()], exc) from exc
                return _single_found(plan, found, exc)
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
        before = _registration(app, queue)
        try:
            replies = resend(lambda: app.scripts.send_all(
                chunks, before=before, after=wait if plan.durable else ()), RESOLVE_SECONDS)
        except plain.BROKEN as exc:
            raise _unconfirmed(app, queue, [], chunks, exc) from exc
        acked: Any = replies.pop() if plan.durable else 0
        stored = _stored(app, queue, chunks, _learnt(app, queue, before, replies))
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
            try:
                return await runner.enqueue_one(app.keys(plan.queue), plan.spec, app.limits,
                                                plan.jobs[0], plan.first_chunk)
            except plain.BROKEN as exc:
                key = app.keys(plan.queue).job(plan.jobs[0][0])
                try:
                    found = await aresend(partial(app.aredis().exists, key), RESOLVE_SECONDS)
                except plain.BROKEN:
                    raise _unconfirmed(app, plan.queue, [], [plan.first_chunk()], exc) from exc
                return _single_found(plan, found, exc)
        if not plan.register:  # a claim: its scheduler fires again after an error
            return await runner.run(plan.first_chunk())
        if runner.pipelined:
            return await self._asend_pipelined(plan)
        return await self._asend_apart(plan)

    async def _asend_pipelined(self, plan: Plan) -> Stored:
        """Async twin of :meth:`_send_pipelined` (never durable: see :meth:`asend`)."""
        app, queue, chunks = self.app, plan.queue, plan.chunks()
        runner = app.ascripts()
        before = _registration(app, queue)
        try:
            replies = await aresend(lambda: runner.send_all(chunks, before), RESOLVE_SECONDS)
        except plain.BROKEN as exc:
            raise _unconfirmed(app, queue, [], chunks, exc) from exc
        stored = _stored(app, queue, chunks, _learnt(app, queue, before, replies))
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
        call (they run whatever the others do: any of them may fail); one call at a time
        on a Cluster, stopping at the first that fails."""
        app, queues = self.app, [queue for queue, _ in queued]
        if app.scripts.pipelined:
            register = ("SADD", keyspace.queues_key(app.namespace), *queues)
            try:  # the same requests until answered: each queue's nodes stored once
                replies: list[Any] = resend(lambda: app.scripts.send_all(
                    [call for _, call in queued], before=[register]), RESOLVE_SECONDS)
            except plain.BROKEN as exc:
                return Sent([], exc, list(range(len(queued))))
            errors = [r for r in replies if isinstance(r, Exception)]
            stored = [i for i, reply in enumerate(replies[1:]) if not isinstance(reply, Exception)]
            if errors:
                return Sent(stored, errors[0])
            app._registered_queues.update(queues)
            return Sent(stored, None)
        new = [queue for queue in queues if queue not in app._registered_queues]
        if new:  # the index of queues lives outside every queue's slot: once per queue
            app.redis.sadd(keyspace.queues_key(app.namespace), *new)
            app._registered_queues.update(new)
        done: list[int] = []
        for i, (_, call) in enumerate(queued):
            try:
                resend(partial(app.scripts.run, call), RESOLVE_SECONDS)
            except plain.BROKEN as exc:
                return Sent(done, exc, list(range(i, len(queued))))
            except Exception as exc:
                return Sent(done, exc)
            done.append(i)
        return Sent(done, None)

    async def asend_together(self, queued: Sequence[tuple[str, ScriptCall[Any]]]) -> Sent:
        """Async twin of :meth:`send_together`: one call at a time, in order."""
        app = self.app
        await app.aredis().sadd(keyspace.queues_key(app.namespace),
                                *[queue for queue, _ in queued])
        runner = app.ascripts()
        done: list[int] = []
        for i, (_, call) in enumerate(queued):
            try:
                await aresend(partial(runner.run, call), RESOLVE_SECONDS)
            except plain.BROKEN as exc:
                return Sent(done, exc, list(range(i, len(queued))))
            except Exception as exc:
                return Sent(done, exc)
            done.append(i)
        return Sent(done, None)


def _single_found(plan: Plan, found: Any, error: BaseException) -> Stored:
    """A single enqueue whose every send broke before its reply: its record, looked up
    once Redis answers, tells whether one of them ran (the job is stored) or none did."""
    if found:
        return [(plan.jobs[0][0], True)]
    raise error


def _registration(app: Conveyor, queue: str) -> list[tuple[str, ...]]:
    """The commands a pipelined send begins with: the queue's registration in the index of
    queues, then, when due, the read of its layout (:mod:`conveyor.sharding`)."""
    commands: list[tuple[str, ...]] = [("SADD", keyspace.queues_key(app.namespace), queue)]
    base = base_queue(queue)
    if app._layouts.due(base):
        commands.append(("HGETALL", app.keys(base).shards))
    return commands


def _learnt(app: Conveyor, queue: str, before: list[tuple[str, ...]], replies: list[Any]
            ) -> list[Any]:
    """The replies of a pipelined send without the layout's, which is kept."""
    if len(before) == 1:
        return replies
    app._layouts.learn(base_queue(queue), _as_hash(replies[1]))
    return [replies[0], *replies[2:]]


def _as_hash(reply: Any) -> Any:
    """An HGETALL reply as a dict (a pipeline of raw commands may give a flat list)."""
    if isinstance(reply, list):
        return dict(zip(reply[::2], reply[1::2], strict=False))
    return reply


def _stored(app: Conveyor, queue: str, chunks: list[ScriptCall[Stored]], replies: list[Any]
            ) -> Stored:
    """What a pipelined send stored: (short id, created) for each job, read from the
    replies of the queue's registration and of each chunk.

    :raises PartialEnqueue: a chunk failed; it names the jobs of every chunk that did not
        (each chunk runs whatever the others did: under memory pressure a small last chunk
        can be stored after larger ones were refused)
    """
    stored: Stored = []
    errors = []
    for call, reply in zip(chunks, replies[1:], strict=True):
        if isinstance(reply, Exception):
            errors.append(reply)
        else:
            stored.extend(call.parse(reply))
    if isinstance(replies[0], Exception):
        errors.append(replies[0])
    if errors:
        raise _partial(app, queue, stored, errors[0])
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
        f"{len(jobs)} job(s) of queue {queue!r} were stored and Redis refused the"
        f" rest ({type(error).__name__}: {error}); .jobs lists the stored ones", jobs)
    raised.__cause__ = error
    return raised
