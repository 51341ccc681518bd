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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from redis.asyncio import Redis as AsyncRedis
from redis.cluster import RedisCluster
from redis.commands.core import AsyncScript, Script
from redis.exceptions import NoScriptError, ResponseError

from ..clock import TIME_COMMAND, from_reply
from . import plain

if TYPE_CHECKING:
    from ..keys import QueueKeys
    from .calls import JobSpec, Limits

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


# Scripts sent straight on a pooled connection (see ScriptRunner._send): the one a
# producer calls once per job. A worker's scripts run once per batch and keep redis-py's
# whole path.
DIRECT = frozenset({"enqueue"})


def _identity(reply: Any) -> Any:
    return reply


class _Packer:
    """Encodes script calls for the wire, keeping the encoded EVALSHA, SHA, KEYS and fixed
    arguments of recent calls: a call repeating them encodes only what it carries."""

    LIMIT = 1024  # encoded heads kept; then they are forgotten and made again

    def __init__(self) -> None:
        self._heads: dict[tuple[Any, ...], bytes] = {}

    def pack(self, call: ScriptCall[Any], sha: str) -> bytes:
        fixed = call.fixed
        head_key = (sha, call.keys, *call.args[:fixed])
        head = self._heads.get(head_key)
        if head is None:
            if len(self._heads) >= self.LIMIT:
                self._heads.clear()
            head = b"".join(_bulk(part) for part in ("EVALSHA", sha, len(call.keys),
                                                     *call.keys, *call.args[:fixed]))
            self._heads[head_key] = head
        count = 3 + len(call.keys) + len(call.args)
        return b"".join((b"*%d\r\n" % count, head, *map(_bulk, call.args[fixed:])))


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


def _evalsha(script: Any, call: ScriptCall[Any]) -> Command:
    return ("EVALSHA", script.sha, len(call.keys), *call.keys, *call.args)


def _first_trip(scripts: dict[str, Any], calls: Sequence[ScriptCall[Any]],
                before: Sequence[Command]) -> list[Command]:
    return [*before, *(_evalsha(scripts[call.name], call) for call in calls)]


def _second_trip(scripts: dict[str, Any], calls: Sequence[ScriptCall[Any]],
                 replies: Sequence[Any], skip: int) -> tuple[list[int], list[Command]]:
    """The calls to send again (indexes) and the commands that do it; none if all ran."""
    again = [i for i in range(len(calls)) if isinstance(replies[skip + i], NoScriptError)]
    names = sorted({calls[i].name for i in again})
    loads: list[Command] = [("SCRIPT", "LOAD", scripts[name].script) for name in names]
    return again, loads + [_evalsha(scripts[calls[i].name], calls[i]) for i in again]


def _merge(replies: list[Any], skip: int, again: list[int], retried: Sequence[Any]) -> None:
    """Put the second round trip's replies (after its loads) in place of the NOSCRIPT ones."""
    for i, reply in zip(again, retried[len(retried) - len(again):], strict=True):
        replies[skip + i] = reply


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _single_record(call: ScriptCall[Any]) -> str | None:
    """The record key of the one job an enqueue call stores (None for other calls). A call
    sent on a connection that broke before its reply may have run; sent again, it would
    write the job a second time, and could undo a worker's lease of it. So before it is
    sent again the record is looked for: if there, the call ran (a script is all or
    nothing) and its reply would have been 1, the jobs stored."""
    if call.name != "enqueue" or len(call.args) != call.fixed + 2:
        return None
    return f"{call.keys[0]}{_text(call.args[call.fixed])}"


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


class ScriptRunner:
    """Runs :class:`ScriptCall` values through redis-py's ``Script`` (EVALSHA, reloading
    the script when the server answers NOSCRIPT, e.g. after a restart or SCRIPT FLUSH).

    On a Redis Cluster client, ``Script`` routes EVALSHA by its first key's slot and loads
    a missing script on every primary; but a cluster pipeline refuses EVALSHA, so there
    :attr:`pipelined` is false and callers send script calls one by one.
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self._packer = _Packer()
        self._scripts = {name: Script(client, source(name)) for name in SCRIPT_NAMES}
        #: whether :meth:`queue` may add calls to this client's pipelines
        self.pipelined = not isinstance(client, RedisCluster)
        self._pool = getattr(client, "connection_pool", None) if self.pipelined else None
        self._plain = plain.PlainEnqueue()
        self._kept = plain.Kept(self._pool)

    def enqueue_one(self, k: QueueKeys, spec: JobSpec, limits: Limits, job: tuple[str, bytes],
                    call: Callable[[], ScriptCall[list[tuple[str, bool]]]]
                    ) -> list[tuple[str, bool]]:
        """Store one job in one round trip: as a plain MULTI when it :func:`~.plain.fits`
        (see :mod:`.plain`), else by the enqueue script ``call()`` makes. Until this
        process has read the server's clock, the script is sent with a ``TIME`` behind it."""
        if self._pool is None or not plain.fits(spec):
            return self.run(call())
        if not self._plain.ready():
            script_call = call()
            return script_call.parse(self._send(script_call, self._pool, timed=True))
        if self._plain.hand_off(k):  # idle workers wait: the script hands the job over
            script_call = call()
            return script_call.parse(self._send(script_call, self._pool, probe=k))
        self.enqueue_plain(k, spec, limits, *job)
        return [(job[0], True)]

    def enqueue_plain(self, k: QueueKeys, spec: JobSpec, limits: Limits, short_id: str,
                      args: bytes, now_ms: float | None = None) -> None:
        """Store one job that :func:`.plain.fits` as one MULTI (the clock read already, or
        ``now_ms`` given)."""
        packed = self._plain.pack(k, spec, limits, short_id, args, now_ms)
        plain.send(self._plain, self._kept, packed, k.job(short_id))

    def run(self, call: ScriptCall[T], client: Any = None) -> T:
        """Execute ``call`` on ``client`` (default: the client this runner was made with).

        On a pipeline, the reply arrives with the pipeline's results: parse it there.
        """
        if client is None and self._pool is not None and call.name in DIRECT:
            return call.parse(self._send(call, self._pool))
        reply = self._scripts[call.name](keys=call.keys, args=call.args, client=client)
        return call.parse(reply)

    def _send(self, call: ScriptCall[Any], pool: Any, timed: bool = False,
              probe: QueueKeys | None = None) -> Any:
        """EVALSHA straight on a pooled connection: the hot path of a single enqueue, with
        the client's own retry of connection errors and a reload on NOSCRIPT, but not its
        per-command layers. ``timed``: a ``TIME`` follows, and sets the plain path's clock.
        ``probe``: a count of that queue's live waiters goes first, and tells the plain path
        whether the next enqueue should hand over too (see :mod:`.plain`)."""
        script = self._scripts[call.name]
        conn = pool.get_connection()
        record, sent = _single_record(call), False
        try:
            def once() -> Any:
                nonlocal sent
                if sent and record is not None:  # it may have run: see _single_record
                    conn.send_command("EXISTS", record)
                    if conn.read_response():
                        return 1
                sent = True
                message = self._packer.pack(call, script.sha)
                if probe is not None:
                    conn.send_packed_command([self._plain.probe(probe), message])
                    self._plain.note_waiters(probe.waiters, _count(conn.read_response))
                    return conn.read_response()
                if not timed:
                    conn.send_packed_command([message])
                    return conn.read_response()
                conn.send_packed_command([message, TIME_COMMAND])
                try:
                    reply = conn.read_response()
                except ResponseError as exc:  # NOSCRIPT or the script's own error
                    reply = exc
                self._plain.observe(from_reply(conn.read_response()))
                if isinstance(reply, ResponseError):
                    raise reply
                return reply

            try:
                return conn.retry.call_with_retry(once, lambda _error: conn.disconnect())
            except NoScriptError:  # it did not run
                sent = False
                conn.send_command("SCRIPT", "LOAD", script.script)
                script.sha = _text(conn.read_response())
                return conn.retry.call_with_retry(once, lambda _error: conn.disconnect())
            except plain.BROKEN:
                if record is None:
                    raise
                return once()  # once more: the record check makes a second send safe
        finally:
            pool.release(conn)

    def send_all(self, calls: Sequence[ScriptCall[Any]],
                 before: Sequence[tuple[Arg, ...]] = ()) -> list[Any]:
        """Send the commands ``before``, then ``calls``, in one pipelined round trip.

        Replies come back raw and in order, errors as exception values (nothing raises).
        A call that met a server without its script (NOSCRIPT: nothing of it ran) is sent
        again once the script is loaded.
        """
        replies = self._pipeline(_first_trip(self._scripts, calls, before))
        again, commands = _second_trip(self._scripts, calls, replies, len(before))
        if again:
            _merge(replies, len(before), again, self._pipeline(commands))
        return replies

    def _pipeline(self, commands: Sequence[Command]) -> list[Any]:
        with self._client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            return list(pipe.execute(raise_on_error=False))

    def queue(self, call: ScriptCall[Any], pipeline: Any) -> None:
        """Add ``call`` to ``pipeline``; its raw reply appears in ``pipeline.execute()``."""
        self._scripts[call.name](keys=call.keys, args=call.args, client=pipeline)


class AsyncScriptRunner:
    """The asyncio twin of :class:`ScriptRunner`."""

    def __init__(self, client: AsyncRedis) -> None:
        self._client = client
        self._packer = _Packer()
        self._scripts = {name: AsyncScript(client, source(name)) for name in SCRIPT_NAMES}
        #: whether :meth:`send_all` may pipeline (a cluster's pipelines refuse scripts)
        self.pipelined = hasattr(client, "connection_pool")
        self._pool = client.connection_pool if self.pipelined else None
        self._plain = plain.PlainEnqueue()
        self._kept = plain.AsyncKept(self._pool)

    async def enqueue_one(self, k: QueueKeys, spec: JobSpec, limits: Limits,
                          job: tuple[str, bytes],
                          call: Callable[[], ScriptCall[list[tuple[str, bool]]]]
                          ) -> list[tuple[str, bool]]:
        """The async twin of :meth:`ScriptRunner.enqueue_one`."""
        if self._pool is None or not plain.fits(spec):
            return await self.run(call())
        if not self._plain.ready():
            script_call = call()
            return script_call.parse(await self._send(script_call, self._pool, timed=True))
        if self._plain.hand_off(k):
            script_call = call()
            return script_call.parse(await self._send(script_call, self._pool, probe=k))
        await self.enqueue_plain(k, spec, limits, *job)
        return [(job[0], True)]

    async def enqueue_plain(self, k: QueueKeys, spec: JobSpec, limits: Limits,
                            short_id: str, args: bytes, now_ms: float | None = None) -> None:
        """The async twin of :meth:`ScriptRunner.enqueue_plain`."""
        packed = self._plain.pack(k, spec, limits, short_id, args, now_ms)
        await plain.asend(self._plain, self._kept, packed, k.job(short_id))

    async def run(self, call: ScriptCall[T], client: Any = None) -> T:
        if client is None and self._pool is not None and call.name in DIRECT:
            return call.parse(await self._send(call, self._pool))
        reply = await self._scripts[call.name](
            keys=call.keys, args=call.args, client=client
        )
        return call.parse(reply)

    async def _send(self, call: ScriptCall[Any], pool: Any, timed: bool = False,
                    probe: QueueKeys | None = None) -> Any:
        """The async twin of :meth:`ScriptRunner._send`."""
        script = self._scripts[call.name]
        conn = await pool.get_connection()
        record, sent = _single_record(call), False
        try:
            async def once() -> Any:
                nonlocal sent
                if sent and record is not None:
                    await conn.send_command("EXISTS", record)
                    if await conn.read_response():
                        return 1
                sent = True
                message = self._packer.pack(call, script.sha)
                if probe is not None:
                    await conn.send_packed_command([self._plain.probe(probe), message])
                    self._plain.note_waiters(probe.waiters, await _acount(conn.read_response))
                    return await conn.read_response()
                if not timed:
                    await conn.send_packed_command([message])
                    return await conn.read_response()
                await conn.send_packed_command([message, TIME_COMMAND])
                try:
                    reply = await conn.read_response()
                except ResponseError as exc:
                    reply = exc
                self._plain.observe(from_reply(await conn.read_response()))
                if isinstance(reply, ResponseError):
                    raise reply
                return reply

            async def drop(_error: BaseException) -> None:
                await conn.disconnect()

            try:
                return await conn.retry.call_with_retry(once, drop)
            except NoScriptError:  # it did not run
                sent = False
                await conn.send_command("SCRIPT", "LOAD", script.script)
                script.sha = _text(await conn.read_response())
                return await conn.retry.call_with_retry(once, drop)
            except plain.BROKEN:
                if record is None:
                    raise
                return await once()
        finally:
            await pool.release(conn)

    async def send_all(self, calls: Sequence[ScriptCall[Any]],
                       before: Sequence[tuple[Arg, ...]] = ()) -> list[Any]:
        """The async twin of :meth:`ScriptRunner.send_all`."""
        replies = await self._pipeline(_first_trip(self._scripts, calls, before))
        again, commands = _second_trip(self._scripts, calls, replies, len(before))
        if again:
            _merge(replies, len(before), again, await self._pipeline(commands))
        return replies

    async def _pipeline(self, commands: Sequence[Command]) -> list[Any]:
        async with self._client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            return list(await pipe.execute(raise_on_error=False))


def _count(read: Callable[[], Any]) -> Any:
    """The reply of a count sent before a script; an error reply (a mangled key) reads as
    None, the connection still in step."""
    try:
        return read()
    except ResponseError:
        return None


async def _acount(read: Callable[[], Awaitable[Any]]) -> Any:
    """The async twin of :func:`_count`."""
    try:
        return await read()
    except ResponseError:
        return None
