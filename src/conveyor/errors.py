"""Exceptions raised by conveyor.

Every error a user may want to catch derives from :class:`ConveyorError`::

    ConveyorError
    ├── ConfigurationError (ValueError)      bad options, bad task definitions
    ├── EncodingError                        payloads that cannot be stored
    │   ├── SerializationError (TypeError)   an argument of an unsupported type
    │   └── PayloadTooLarge (ValueError)     an encoded payload over the size limit
    ├── PartialEnqueue                       a bulk enqueue stored some jobs, then failed
    ├── NotReplicated                        a durable enqueue's jobs are stored, unconfirmed
    ├── JobNotFound (LookupError)            no record for this id (never existed or expired)
    ├── JobFailed                            the job is dead: its attempts are spent
    ├── JobCancelled                         the job was cancelled
    ├── ResultTimeout (TimeoutError)         ``Job.result(timeout=...)`` ran out of time
    ├── LeaseLost                            a running job's step was refused: this run
    │                                        lost its lease or is being cancelled
    ├── WaitTimeout (TimeoutError)           ``ctx.wait_for`` got no signal in time
    ├── Snooze                               raised by a task: run me again later
    └── Fail                                 raised by a task: dead now, no retry
"""

from __future__ import annotations

from typing import Any


class ConveyorError(Exception):
    """Base class of every conveyor error."""


class ConfigurationError(ConveyorError, ValueError):
    """An option or a task definition is invalid."""


class EncodingError(ConveyorError):
    """A payload cannot be encoded or decoded."""


class SerializationError(EncodingError, TypeError):
    """A task argument or result has a type that cannot be encoded."""


class PayloadTooLarge(EncodingError, ValueError):
    """An encoded payload is larger than the configured limit."""


class PartialEnqueue(ConveyorError):
    """A bulk enqueue stored some of its jobs and then failed (Redis refused a later chunk:
    out of memory, say). ``jobs`` are the jobs that were stored — they will run — and
    ``__cause__`` is the error that stopped the rest. ``unconfirmed`` are jobs whose store
    was sent but never answered, however often it was sent again (Redis unreachable for
    good): each is stored or not, and ``job.info()`` tells (``JobNotFound`` if not); it is
    empty when Redis refused the rest. An enqueue that raises anything else stored
    nothing."""

    def __init__(self, message: str, jobs: list[Any], unconfirmed: list[Any] | None = None
                 ) -> None:
        super().__init__(message)
        self.jobs = jobs
        self.unconfirmed = unconfirmed or []


class NotReplicated(ConveyorError):
    """A durable enqueue stored its jobs on the primary, but fewer replicas than asked
    confirmed them within the timeout (``WAIT``): the jobs exist and will run, but a
    failover now could lose them. ``jobs`` are the stored jobs, ``replicas`` how many
    replicas confirmed."""

    def __init__(self, message: str, jobs: list[Any], replicas: int) -> None:
        super().__init__(message)
        self.jobs = jobs
        self.replicas = replicas


class JobNotFound(ConveyorError, LookupError):
    """No job record exists for an id (it never existed, or its retention expired)."""


class JobFailed(ConveyorError):
    """The job ended dead: every attempt failed, or it could not be run at all.

    :param job_id: the id of the dead job
    :param error: the reason recorded with the last attempt
    """

    def __init__(self, job_id: str, error: str | None) -> None:
        super().__init__(f"job {job_id} is dead: {error or 'no reason recorded'}")
        self.job_id = job_id
        self.error = error


class JobCancelled(ConveyorError):
    """The job was cancelled (before it ran, or while it ran)."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} was cancelled")
        self.job_id = job_id


class ResultTimeout(ConveyorError, TimeoutError):
    """The job did not finish within the time ``result()`` was given."""


class LeaseLost(ConveyorError):
    """Raised inside a running task when Redis refused to record one of its steps: the run
    no longer holds its job's lease (another worker took the job over) or the job is being
    cancelled. The run can record nothing more; let the exception end it."""

    def __init__(self, job_id: str, why: str) -> None:
        super().__init__(f"job {job_id}: {why}")
        self.job_id = job_id


class WaitTimeout(ConveyorError, TimeoutError):
    """Raised by :meth:`conveyor.JobContext.wait_for` when no signal of its name arrived
    within its timeout. Like the payload of a signal, the timeout is recorded: a later run
    of the task raises it again at the same wait, at once.

    :param job_id: the waiting job
    :param name: the wait's name
    """

    def __init__(self, job_id: str, name: str) -> None:
        super().__init__(f"job {job_id}: no signal {name!r} arrived in time")
        self.job_id = job_id
        self.name = name


class Snooze(ConveyorError):
    """Raise inside a task to put its job back to ``scheduled`` for ``seconds``; the
    attempt is not counted. A job snoozed more than ``Limits.snooze_cap`` times (100 by
    default) ends dead with the reason.

    :param seconds: how long to wait before the job runs again (>= 0)
    """

    def __init__(self, seconds: float) -> None:
        seconds = float(seconds)
        if not seconds >= 0:  # also refuses NaN
            raise ValueError(f"Snooze needs seconds >= 0, got {seconds!r}")
        super().__init__(f"snoozed for {seconds:g} s")
        self.seconds = seconds


class Fail(ConveyorError):
    """Raise inside a task to end its job dead at once, whatever attempts are left: a
    failure that no retry can mend (a card declined, an order that no longer exists). The
    job's error is ``reason``, and ``on_dead`` callbacks run as for any dead job.

    :param reason: why the job cannot succeed, stored as its error
    """

    def __init__(self, reason: str) -> None:
        if not isinstance(reason, str) or not reason:
            raise TypeError(f"Fail needs a reason: a non-empty string, got {reason!r}")
        super().__init__(reason)
        self.reason = reason
