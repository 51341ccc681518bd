"""Calls of durable waits: ``wait`` (a run reached one), ``signal`` (to a job), ``resume``
(children that ended, to their parents). See ``scripts/include/suspend.lua``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...keys import QueueKeys
from .. import ScriptCall
from ..signatures import Arg, ResumeArgv, ResumeItem, SignalArgv, WaitArgv
from .build import _call, _now

WAIT_REFUSED, WAIT_RECORDED, WAIT_SUSPEND, WAIT_CANCELLING = 0, 1, 2, 3
SIGNAL_REFUSED, SIGNAL_DELIVERED, SIGNAL_KEPT = 0, 1, 2


def _parse_wait(reply: list[Any]) -> tuple[int, bytes]:
    value = reply[1]
    return int(reply[0]), value if isinstance(value, bytes) else str(value).encode()


def wait(k: QueueKeys, short_id: str, token: str, kind: str, name: str, ms: float | None,
         child: str = "", now: float | None = None) -> ScriptCall[tuple[int, bytes]]:
    """A run reached wait ``name`` of ``kind`` ('time', 'signal', 'child'): (:data:`WAIT_RECORDED`,
    the recorded outcome), (:data:`WAIT_SUSPEND`, the child id it names), or a refusal.

    :param ms: the sleep's length or the wait's timeout, None for none
    :param child: for a child wait, the id planned for the child
    """
    length: Arg = "" if ms is None else repr(float(ms))
    return _call("wait", k, WaitArgv(_now(now), short_id, token, kind, name, length, child),
                 (), _parse_wait)


def signal(k: QueueKeys, short_id: str, name: str, payload: bytes) -> ScriptCall[int]:
    """Send signal ``name``: :data:`SIGNAL_DELIVERED`, :data:`SIGNAL_KEPT` (in the job's
    mailbox) or :data:`SIGNAL_REFUSED` (no such job, or it ended)."""
    return _call("signal", k, SignalArgv(short_id, name, payload), (), int)


def resume(k: QueueKeys, ends: Sequence[tuple[str, str, bytes]]) -> ScriptCall[int]:
    """Record children's ends, given as (parent's short id, child's job id, outcome), on
    their parents; the reply is how many parents became ready."""
    rest: list[Arg] = []
    for parent, child, outcome in ends:
        rest.extend(ResumeItem(parent, child, outcome))
    return _call("resume", k, ResumeArgv(len(ends)), rest, int)
