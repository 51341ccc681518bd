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
    ├── JobCancelled                         the job was cancelled before it ran
    └── ResultTimeout (TimeoutError)         ``Job.result(timeout=...)`` ran out of time
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
    ``__cause__`` is the error that stopped the rest. An enqueue that raises anything else
    stored nothing."""

    def __init__(self, message: str, jobs: list[Any]) -> None:
        super().__init__(message)
        self.jobs = jobs


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
    """The job was cancelled before it ran."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} was cancelled")
        self.job_id = job_id


class ResultTimeout(ConveyorError, TimeoutError):
    """The job did not finish within the time ``result()`` was given."""
