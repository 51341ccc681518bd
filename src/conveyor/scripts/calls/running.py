"""Calls about a running job: ``cancel`` it, record its ``progress`` or a ``step``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...bounds import Limits
from ...keys import QueueKeys
from .. import ScriptCall
from ..signatures import Arg, CancelArgv, ProgressArgv, ProgressItem, StepArgv
from .build import _call, _now, _text


def cancel(
    k: QueueKeys, short_id: str, limits: Limits, reason: str = "", now: float | None = None
) -> ScriptCall[str]:
    """Cancel a job (a running one: ask its holder to stop); the reply is the state it
    was in."""
    return _call("cancel", k, CancelArgv(_now(now), limits.retention, short_id, reason), (),
                 _text)


CANCELLABLE = ("scheduled", "retrying", "suspended", "ready", "active")


def progress(k: QueueKeys, reports: Sequence[tuple[str, str, float, str]]) -> ScriptCall[list[int]]:
    """Record progress given as (short id, token, fraction, note); 1 written, 0 refused
    (a stale token, or a job being cancelled)."""
    rest: list[Arg] = []
    for short_id, token, fraction, note in reports:
        rest.extend(ProgressItem(short_id, token, repr(float(fraction)), note))
    return _call("progress", k, ProgressArgv(len(reports)), rest,
                 lambda r: [int(c) for c in r])


STEP_REFUSED, STEP_RECORDED, STEP_KEPT, STEP_CANCELLING = 0, 1, 2, 3


def _parse_step(reply: list[Any]) -> tuple[int, bytes]:
    value = reply[1]
    return int(reply[0]), value if isinstance(value, bytes) else str(value).encode()


def step(k: QueueKeys, short_id: str, token: str, name: str, value: bytes
         ) -> ScriptCall[tuple[int, bytes]]:
    """Record the encoded result of step ``name``: (:data:`STEP_RECORDED`, b''),
    (:data:`STEP_KEPT`, the value recorded before), or a refusal with b''."""
    return _call("step", k, StepArgv(short_id, token, name, value), (), _parse_step)
