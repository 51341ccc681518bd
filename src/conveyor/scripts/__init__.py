"""Lua scripts: one atomic operation per ``.lua`` file, loaded once, called by SHA.

A script may pull shared helpers from ``include/`` with a line ``--@include <name>``; the
loader inlines them so that Redis receives one self-contained script. An include declares
the includes it uses the same way: the loader resolves them depth first, inlines each
once, before the first text that needs it, and refuses a cycle or a missing file. Calls are built as
:class:`ScriptCall` values (what to send, see :mod:`conveyor.scripts.calls`) and executed
by :class:`ScriptRunner` or :class:`AsyncScriptRunner` (how to send it; written once,
see :mod:`._async.transport`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from importlib import resources

from . import signatures

# The transport, re-exported: what to send (.packing) and how (_async/, _sync/ generated).
from ._async.transport import AsyncScriptRunner as AsyncScriptRunner
from ._sync.transport import ScriptRunner as ScriptRunner
from .packing import FORGET_MAX as FORGET_MAX
from .packing import KEPT_REPLY_MS as KEPT_REPLY_MS
from .packing import MAX_COMMAND_ARGS as MAX_COMMAND_ARGS
from .packing import Arg as Arg
from .packing import CommandTooLong as CommandTooLong
from .packing import Confirmed as Confirmed
from .packing import ScriptCall as ScriptCall
from .packing import _Packer as _Packer
from .packing import max_items as max_items
from .packing import wire as wire

_INCLUDE = re.compile(r"^--@include (\w+)\s*$", re.MULTILINE)
# Dragonfly's flag line, the second line of every script (after the shebang): the scripts
# touch keys they derive from the prefixes in KEYS (a job's record, a tenant's list), which
# Dragonfly refuses unless told. Dragonfly reads it only as a script's first line: see
# dragonfly_source. To Redis and Valkey it is a comment.
DRAGONFLY_FLAGS = "--!df flags=allow-undeclared-keys"
SCRIPT_NAMES = (
    "enqueue",
    "fetch",
    "finish",
    "heartbeat",
    "release",
    "cancel",
    "requeue_dead",
    "purge_dead",
    "progress",
    "step",
    "workflow_enqueue",
    "workflow_release",
    "workflow_settle",
    "set_limits",
    "register_waiter",
    "wait",
    "signal",
    "resume",
    "shard_allot",
)


@cache
def source(name: str) -> str:
    """The full text of script ``name`` with its includes inlined.

    :raises FileNotFoundError: no such script or include
    :raises ValueError: no ``#!lua`` shebang, or includes that include each other
    """
    root = resources.files(__package__)

    def read(path: str) -> str:
        file = root.joinpath(*path.split("/"))
        if not file.is_file():
            raise FileNotFoundError(f"no Lua file {path!r} in {__package__}")
        return file.read_text(encoding="utf-8")

    return keep_reply(with_bindings(name, assemble(name, read)))


def dragonfly_source(name: str) -> str:
    """Script ``name`` as Dragonfly takes it: :data:`DRAGONFLY_FLAGS` as its first line,
    where alone Dragonfly reads it, and no ``#!lua`` shebang, which Redis and Valkey read
    only as a first line and Dragonfly does not take off before compiling. One text cannot
    serve both; :func:`source` is the one sent today (see docs/engines.md)."""
    _, _, body = source(name).partition("\n")
    return DRAGONFLY_FLAGS + "\n" + body.replace(DRAGONFLY_FLAGS + "\n", "", 1)


def bindings(name: str) -> str:
    """The Lua that binds script ``name``'s arguments to names, made from
    :mod:`.signatures`: ``K.<key>`` for each KEYS entry, ``A.<arg>`` for each fixed ARGV
    entry and, for a script whose call carries items, ``ITEM``: where the items start in
    ARGV (``first``), how many fields each has (``fields``) and each field's offset in an
    item (from 0). The only place a script's positions are written."""
    keys = ", ".join(f"{key} = KEYS[{i}]" for i, key in enumerate(signatures.KEYS[name], 1))
    fixed = signatures.ARGV[name]._fields  # type: ignore[attr-defined]
    args = ", ".join(f"{arg} = ARGV[{i}]" for i, arg in enumerate(fixed, 1))
    lines = ["-- Bindings made by the loader from conveyor.scripts.signatures (item i from 0,",
             "-- its field f: ARGV[ITEM.first + i * ITEM.fields + ITEM.f]).",
             f"local K = {{ {keys} }}", f"local A = {{ {args} }}"]
    item = signatures.ITEMS.get(name)
    if item is not None:
        fields = item._fields  # type: ignore[attr-defined]
        offsets = ", ".join(f"{field} = {i}" for i, field in enumerate(fields))
        lines.append(f"local ITEM = {{ first = {len(fixed) + 1}, fields = {len(fields)},"
                     f" {offsets} }}")
    return "\n".join(lines) + "\n"


def with_bindings(name: str, text: str) -> str:
    """``text`` (script ``name`` assembled) with its :func:`bindings` right after the
    shebang: inside the body :func:`keep_reply` wraps, so after the transport's own
    entries were taken off KEYS and ARGV."""
    shebang, _, body = text.partition("\n")
    return f"{shebang}\n{bindings(name)}{body}"


_KEPT_HEAD = """\
-- The transport's part (conveyor.scripts.keep_reply): KEYS[#KEYS] is the prefix of kept
-- replies; ARGV ends with (ids of replies the caller has read, ttl_ms, request id).
local kept_prefix_ = table.remove(KEYS)
local request_ = table.remove(ARGV)
local kept_ttl_ = tonumber(table.remove(ARGV))
local forget_ = table.remove(ARGV)
if request_ ~= '' then
  local kept = redis.pcall('GET', kept_prefix_ .. request_)
  if type(kept) == 'string' then
    -- A write, so that a WAIT behind this call on a new connection waits for the
    -- replication of the first one (a client's WAIT covers its own writes).
    redis.call('PEXPIRE', kept_prefix_ .. request_, kept_ttl_)
    return cmsgpack.unpack(kept)[1]
  end
end
local function body_()
"""
_KEPT_TAIL = """
end
local reply_ = body_()
if type(reply_) == 'table' and reply_.err then return reply_ end  -- refused: nothing written
for done in string.gmatch(forget_, '%S+') do
  if done ~= request_ then redis.call('DEL', kept_prefix_ .. done) end
end
if request_ ~= '' and kept_ttl_ and kept_ttl_ > 0 then
  redis.call('SET', kept_prefix_ .. request_, cmsgpack.pack({reply_}), 'PX', kept_ttl_)
end
return reply_
"""


def keep_reply(text: str) -> str:
    """``text`` (an assembled script) run as a function whose reply is kept under the
    call's request id (see :data:`KEPT_REPLY_MS`). An error reply (a refusal before the
    first write) is not kept: sent again, the call is checked again."""
    shebang, _, body = text.partition("\n")
    return f"{shebang}\n{_KEPT_HEAD}{body}{_KEPT_TAIL}"


def assemble(name: str, read: Callable[[str], str]) -> str:
    """Script ``name`` (read as ``read("<name>.lua")``) with every include inlined: each
    ``--@include <inc>`` line becomes the text of ``include/<inc>.lua``, itself assembled
    first, unless that include is already in (then the line goes).

    :raises FileNotFoundError: ``read`` found no such file
    :raises ValueError: no ``#!lua`` shebang, or an include cycle (named in the message)
    """
    text = read(f"{name}.lua")
    if not text.startswith("#!lua"):
        raise ValueError(f"script {name}.lua must start with a '#!lua' shebang")
    done: set[str] = set()

    def resolve(body: str, chain: tuple[str, ...]) -> str:
        def inline(match: re.Match[str]) -> str:
            include = match.group(1)
            if include in chain:
                cycle = " -> ".join((f"{name}.lua", *chain, include))
                raise ValueError(f"include cycle in {name}.lua: {cycle}")
            if include in done:
                return ""
            try:
                inner = read(f"include/{include}.lua")
            except FileNotFoundError as exc:
                raise FileNotFoundError(
                    f"{' -> '.join((f'{name}.lua', *chain))} includes {include!r}, which does"
                    " not exist") from exc
            inlined = resolve(inner, (*chain, include))
            done.add(include)
            return inlined

        return _INCLUDE.sub(inline, body)

    return resolve(text, ())


# Every script is read and assembled once, when this module is imported: a process keeps
# the Lua that matches the Python it loaded, also when a deploy replaces the files under a
# running process (a script read later from the new files would get the old arguments).
for _name in SCRIPT_NAMES:
    source(_name)
