"""The call that changes a queue's flow-control limits: ``set_limits``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...keys import QueueKeys
from .. import ScriptCall
from ..signatures import Arg, SetLimitsArgv, SetLimitsItem
from .build import _call, _text


def _parse_hash(reply: Any) -> dict[str, str]:
    return {_text(reply[i]): _text(reply[i + 1]) for i in range(0, len(reply), 2)}


def set_limits(
    k: QueueKeys, changes: Sequence[tuple[str, str]], clear: bool = False
) -> ScriptCall[dict[str, str]]:
    """Change flow-control limit fields given as (field, value); '' removes a field.
    ``clear`` removes every limit first. The reply is the limits hash afterwards."""
    rest: list[Arg] = []
    for name, value in changes:
        rest.extend(SetLimitsItem(name, value))
    return _call("set_limits", k, SetLimitsArgv("1" if clear else "", len(changes)), rest,
                 _parse_hash)
