"""What a running task can know and do about its own job: :func:`current_job`.

The worker sets a context variable around every run, on the event loop for an async task
and on the thread for a sync one, so ``current_job()`` works in either (and in what the
task starts with ``asyncio.to_thread`` or ``contextvars.copy_context``).

Everything a run records through its context (progress, step results) carries the fencing
token of its lease: once the lease is lost, or the job is being cancelled, Redis refuses it.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar

from . import keys as keyspace
from .encryption import open_payload, seal_result
from .errors import LeaseLost
from .scripts import calls
from .scripts.resend import aresend, resend
from .waits import DurableWaits

if TYPE_CHECKING:
    from .app import Conveyor

__all__ = ["JobContext", "current_job"]

P = ParamSpec("P")
R = TypeVar("R")
MAX_NOTE = 1000  # characters of a progress note kept

_current: ContextVar[JobContext] = ContextVar("conveyor_current_job")


def current_job() -> JobContext:
    """The job the calling task is running for.

    :raises RuntimeError: called outside a task run by a conveyor worker
    """
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError("conveyor.current_job() was called outside a running job") from None


class Lease(Protocol):
    """What the context needs of the worker's hold on the job (see ``worker.executor.Held``)."""

    queue: str
    cancel_requested: bool

    @property
    def leased(self) -> calls.Leased: ...


class ProgressSink(Protocol):
    def report(self, held: Any, fraction: float, note: str) -> None: ...


class JobContext(DurableWaits):
    """A running job, seen from inside its task. Get it with :func:`current_job`.

    Durable waits (:meth:`sleep`, :meth:`wait_for`, :meth:`child`) come from
    :class:`conveyor.waits.DurableWaits`.

    :ivar id: the public job id
    :ivar task: the task's name
    :ivar queue: the job's queue
    :ivar attempt: 1 on the first run, 2 on the first retry, ... (a snooze does not count)
    :ivar max_attempts: runs allowed in all
    """

    def __init__(self, app: Conveyor, held: Lease, progress: ProgressSink) -> None:
        self._app = app
        self._held = held
        self._progress = progress
        leased = held.leased
        self.queue = held.queue
        self.id = keyspace.job_id(held.queue, leased.short_id)
        self.task = leased.task
        self.attempt = leased.attempts
        self.max_attempts = leased.max_attempts
        self._tenant: str | None = None
        self._tenant_read = False
        self._waits_seen: set[str] = set()

    def __repr__(self) -> str:
        return f"<JobContext {self.id} {self.task} attempt {self.attempt}/{self.max_attempts}>"

    @property
    def tenant(self) -> str | None:
        """The job's tenant (``None`` for none); read from the job record once."""
        if not self._tenant_read:
            raw = self._app.redis.hget(self._keys.job(self._short_id), "tenant")
            self._tenant = raw.decode(errors="replace") if raw else None
            self._tenant_read = True
        return self._tenant

    @property
    def idempotency_key(self) -> str:
        """A key that is the same for every attempt of this job and differs between jobs:
        send it to external APIs that deduplicate requests (payment providers, mailers),
        so a run repeated after a crash cannot charge or send twice."""
        return f"conveyor:{self._app.namespace}:{self.id}"

    def parent_results(self) -> dict[str, Any]:
        """Inside a workflow node: ``{name: result}`` of its ``after`` nodes that succeeded
        (a parent that ended otherwise, for ``run_if="finished"``, is left out); ``{}`` for
        a job that is no workflow node. A blocking read: from an async task, use
        :meth:`aparent_results`."""
        from .workflow import parent_results

        return parent_results(self._app, self.id)

    async def aparent_results(self) -> dict[str, Any]:
        """Async twin of :meth:`parent_results`."""
        from .workflow import aparent_results

        return await aparent_results(self._app, self.id)

    @property
    def cancelled(self) -> bool:
        """True once someone cancelled this job while it ran; a sync task should check it
        now and then and return (whatever it returns then is not recorded)."""
        return self._held.cancel_requested

    def progress(self, fraction: float, note: str | None = None) -> None:
        """Report how far the job has got; never blocks. Reports are written to Redis at
        most every 250 ms per job (the latest wins) and show in ``JobInfo.progress`` and
        ``JobInfo.progress_note``.

        :param fraction: from 0.0 to 1.0
        :param note: a short text to show with it ("400 of 1000 sent")
        :raises ValueError: ``fraction`` is not a number from 0 to 1
        """
        value = float(fraction)
        if math.isnan(value) or not 0.0 <= value <= 1.0:
            raise ValueError(f"progress must be a number from 0 to 1, got {fraction!r}")
        self._progress.report(self._held, value, (note or "")[:MAX_NOTE])

    # -- steps -----------------------------------------------------------------------------

    def _recorded(self, name: str, raw: bytes | None) -> tuple[bool, Any]:
        if raw is None:
            return False, None
        return True, self._step_value(name, raw)

    def _step_value(self, name: str, raw: bytes) -> Any:
        """A recorded step value, opened when sealed (an encrypted task's)."""
        raw = open_payload(self._app.encryption, raw, self._held.leased.task, "step:" + name,
                           self.id)
        return self._app.codec.decode_result(raw)

    def _step_record(self, name: str, value: Any) -> bytes:
        """A step's value as recorded: encoded, and sealed when the task is encrypted."""
        encoded = self._app.codec.encode_result(value)
        task = self._app.tasks.get(self._held.leased.task)
        if task is None or not task.encrypt:
            return encoded
        return seal_result(self._app, task, self.id, encoded, "step:" + name)

    def _kept(self, name: str, code: int, value: bytes, result: Any) -> Any:
        """What a step returns once its record was attempted (see ``calls.step``)."""
        if code == calls.STEP_RECORDED:
            return result
        if code == calls.STEP_KEPT:
            return self._step_value(name, value)
        if code == calls.STEP_CANCELLING or self._held.cancel_requested:
            self._held.cancel_requested = True
            raise LeaseLost(self.id, f"step {name!r} not recorded: the job is being cancelled")
        raise LeaseLost(self.id, f"step {name!r} not recorded: this run lost its lease")

    def _check_name(self, name: str) -> str:
        if not isinstance(name, str) or not name or len(name.encode()) > 200:
            raise ValueError(f"a step name must be a non-empty str of at most 200 bytes: {name!r}")
        return "step:" + name

    def step(self, name: str, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``fn(*args, **kwargs)`` once per job: its (encodable) result is recorded on
        the job, and a later attempt gets it back without calling ``fn`` again.

        For sync tasks (it blocks on Redis); in async tasks use :meth:`astep`.

        :raises LeaseLost: the result could not be recorded because this run lost its
            lease or the job is being cancelled (the run should end)
        """
        field = self._check_name(name)
        raw = self._app.redis.hget(self._keys.job(self._short_id), field)
        found, value = self._recorded(name, raw)
        if found:
            return value  # type: ignore[no-any-return]
        result = fn(*args, **kwargs)
        encoded = self._step_record(name, result)
        leased = self._held.leased
        call = calls.step(self._keys, leased.short_id, leased.token, name, encoded)
        # The record is sent until it is answered while the lease may still hold (the
        # heartbeat keeps it): a step whose result was lost would run again on the retry.
        code, kept = resend(lambda: self._app.scripts.run(call), leased.visibility_ms / 1000)
        return self._kept(name, code, kept, result)  # type: ignore[no-any-return]

    async def astep(self, name: str, fn: Callable[P, Awaitable[R]], *args: P.args,
                    **kwargs: P.kwargs) -> R:
        """Async twin of :meth:`step`: ``await ctx.astep("charge", acharge, order_id)``."""
        field = self._check_name(name)
        raw = await self._app.aredis().hget(self._keys.job(self._short_id), field)
        found, value = self._recorded(name, raw)
        if found:
            return value  # type: ignore[no-any-return]
        result = await fn(*args, **kwargs)
        encoded = self._step_record(name, result)
        leased = self._held.leased
        call = calls.step(self._keys, leased.short_id, leased.token, name, encoded)
        runner = self._app.ascripts()
        code, kept = await aresend(lambda: runner.run(call), leased.visibility_ms / 1000)
        return self._kept(name, code, kept, result)  # type: ignore[no-any-return]


def enter(ctx: JobContext) -> Any:
    """Make ``ctx`` the current job; returns the token to pass to :func:`leave`."""
    return _current.set(ctx)


def leave(token: Any) -> None:
    _current.reset(token)
