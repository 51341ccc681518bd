"""Job handles (:class:`Job`) and what a job record says (:class:`JobInfo`)."""

from __future__ import annotations

import datetime
import enum
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic

from typing_extensions import TypeVar

from . import keys as keyspace
from . import record as record_fields
from ._async.poll import poll as apoll
from ._sync.poll import poll
from .encryption import ENCRYPTED, Unsealable, open_payload
from .errors import EncodingError, JobCancelled, JobFailed, JobNotFound
from .hints import convert_result
from .scripts import calls
from .scripts.resend import aresend, resend
from .untrusted import integer as _int
from .untrusted import number as _time
from .untrusted import text as _text

F_TASK, F_STATE = record_fields.TASK.encode(), record_fields.STATE.encode()
F_ENQUEUED = record_fields.ENQUEUED_MS.encode()
F_PRIORITY, F_MAX_ATTEMPTS = record_fields.PRIORITY.encode(), record_fields.MAX_ATTEMPTS.encode()
F_HOLDER = record_fields.HOLDER.encode()

if TYPE_CHECKING:
    from .app import Conveyor

R = TypeVar("R", default=Any)  # a bare ``Job`` is a ``Job[Any]``
PAUSES = (0.002, 0.1)  # seconds between reads while waiting for a result: first, most
SIGNAL_RESOLVE_SECONDS = 15.0  # a signal whose reply was lost is sent again this long


class JobState(str, enum.Enum):
    """Where a job is in its life. ``succeeded``, ``dead``, ``cancelled`` and ``expired``
    are final."""

    SCHEDULED = "scheduled"
    READY = "ready"
    ACTIVE = "active"
    SUCCEEDED = "succeeded"
    RETRYING = "retrying"
    DEAD = "dead"
    CANCELLED = "cancelled"
    SUSPENDED = "suspended"  # at a durable wait: no slot, no lease (``conveyor.waits``)
    EXPIRED = "expired"  # not started by its ``expires``, or not done by its ``deadline``

    @property
    def finished(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED,
                        JobState.EXPIRED)


def _fraction(value: Any) -> float | None:
    number = _time(value)
    if number is None or not 0.0 <= number <= 1.0:  # NaN fails both comparisons
        return None
    return number


def _state(raw: str | None) -> tuple[JobState, str | None]:
    """The record's state, and a note when it is no job state (the record is corrupt:
    shown as dead, since no worker will run it as it stands)."""
    try:
        return JobState(raw or "ready"), None
    except ValueError:
        return JobState.DEAD, f"corrupt record: field 'state' is not a job state: {raw!r}"


@dataclass(frozen=True, slots=True)
class JobInfo:
    """A snapshot of a job record. Times are epoch seconds from the Redis server's clock.

    ``wait_time`` is ``started_at - max(enqueued_at, run_at)`` (time spent prefetched counts
    as waiting); ``run_time`` is ``finished_at - started_at``; ``attempts`` counts runs
    started, including runs lost with a dead worker. While the job is active,
    ``started_at`` is when its worker leased it (a worker leases only for free slots, so the
    run begins then) and ``worker`` is that worker's id; once the run ends, ``started_at``
    is when the function began and ``worker`` is None.
    """

    id: str
    task: str
    queue: str
    tenant: str | None
    priority: int
    state: JobState
    attempts: int
    max_attempts: int
    enqueued_at: float | None
    run_at: float | None
    started_at: float | None
    finished_at: float | None
    wait_time: float | None
    run_time: float | None
    error: str | None
    result: Any
    progress: float | None = None  # 0-1, as the running task last reported it
    progress_note: str | None = None
    waiting_for: str | None = None  # a durable wait's: "signal 'approved' until ...", ...
    worker: str | None = None  # the id of the worker holding the job, while it is active

    @classmethod
    def from_record(
        cls, app: Conveyor, queue: str, short_id: str, record: Mapping[bytes, bytes]
    ) -> JobInfo:
        """Build from a job hash as HGETALL returns it."""
        get = record.get
        enqueued_ms = _time(get(F_ENQUEUED))
        enqueued_at = None if enqueued_ms is None else enqueued_ms / 1000
        run_at = _time(get(b"run_at")) or enqueued_at  # stored only when it differs
        started_at, finished_at = _time(get(b"started_at")), _time(get(b"finished_at"))
        state, corrupt = _state(_text(get(F_STATE)))
        wait_time = run_time = None
        if started_at is not None and enqueued_at is not None:
            wait_time = max(0.0, started_at - max(enqueued_at, run_at or enqueued_at))
        if started_at is not None and finished_at is not None and state != JobState.ACTIVE:
            run_time = max(0.0, finished_at - started_at)
        result: Any = None
        task = _text(get(F_TASK)) or ""
        if state == JobState.SUCCEEDED:
            result = _result(app, task, get(b"result"), keyspace.job_id(queue, short_id))
        return cls(
            id=keyspace.job_id(queue, short_id),
            task=task,
            queue=queue,
            tenant=_text(get(b"tenant")) or None,
            priority=_int(get(F_PRIORITY), record_fields.DEFAULT_PRIORITY),
            state=state,
            attempts=_int(get(b"attempts"), 0),
            max_attempts=_int(get(F_MAX_ATTEMPTS), record_fields.DEFAULT_MAX_ATTEMPTS),
            enqueued_at=enqueued_at,
            run_at=run_at,
            started_at=started_at,
            finished_at=finished_at,
            wait_time=wait_time,
            run_time=run_time,
            error=corrupt or _text(get(b"error")) or None,
            result=result,
            progress=_fraction(get(b"progress")),
            progress_note=_text(get(b"progress_note")) or None,
            waiting_for=_waiting_for(_text(get(b"wt"))),
            worker=(_text(get(F_HOLDER)) or None) if state == JobState.ACTIVE else None,
        )


def _utc(ms: str) -> str:
    seconds = _time(ms)
    if seconds is None:
        return ms
    return datetime.datetime.fromtimestamp(seconds / 1000, datetime.UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


def _waiting_for(wt: str | None) -> str | None:
    """What a durable wait's 'wt' field says, for people (``scripts/include/suspend.lua``)."""
    parts = (wt or "").split(" ", 3)
    if len(parts) != 4:
        return None
    kind, until, child, name = parts
    if kind == "t":
        return f"time {_utc(until)}"
    if kind == "c":
        return f"child {name} ({child})"
    if kind == "s":
        return f"signal {name!r}" + ("" if until == "-" else f" until {_utc(until)}")
    return None


def _result(app: Conveyor, task: str, raw: bytes | None, job_id: str) -> Any:
    """A stored result, opened when sealed, decoded, and converted to its task's return
    annotation when the task is registered in ``app``; :data:`~conveyor.encryption.
    ENCRYPTED` for a sealed one this process cannot open."""
    try:
        if raw:
            raw = open_payload(app.encryption, raw, task, "result", job_id)
    except Unsealable:
        return ENCRYPTED
    try:
        value = app.codec.decode_result(raw)
    except (EncodingError, RecursionError, ValueError) as exc:
        return f"<undecodable result: {type(exc).__name__}: {exc}>"
    registered = app.tasks.get(task)
    return value if registered is None else convert_result(registered.hints, value)


def _cancel_text(reason: str | None) -> str:
    who = f"cancelled by {socket.gethostname()}:{os.getpid()}"
    return f"{who}: {reason}" if reason else who


class Job(Generic[R]):
    """A handle on a stored job. Cheap to create; every method reads Redis afresh.

    ``R`` is what the task returns (``Job[int]`` for a task typed ``-> int``), so
    :meth:`result` is typed; a handle made from a bare id (:meth:`Conveyor.job`), like a
    bare ``Job`` annotation, is a ``Job[Any]``.

    :param app: the application the job belongs to
    :param id: the public job id, ``"<queue>~<short id>"``
    """

    __slots__ = ("_app", "id", "queue", "short_id")

    def __init__(self, app: Conveyor, id: str) -> None:
        self._app = app
        self.id = id
        self.queue, self.short_id = keyspace.split_job_id(id)

    @classmethod
    def _of(cls, app: Conveyor, queue: str, short_id: str) -> Job[Any]:
        """A handle from parts already known (no parsing: enqueue makes many)."""
        job = cls.__new__(cls)
        job._app, job.queue, job.short_id = app, queue, short_id
        job.id = keyspace.job_id(queue, short_id)
        return job

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Job) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    @property
    def _keys(self) -> keyspace.QueueKeys:
        return self._app.keys(self.queue)

    def _info(self, record: Mapping[bytes, bytes]) -> JobInfo:
        if not record:
            raise JobNotFound(f"no job {self.id} (it never existed, or its record expired)")
        return JobInfo.from_record(self._app, self.queue, self.short_id, record)

    def info(self) -> JobInfo:
        """The job's record now.

        :raises JobNotFound: no record (never existed, or expired after its retention)
        """
        kept = self._app._sender.record(self.queue, self.short_id)  # testing.inline's
        if kept is not None:
            return self._info(kept)
        return self._info(self._app.redis.hgetall(self._keys.job(self.short_id)))

    async def ainfo(self) -> JobInfo:
        """Async twin of :meth:`info`."""
        kept = self._app._sender.record(self.queue, self.short_id)
        if kept is not None:
            return self._info(kept)
        return self._info(await self._app.aredis().hgetall(self._keys.job(self.short_id)))

    def cancel(self, reason: str | None = None) -> bool:
        """Cancel the job; ``True`` if it was cancelled, or (running) is being cancelled.

        A scheduled or ready job never runs. A running job's worker learns of the cancel
        with its next heartbeat (within about a second): an async task is cancelled, a sync
        one sees :attr:`conveyor.JobContext.cancelled`; the job ends ``cancelled`` and
        anything that run records afterwards is refused. If its worker is dead, the job
        ends ``cancelled`` when its lease expires, without running again.

        :param reason: why, stored as the job's error after who cancelled it
        """
        call = calls.cancel(self._keys, self.short_id, self._app.limits, _cancel_text(reason))
        return self._app.scripts.run(call) in calls.CANCELLABLE

    async def acancel(self, reason: str | None = None) -> bool:
        """Async twin of :meth:`cancel`."""
        call = calls.cancel(self._keys, self.short_id, self._app.limits, _cancel_text(reason))
        return await self._app.ascripts().run(call) in calls.CANCELLABLE

    def signal(self, name: str, payload: Any = None) -> bool:
        """Send signal ``name`` to the job: the wait of that name
        (:meth:`conveyor.JobContext.wait_for`) returns ``payload``. A signal sent before the
        job waits for it is kept until it does; each is consumed once.

        A call whose reply is lost (a reset connection, a failover) is sent again for up to
        :data:`SIGNAL_RESOLVE_SECONDS`, as the same request: Redis answers a repeat from the
        reply it kept, so the signal is never kept twice.

        :returns: True, or False when the job has ended (or does not exist)
        :raises SerializationError: ``payload`` cannot be encoded
        :raises redis.exceptions.ConnectionError: Redis did not answer in that time (the
            signal may or may not be kept)
        """
        call = self._signal_call(name, payload)
        answer: int = resend(lambda: self._app.scripts.run(call), SIGNAL_RESOLVE_SECONDS)
        return answer != calls.SIGNAL_REFUSED

    async def asignal(self, name: str, payload: Any = None) -> bool:
        """Async twin of :meth:`signal`."""
        call, runner = self._signal_call(name, payload), self._app.ascripts()
        answer: int = await aresend(lambda: runner.run(call), SIGNAL_RESOLVE_SECONDS)
        return answer != calls.SIGNAL_REFUSED

    def _signal_call(self, name: str, payload: Any) -> calls.ScriptCall[int]:
        if not isinstance(name, str) or not name or len(name.encode()) > 200:
            raise ValueError(f"a signal's name must be a non-empty str of at most 200 bytes:"
                             f" {name!r}")
        return calls.signal(self._keys, self.short_id, name,
                            self._app.codec.encode_result(payload))

    def _outcome(self, info: JobInfo) -> tuple[bool, R]:
        if info.state == JobState.SUCCEEDED:
            return True, info.result
        if info.state in (JobState.DEAD, JobState.EXPIRED):  # expired: the error says so
            raise JobFailed(self.id, info.error)
        if info.state == JobState.CANCELLED:
            raise JobCancelled(self.id)
        return False, info.result

    def result(self, timeout: float | None = None) -> R:
        """Wait for the job to finish and return its result.

        :param timeout: seconds to wait at most; ``None`` waits for ever
        :raises JobFailed: the job is dead
        :raises JobCancelled: the job was cancelled
        :raises ResultTimeout: the job did not finish in time
        """
        return poll(self.info, self._outcome, f"job {self.id}", timeout, *PAUSES)

    async def aresult(self, timeout: float | None = None) -> R:
        """Async twin of :meth:`result`."""
        return await apoll(self.ainfo, self._outcome, f"job {self.id}", timeout, *PAUSES)
