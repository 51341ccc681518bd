"""What people see of a job's arguments and result, in the dashboard, the CLI and the API.

- A sealed value (a task declared ``encrypt=True``) shows as ``[encrypted]``, whether or
  not this process holds the keys: the views never decrypt.
- A parameter a task names in ``redact=`` shows as ``[redacted]``, passed by position or
  by name (see :mod:`conveyor.redaction` for how a view learns them for a task it does
  not have registered).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..encryption import ENCRYPTED, is_sealed
from ..errors import EncodingError
from ..job import JobInfo, JobState
from ..record import ARGS
from ..redaction import REDACTED, redactions

if TYPE_CHECKING:
    from ..app import Conveyor

__all__ = ["arguments", "info", "of_record", "result_hidden"]

def arguments(app: Conveyor, task: str, raw: bytes | None
              ) -> tuple[list[Any] | str, dict[str, Any]]:
    """A job's arguments as people may see them: ``[encrypted]`` when sealed, a text
    saying why when they cannot be decoded, else decoded with redacted ones hidden."""
    raw = raw or b""
    if is_sealed(raw):
        return ENCRYPTED, {}
    try:
        args, kwargs = app.codec.decode_args(raw)
    except (EncodingError, RecursionError) as exc:
        return f"<undecodable arguments: {exc}>", {}
    hidden = redactions(app, task)
    if not hidden:
        return list(args), dict(kwargs)
    at = {pos for pos in hidden.values() if pos >= 0}
    return ([REDACTED if i in at else a for i, a in enumerate(args)],
            {k: REDACTED if k in hidden else v for k, v in kwargs.items()})


def info(app: Conveyor, queue: str, short_id: str, record: Mapping[bytes, bytes]) -> JobInfo:
    """A job's record as people may see it: a sealed result shows as ``[encrypted]`` (and
    is not opened: the record is read without it)."""
    if not is_sealed(record.get(b"result")):
        return JobInfo.from_record(app, queue, short_id, record)
    unsealed = {name: value for name, value in record.items() if name != b"result"}
    found = JobInfo.from_record(app, queue, short_id, unsealed)
    if found.state == JobState.SUCCEEDED:
        return dataclasses.replace(found, result=ENCRYPTED)
    return found


def result_hidden(app: Conveyor, found: JobInfo) -> JobInfo:
    """``found`` (read by the public API, which opens sealed results where it has the key)
    with its result shown as ``[encrypted]`` when its task is declared ``encrypt=True``."""
    task = app.tasks.get(found.task)
    if found.result is not None and task is not None and task.encrypt:
        return dataclasses.replace(found, result=ENCRYPTED)
    return found


def of_record(app: Conveyor, queue: str, short_id: str, record: Mapping[bytes, bytes]
              ) -> tuple[JobInfo, list[Any] | str, dict[str, Any]]:
    """:func:`info` and :func:`arguments` of one record."""
    shown = info(app, queue, short_id, record)
    args, kwargs = arguments(app, shown.task, record.get(ARGS.encode()))
    return shown, args, kwargs
