"""The calls that change a queue's flow-control limits: ``set_limits``, and
``shard_allot`` (a shard's share of a sharded queue's concurrency cap)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ...keys import QueueKeys
from .. import ScriptCall
from ..signatures import Arg, SetLimitsArgv, SetLimitsItem, ShardAllotArgv
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


class Share(NamedTuple):
    """A shard's reply to ``shard_allot``: whether the round may write here (not ``stale``),
    its share of the cap (None: no cap), its jobs running and ready now, and the newest
    round it has seen."""

    stale: bool
    share: int | None
    running: int
    ready: int
    seen: int


def _parse_share(reply: Any) -> Share:
    share = _text(reply[1])
    return Share(_text(reply[0]) == "stale", int(share) if share else None, int(reply[2]),
                 int(reply[3]), int(reply[4]))


def shard_allot(k: QueueKeys, epoch: int, share: int | str | None = "") -> ScriptCall[Share]:
    """Read (``share`` '') or write one shard's share of a sharded queue's concurrency cap
    in rebalancing round ``epoch`` (None removes the share: no cap)."""
    text = "-" if share is None else str(share)
    return _call("shard_allot", k, ShardAllotArgv(epoch, text), (), _parse_share)
