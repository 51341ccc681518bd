"""Calls whose outcome is unknown are sent again, unchanged, before anything new.

A script call that raised without a reply from Redis (a connection reset, a timeout, a
failover after the write) may have run: the request reached Redis and only the reply was
lost. Each :class:`~conveyor.scripts.ScriptCall` names its request, and a script keeps its
reply a while under that name, so the *same* call sent again returns the first reply
instead of applying twice, while a call built anew is a new request. So a worker loop
keeps such a call and sends it again before it builds another for the same purpose (a
queue's fetch, a queue's outcomes, ...): the reply then tells what happened the first
time, and the loop acts on it as it would have then (the jobs a fetch leased are run, an
outcome that was recorded counts as recorded, its hooks called once).

An error *reply* (out of memory, ``READONLY``, ``WRONGTYPE``, ``NOSCRIPT`` ...) means the
script did not run: a new call may take its place, with more work merged in. Not so for a
call already in doubt, whose first send may have run: it stays in doubt until a reply
comes.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import redis.exceptions

from ..scripts import ScriptCall

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


def outcome_unknown(exc: BaseException) -> bool:
    """Whether the call that raised ``exc`` may have run: anything but an error reply."""
    return not isinstance(exc, redis.exceptions.ResponseError)


@dataclass(frozen=True, slots=True)
class Doubt:
    """A call in doubt and what its caller needs to act on its reply (the jobs of a
    batch, say)."""

    call: ScriptCall[Any]
    carried: Any = None


class InDoubt(Generic[K]):
    """At most one call in doubt per key (what the calls are for: a queue, say)."""

    def __init__(self) -> None:
        self._doubts: dict[K, Doubt] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._doubts

    def __len__(self) -> int:
        return len(self._doubts)

    def __iter__(self) -> Iterator[K]:
        """The keys that have a call in doubt (a copy: sending may change them)."""
        return iter(list(self._doubts))

    def get(self, key: K) -> Doubt | None:
        """The call in doubt for ``key``, to be sent before anything new for it."""
        return self._doubts.get(key)

    async def send(self, runner: Any, key: K, call: ScriptCall[T], carried: Any = None) -> T:
        """Run ``call`` for ``key``; if it raises with its outcome unknown, keep it (with
        ``carried``) as ``key``'s call in doubt. Once it is answered, it is no longer kept.

        :raises RuntimeError: another call for ``key`` is in doubt (it goes first)
        :raises: whatever the call raised
        """
        doubt = self._doubts.get(key)
        if doubt is not None and doubt.call is not call:
            raise RuntimeError(f"a call for {key!r} is in doubt: it must be sent first")
        try:
            reply: T = await runner.run(call)
        except BaseException as exc:
            if doubt is None and outcome_unknown(exc):
                self._doubts[key] = Doubt(call, carried)
            raise
        self._doubts.pop(key, None)
        return reply
