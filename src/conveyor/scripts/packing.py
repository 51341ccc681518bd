"""What a script call sends and how its reply is read, apart from any socket.

Both transports (:mod:`._async.transport`, and :mod:`._sync.transport` generated from it)
send what this module packs: a :class:`ScriptCall`'s KEYS and ARGV with the transport's
part of the kept-reply protocol (:func:`wire`), the encoded EVALSHA of the single-enqueue
hot path (:class:`_Packer`), and the plan of a pipelined ``send_all`` (its first round
trip, the second one for calls that met NOSCRIPT, and how their replies are put together).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from redis.exceptions import NoScriptError

from . import signatures

T = TypeVar("T")
Arg = str | bytes | int | float

# Every mutating call can be sent again without applying twice. A call whose reply was
# lost (a reset, a timeout, a failover after the write) has run or not, and the client
# cannot tell; redis-py and the worker's loops send it again. So every script call carries
# a request id, and the script keeps its reply under that id for a while: sent again, it
# returns the kept reply and writes nothing. The transport owns this (the last KEYS entry
# and the last three ARGV entries, see conveyor.scripts.keep_reply); the body of each
# script never sees them.
KEPT_REPLY_MS = 600_000  # how long a reply is kept when its caller never confirms it
FORGET_MAX = 16  # confirmed replies one call deletes at most

# The most words one command may carry, the command's name included: some servers refuse
# more (ElastiCache Serverless: 3,999). Every script call is checked against it where its
# KEYS and ARGV are put together (check_size), and callers that batch size their batches
# with max_items.
MAX_COMMAND_ARGS = 3999
# EVALSHA, the SHA, the key count; then the transport's kept-reply key (one) and its
# three ARGV entries (see wire).
CALL_OVERHEAD = 3 + 1 + 3


class CommandTooLong(ValueError):
    """A script call of more than :data:`MAX_COMMAND_ARGS` words: a caller that batches
    must split its batch (see :func:`max_items`)."""


def max_items(name: str) -> int:
    """How many items (jobs, outcomes, nodes ...) one call of script ``name`` may carry
    and stay within :data:`MAX_COMMAND_ARGS`."""
    fixed = len(signatures.KEYS[name]) + len(signatures.ARGV[name]._fields)  # type: ignore[attr-defined]
    fields = len(signatures.ITEMS[name]._fields)  # type: ignore[attr-defined]
    return (MAX_COMMAND_ARGS - CALL_OVERHEAD - fixed) // fields


# A worker's calls carry one item per job it holds. Finish, heartbeat and release split
# their batches at max_items; progress carries one report per running job, over the limit
# only past a concurrency of 997. Engines without the limit (Redis, Valkey) take a longer
# call: it is sent, with a warning, rather than refused.
WORKER_BATCHED = frozenset({"finish", "heartbeat", "progress", "release"})
_warned: set[str] = set()


def check_size(call: ScriptCall[Any]) -> None:
    """:raises CommandTooLong: ``call`` would be sent as more than
    :data:`MAX_COMMAND_ARGS` words (a worker's call is sent, and warned about once)"""
    words = CALL_OVERHEAD + len(call.keys) + len(call.args)
    if words > MAX_COMMAND_ARGS and call.name in WORKER_BATCHED:
        if call.name not in _warned:
            _warned.add(call.name)
            logging.getLogger("conveyor.worker").warning(
                "script %r sent with %d arguments: engines that refuse more than %d"
                " (ElastiCache Serverless) need a lower worker concurrency", call.name,
                words, MAX_COMMAND_ARGS)
        return
    if words > MAX_COMMAND_ARGS:
        most = max_items(call.name) if call.name in signatures.ITEMS else 0
        raise CommandTooLong(
            f"script {call.name!r} called with {words:,} arguments (EVALSHA and the"
            f" transport's included), over the limit of {MAX_COMMAND_ARGS:,}: split the"
            f" batch (at most {most:,} items a call)")


# Scripts sent straight on a pooled connection (see the runners' _send): the one a producer
# calls once per job. A worker's scripts run once per batch and keep redis-py's whole path.
DIRECT = frozenset({"enqueue"})


def _identity(reply: Any) -> Any:
    return reply


def _request_id() -> str:
    """64 random bits naming one request (from the process's PRNG, seeded from the OS)."""
    return f"{random.getrandbits(64):016x}"


def _replies_prefix(key: str) -> str:
    """The kept-reply prefix in the slot of ``key`` (``{tag}...`` -> ``{tag}:reply:``)."""
    end = key.find("}")
    return f"{key[:end + 1]}:reply:" if key.startswith("{") and end > 0 else "reply:"


@dataclass(frozen=True, slots=True)
class ScriptCall(Generic[T]):
    """One invocation of a script: its name, KEYS, ARGV and how to read its reply."""

    name: str
    keys: Sequence[str]
    args: Sequence[Arg]
    parse: Callable[[Any], T] = field(default=_identity)
    #: how many leading ``args`` are the script's fixed arguments: they repeat from call to
    #: call (same task, same options), so their encoding is made once and reused
    fixed: int = 0
    #: names this request: the same value sent again returns the reply kept under it (see
    #: :data:`KEPT_REPLY_MS`); a call built anew is a new request
    request: str = field(default_factory=_request_id)

    @property
    def replies(self) -> str:
        """The prefix under which the script keeps its reply (in the call's slot)."""
        return _replies_prefix(self.keys[0]) if self.keys else "reply:"


class Confirmed:
    """Request ids whose replies a runner has read, per kept-reply prefix: the next call to
    the same slot tells the script to delete them (so kept replies cost memory only while a
    reply is in doubt; those never confirmed expire after :data:`KEPT_REPLY_MS`)."""

    def __init__(self) -> None:
        self._done: dict[str, list[str]] = {}

    def add(self, call: ScriptCall[Any]) -> None:
        done = self._done.setdefault(call.replies, [])
        if len(done) < 4 * FORGET_MAX:
            done.append(call.request)

    def take(self, prefix: str) -> str:
        done = self._done.get(prefix)
        if not done:
            return ""
        taken = []
        try:
            for _ in range(FORGET_MAX):
                taken.append(done.pop())
        except IndexError:  # another thread took the rest
            pass
        return " ".join(taken)


def wire(call: ScriptCall[Any], forget: str = "") -> tuple[tuple[str, ...], tuple[Arg, ...]]:
    """The KEYS and ARGV the script receives: the call's own, then the transport's part
    (see :func:`conveyor.scripts.keep_reply`).

    :raises CommandTooLong: more than :data:`MAX_COMMAND_ARGS` words in all
    """
    check_size(call)
    return (*call.keys, call.replies), (*call.args, forget, KEPT_REPLY_MS, call.request)


class _Packer:
    """Encodes script calls for the wire, keeping the encoded EVALSHA, SHA, KEYS and fixed
    arguments of recent calls: a call repeating them encodes only what it carries."""

    LIMIT = 1024  # encoded heads kept; then they are forgotten and made again

    def __init__(self) -> None:
        self._heads: dict[tuple[Any, ...], bytes] = {}

    def pack(self, call: ScriptCall[Any], sha: str, forget: str = "") -> bytes:
        if 4 + len(call.keys) + len(call.args) + 3 > MAX_COMMAND_ARGS:
            check_size(call)
        fixed = call.fixed
        head_key = (sha, call.keys, *call.args[:fixed])
        head = self._heads.get(head_key)
        if head is None:
            if len(self._heads) >= self.LIMIT:
                self._heads.clear()
            head = b"".join(_bulk(part) for part in (
                "EVALSHA", sha, len(call.keys) + 1, *call.keys, call.replies,
                *call.args[:fixed]))
            self._heads[head_key] = head
        count = 4 + len(call.keys) + len(call.args) + 3
        tail = (*call.args[fixed:], forget, KEPT_REPLY_MS, call.request)
        return b"".join((b"*%d\r\n" % count, head, *map(_bulk, tail)))


def _bulk(value: Arg) -> bytes:
    """One RESP bulk string, encoded as redis-py encodes arguments."""
    if isinstance(value, bytes):
        data = value
    elif isinstance(value, str):
        data = value.encode()
    elif isinstance(value, int):
        data = b"%d" % value
    else:
        data = repr(value).encode()
    return b"$%d\r\n%b\r\n" % (len(data), data)


# What send_all sends, planned once for both runners (which only send it): the commands of
# the first round trip, and of a second one for the calls that met a server without their
# script (NOSCRIPT: nothing of those calls ran): the scripts' loads, then those calls again.
Command = tuple[Arg, ...]


def _evalsha(script: Any, call: ScriptCall[Any], forget: str = "") -> Command:
    keys, args = wire(call, forget)
    return ("EVALSHA", script.sha, len(keys), *keys, *args)


def _first_trip(scripts: dict[str, Any], calls: Sequence[ScriptCall[Any]],
                before: Sequence[Command], confirmed: Confirmed) -> list[Command]:
    return [*before, *(_evalsha(scripts[call.name], call, confirmed.take(call.replies))
                       for call in calls)]


def _second_trip(scripts: dict[str, Any], calls: Sequence[ScriptCall[Any]],
                 replies: Sequence[Any], skip: int) -> tuple[list[int], list[Command]]:
    """The calls to send again (indexes) and the commands that do it; none if all ran."""
    again = [i for i in range(len(calls)) if isinstance(replies[skip + i], NoScriptError)]
    names = sorted({calls[i].name for i in again})
    loads: list[Command] = [("SCRIPT", "LOAD", scripts[name].script) for name in names]
    return again, loads + [_evalsha(scripts[calls[i].name], calls[i]) for i in again]


def _confirm(confirmed: Confirmed, calls: Sequence[ScriptCall[Any]], replies: Sequence[Any],
             skip: int) -> None:
    """Note the calls whose replies arrived (their kept replies may go)."""
    for call, reply in zip(calls, replies[skip:], strict=True):
        if not isinstance(reply, Exception):
            confirmed.add(call)


def _merge(replies: list[Any], skip: int, again: list[int], retried: Sequence[Any],
           after: int = 0) -> None:
    """Put the second round trip's replies (after its loads) in place of the NOSCRIPT ones,
    and its last ``after`` replies in place of the first trip's."""
    calls_end = len(retried) - after
    for i, reply in zip(again, retried[calls_end - len(again):calls_end], strict=True):
        replies[skip + i] = reply
    if after:
        replies[len(replies) - after:] = retried[calls_end:]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
