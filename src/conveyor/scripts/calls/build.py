"""What every call builder shares: a call's KEYS from the queue's keys, its ARGV as the
script's typed tuples (:mod:`conveyor.scripts.signatures`), and the small encoders."""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import cache
from typing import Any

from ...keys import QueueKeys
from .. import ScriptCall
from ..signatures import KEYS, Arg


@cache
def _keys(name: str, k: QueueKeys) -> tuple[str, ...]:
    return tuple(getattr(k, attr) for attr in KEYS[name])


def _call(name: str, k: QueueKeys, fixed: tuple[Any, ...], rest: Sequence[Arg] = (),
          parse: Any = None) -> ScriptCall[Any]:
    """The call of script ``name``: its KEYS from ``k``, its ARGV the fields of ``fixed``
    (the script's own typed tuple, see :data:`ARGV`) followed by ``rest``."""
    keys = _keys(name, k)
    args: Sequence[Arg] = (*fixed, *rest) if rest else fixed
    if parse is None:
        return ScriptCall(name, keys, args, fixed=len(fixed))
    return ScriptCall(name, keys, args, parse, len(fixed))


def _nonce() -> str:
    """64 random bits for a fetch's tokens: from the process's PRNG (seeded from the OS,
    and again in a forked child), not a system call per fetch."""
    return f"{random.getrandbits(64):016x}"


def _now(now: float | None) -> str:
    return "" if now is None else repr(float(now))


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _opt(ms: float | None) -> str:
    return "" if ms is None else repr(float(ms))
