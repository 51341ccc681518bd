"""Lua scripts: one atomic operation per ``.lua`` file, loaded once, called by SHA.

A script may pull shared helpers from ``include/`` with a line ``--@include <name>``; the
loader inlines them so that Redis receives one self-contained script. An include declares
the includes it uses the same way: the loader resolves them depth first, inlines each
once, before the first text that needs it, and refuses a cycle or a missing file. Calls are built as
:class:`ScriptCall` values (what to send, see :mod:`conveyor.scripts.calls`) and executed
by :class:`ScriptRunner` on a sync, async or pipeline client (how to send it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, Generic, TypeVar

from redis.asyncio import Redis as AsyncRedis
from redis.cluster import RedisCluster
from redis.commands.core import AsyncScript, Script

T = TypeVar("T")
Arg = str | bytes | int | float
_INCLUDE = re.compile(r"^--@include (\w+)\s*$", re.MULTILINE)
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

    return assemble(name, read)


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


def _identity(reply: Any) -> Any:
    return reply


@dataclass(frozen=True, slots=True)
class ScriptCall(Generic[T]):
    """One invocation of a script: its name, KEYS, ARGV and how to read its reply."""

    name: str
    keys: Sequence[str]
    args: Sequence[Arg]
    parse: Callable[[Any], T] = field(default=_identity)


class ScriptRunner:
    """Runs :class:`ScriptCall` values through redis-py's ``Script`` (EVALSHA, reloading
    the script when the server answers NOSCRIPT, e.g. after a restart or SCRIPT FLUSH).

    On a Redis Cluster client, ``Script`` routes EVALSHA by its first key's slot and loads
    a missing script on every primary; but a cluster pipeline refuses EVALSHA, so there
    :attr:`pipelined` is false and callers send script calls one by one.
    """

    def __init__(self, client: Any) -> None:
        self._scripts = {name: Script(client, source(name)) for name in SCRIPT_NAMES}
        #: whether :meth:`queue` may add calls to this client's pipelines
        self.pipelined = not isinstance(client, RedisCluster)

    def run(self, call: ScriptCall[T], client: Any = None) -> T:
        """Execute ``call`` on ``client`` (default: the client this runner was made with).

        On a pipeline, the reply arrives with the pipeline's results: parse it there.
        """
        reply = self._scripts[call.name](keys=call.keys, args=call.args, client=client)
        return call.parse(reply)

    def queue(self, call: ScriptCall[Any], pipeline: Any) -> None:
        """Add ``call`` to ``pipeline``; its raw reply appears in ``pipeline.execute()``."""
        self._scripts[call.name](keys=call.keys, args=call.args, client=pipeline)


class AsyncScriptRunner:
    """The asyncio twin of :class:`ScriptRunner`."""

    def __init__(self, client: AsyncRedis) -> None:
        self._scripts = {name: AsyncScript(client, source(name)) for name in SCRIPT_NAMES}

    async def run(self, call: ScriptCall[T], client: Any = None) -> T:
        reply = await self._scripts[call.name](
            keys=call.keys, args=call.args, client=client
        )
        return call.parse(reply)
