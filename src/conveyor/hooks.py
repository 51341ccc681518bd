"""Hooks around enqueue and around each run: where tracing and test helpers plug in.

A :class:`Hook` is a small object with two no-op methods, each returning a context
manager: :meth:`Hook.enqueue` wraps the storing of jobs in the producer and may write
string entries into the jobs' ``meta`` (carried in the job's payload, next to its
arguments, so every attempt on every worker sees them); :meth:`Hook.run` wraps one
attempt of one job in the worker, the task's call inside it, so an exception the task
raises passes through the hook before the worker records it.

One meta entry is not carried: a trace id (32 hex digits) written under :data:`TRACE_ID` is
taken out of the meta and stored on the jobs' records instead, so that their finished
events, and the SQL sink's rows, carry it (``trace_id``).

Hooks are appended to :attr:`conveyor.Conveyor.hooks` (``conveyor.contrib.otel`` does
so). An app without hooks pays one truth test per enqueue and per run.

Every producer stores its jobs through :mod:`conveyor.producer`, which enters the enqueue
hooks, once per call: tasks' ``enqueue`` and ``enqueue_many`` (and their a-twins), the
Django backend, and workflows (once for each kind of job among the nodes: see
:func:`enqueueing_kinds`). Periodic ticks are the exception: every worker serving the
queue fires each tick and only the first stores it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import keys as keyspace

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from .app import Conveyor
    from .job import JobInfo
    from .task import Task

TRACE_ID = "conveyor.trace_id"  # meta entry: the call's trace id, for the records' events
_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_NOTHING: AbstractContextManager[None] = nullcontext()
_NO_META: AbstractContextManager[None] = nullcontext()


@dataclass(frozen=True, slots=True)
class Attempt:
    """One run of one job, as a :meth:`Hook.run` sees it.

    :param job_id: the public job id
    :param queue: the job's queue
    :param attempt: 1 on the first run
    :param max_attempts: runs allowed in all
    :param meta: what the enqueue hooks wrote (empty when none did)
    """

    job_id: str
    queue: str
    attempt: int
    max_attempts: int
    meta: dict[str, str] = field(default_factory=dict)


class Hook:
    """Base of hooks: override what you need; every method defaults to doing nothing."""

    def enqueue(self, task: Task[Any, Any], count: int, meta: dict[str, str]
                ) -> AbstractContextManager[None]:
        """Wrap the storing of ``count`` jobs of ``task``; entries written into ``meta``
        before the context is entered travel with each job (but :data:`TRACE_ID`'s: that
        one is stored on the jobs' records, for their finished events)."""
        return _NOTHING

    def run(self, task: Task[Any, Any], attempt: Attempt) -> AbstractContextManager[None]:
        """Wrap one attempt: the task is called inside the context."""
        return _NOTHING

    def dead(self, info: JobInfo) -> Awaitable[None] | None:
        """Hear of a job that went dead (its attempts used up, or it could not run), once,
        on the worker that recorded it, in the background of the worker's event loop; an
        awaitable returned is awaited there. The worker reads the job's record only when
        some hook overrides this method (or the app has ``on_dead`` callbacks or an alert
        webhook)."""
        return None


@contextlib.contextmanager
def _enqueue_hooks(app: Conveyor, task: Task[Any, Any], count: int
                   ) -> Iterator[dict[str, str]]:
    meta: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        for hook in app.hooks:
            stack.enter_context(hook.enqueue(task, count, meta))
        yield meta


def enqueueing(app: Conveyor, task: Task[Any, Any], count: int
               ) -> AbstractContextManager[dict[str, str] | None]:
    """The context in which jobs of ``task`` are stored; it gives the meta to encode with
    them (``None`` when the app has no hooks: the payload stays as it was)."""
    if not app.hooks:
        return _NO_META
    return _enqueue_hooks(app, task, count)


@contextlib.contextmanager
def _kinds_hooks(app: Conveyor, tasks: Sequence[Task[Any, Any]]
                 ) -> Iterator[Callable[[Task[Any, Any]], dict[str, str] | None]]:
    kinds: dict[tuple[str, str, Any], tuple[Task[Any, Any], int]] = {}
    for task in tasks:
        kind = (task.name, task.queue, task.job_options)
        first, count = kinds.get(kind, (task, 0))
        kinds[kind] = (first, count + 1)
    metas: dict[tuple[str, str, Any], dict[str, str]] = {}
    with contextlib.ExitStack() as stack:
        for kind, (task, count) in kinds.items():
            metas[kind] = stack.enter_context(_enqueue_hooks(app, task, count))
            take_trace_id(metas[kind])  # a workflow's records keep no trace id
        yield lambda task: metas[(task.name, task.queue, task.job_options)]


def _no_kinds_meta(task: Task[Any, Any]) -> None:
    return None


def enqueueing_kinds(app: Conveyor, tasks: Sequence[Task[Any, Any]]
                     ) -> AbstractContextManager[Callable[[Task[Any, Any]], dict[str, str] | None]]:
    """The context in which the jobs of several tasks are stored at once (a workflow's
    nodes): the hooks are entered once for each kind of job among them (the same task
    name, queue and options), one inside the other, with that kind's count; it gives the
    meta of each task's jobs (``None`` when the app has no hooks). A trace id written
    under :data:`TRACE_ID` is dropped: a workflow's records have no field for it."""
    if not app.hooks:
        return nullcontext(_no_kinds_meta)
    return _kinds_hooks(app, tasks)


def take_trace_id(meta: dict[str, str] | None) -> str:
    """Remove the :data:`TRACE_ID` entry from ``meta`` and return it: the trace id as 32
    lowercase hex digits, or '' when there is none or it is not one."""
    if not meta:
        return ""
    trace_id = meta.pop(TRACE_ID, "")
    return trace_id if _TRACE_ID.fullmatch(trace_id) and trace_id != "0" * 32 else ""


@contextlib.contextmanager
def _run_hooks(app: Conveyor, task: Task[Any, Any], attempt: Attempt) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for hook in app.hooks:
            stack.enter_context(hook.run(task, attempt))
        yield


def running(app: Conveyor, task: Task[Any, Any], queue: str, short_id: str, attempts: int,
            max_attempts: int, payload: bytes) -> AbstractContextManager[None]:
    """The context in which the worker calls ``task`` for one attempt of a job."""
    if not app.hooks:
        return _NOTHING
    try:
        meta = app.codec.decode_meta(payload)
    except Exception:  # the arguments decoded, so this is odd data in a spare field
        meta = {}
    attempt = Attempt(keyspace.job_id(queue, short_id), queue, attempts, max_attempts, meta)
    return _run_hooks(app, task, attempt)
