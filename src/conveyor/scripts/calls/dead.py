"""Calls on a queue's dead letters: ``requeue_dead`` and ``purge_dead``."""

from __future__ import annotations

from collections.abc import Sequence

from ...keys import QueueKeys
from .. import ScriptCall
from ..signatures import PurgeDeadArgv, RequeueDeadArgv, RequeueDeadItem
from .build import _call


def requeue_dead(k: QueueKeys, short_ids: Sequence[str], limit: int = 1000) -> ScriptCall[int]:
    """Requeue the given dead jobs, or (no ids) up to ``limit`` of the oldest."""
    rest = [field for short_id in short_ids for field in RequeueDeadItem(short_id)]
    return _call("requeue_dead", k, RequeueDeadArgv(limit), rest, int)


def purge_dead(k: QueueKeys, limit: int = 1000) -> ScriptCall[int]:
    """Delete up to ``limit`` dead jobs, oldest first."""
    return _call("purge_dead", k, PurgeDeadArgv(limit), (), int)
