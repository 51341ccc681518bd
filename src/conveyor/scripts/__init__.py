"""Lua scripts: one atomic operation per ``.lua`` file, loaded once, called by SHA.

A script may pull shared helpers from ``include/`` with a line ``--@include <name>``; the
loader inlines them so that Redis receives one self-contained script. An include declares
the includes it uses the same way: the loader resolves them depth first, inlines each
once, before the first text that needs it, and refuses a cycle or a missing file. Calls are built as
:class:`ScriptCall` values (what to send, see :mod:`conveyor.scripts.calls`) and executed
by :class:`ScriptRunner` on a sync, async or pipeline client (how to send it).
"""

from __future__ import annotations

import random
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
from . import plain, signatures

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

    return keep_reply(with_bindings(name, assemble(name, read)))


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


# Every mutating call can be sent again without applying twice. A call whose reply was
# lost (a reset, a timeout, a failover after the write) has run or not, and the client
# cannot tell; redis-py and the worker's loops send it again. So every script call carries
# a request id, and the script keeps its reply under that id for a while: sent again, it
# returns the kept reply and writes nothing. The transport owns this (the last KEYS entry
# and the last three ARGV entries); the body of each script never sees them.
KEPT_REPLY_MS = 600_000  # how long a reply is kept when its caller never confirms it
FORGET_MAX = 16  # confirmed replies one call deletes at most

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

    def pack(self, call: ScriptCall[Any], sha: str, forget: str = "") -> bytes:
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
    (see :func:`keep_reply`)."""
    return (*call.keys, call.replies), (*call.args, forget, KEPT_REPLY_MS, call.request)




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
        self._confirmed = Confirmed()

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
        keys, args = wire(call, self._confirmed.take(call.replies))
        script = self._scripts[call.name]
        if client is not None:  # a pipeline: it is sent, and its reply read, later
            return call.parse(script(keys=keys, args=args, client=client))
        try:
            reply = script(keys=keys, args=args)
        except plain.BROKEN:  # sent again, on a fresh connection: see keep_reply
            reply = script(keys=keys, args=args)
        self._confirmed.add(call)
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
        forget = self._confirmed.take(call.replies)
        try:
            def once() -> Any:
                message = self._packer.pack(call, script.sha, forget)
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

            # Sent again after a broken connection, the call returns its kept reply if it
            # ran (see keep_reply): never a second write, which could undo a worker's lease.
            try:
                reply = conn.retry.call_with_retry(once, lambda _error: conn.disconnect())
            except NoScriptError:  # it did not run
                conn.send_command("SCRIPT", "LOAD", script.script)
                script.sha = _text(conn.read_response())
                reply = conn.retry.call_with_retry(once, lambda _error: conn.disconnect())
            except plain.BROKEN:
                reply = once()  # once more, on a fresh connection
            self._confirmed.add(call)
            return reply
        finally:
            pool.release(conn)

    def send_all(self, calls: Sequence[ScriptCall[Any]],
                 before: Sequence[tuple[Arg, ...]] = (),
                 after: Sequence[tuple[Arg, ...]] = ()) -> list[Any]:
        """Send the commands ``before``, then ``calls``, then ``after`` (a ``WAIT``, say),
        in one pipelined round trip; ``after`` follows the calls again if some are sent
        again.

        Replies come back raw and in order, errors as exception values (nothing raises).
        A call that met a server without its script (NOSCRIPT: nothing of it ran) is sent
        again once the script is loaded.
        """
        replies = self._pipeline([*_first_trip(self._scripts, calls, before, self._confirmed),
                                  *after])
        again, commands = _second_trip(self._scripts, calls, replies, len(before))
        if again:
            _merge(replies, len(before), again, self._pipeline([*commands, *after]),
                   len(after))
        _confirm(self._confirmed, calls, replies[:len(replies) - len(after)], len(before))
        return replies

    def _pipeline(self, commands: Sequence[Command]) -> list[Any]:
        """Send ``commands`` in one round trip; once more if the connection broke (every
        script call in them is a request whose reply is kept, see :func:`keep_reply`)."""
        try:
            return self._pipeline_once(commands)
        except plain.BROKEN:
            return self._pipeline_once(commands)

    def _pipeline_once(self, commands: Sequence[Command]) -> list[Any]:
        with self._client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            return list(pipe.execute(raise_on_error=False))

    def queue(self, call: ScriptCall[Any], pipeline: Any) -> None:
        """Add ``call`` to ``pipeline``; its raw reply appears in ``pipeline.execute()``."""
        keys, args = wire(call)
        self._scripts[call.name](keys=keys, args=args, client=pipeline)


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
        self._confirmed = Confirmed()

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
        keys, args = wire(call, self._confirmed.take(call.replies))
        script = self._scripts[call.name]
        try:
            reply = await script(keys=keys, args=args, client=client)
        except plain.BROKEN:  # sent again, on a fresh connection: see keep_reply
            reply = await script(keys=keys, args=args, client=client)
        self._confirmed.add(call)
        return call.parse(reply)

    async def _send(self, call: ScriptCall[Any], pool: Any, timed: bool = False,
                    probe: QueueKeys | None = None) -> Any:
        """The async twin of :meth:`ScriptRunner._send`."""
        script = self._scripts[call.name]
        conn = await pool.get_connection()
        forget = self._confirmed.take(call.replies)
        try:
            async def once() -> Any:
                message = self._packer.pack(call, script.sha, forget)
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
                reply = await conn.retry.call_with_retry(once, drop)
            except NoScriptError:  # it did not run
                await conn.send_command("SCRIPT", "LOAD", script.script)
                script.sha = _text(await conn.read_response())
                reply = await conn.retry.call_with_retry(once, drop)
            except plain.BROKEN:
                reply = await once()
            self._confirmed.add(call)
            return reply
        finally:
            await pool.release(conn)

    async def send_all(self, calls: Sequence[ScriptCall[Any]],
                       before: Sequence[tuple[Arg, ...]] = (),
                       after: Sequence[tuple[Arg, ...]] = ()) -> list[Any]:
        """The async twin of :meth:`ScriptRunner.send_all`."""
        replies = await self._pipeline([*_first_trip(self._scripts, calls, before,
                                                     self._confirmed), *after])
        again, commands = _second_trip(self._scripts, calls, replies, len(before))
        if again:
            _merge(replies, len(before), again, await self._pipeline([*commands, *after]),
                   len(after))
        _confirm(self._confirmed, calls, replies[:len(replies) - len(after)], len(before))
        return replies

    async def _pipeline(self, commands: Sequence[Command]) -> list[Any]:
        """The async twin of :meth:`ScriptRunner._pipeline`."""
        try:
            return await self._pipeline_once(commands)
        except plain.BROKEN:
            return await self._pipeline_once(commands)

    async def _pipeline_once(self, commands: Sequence[Command]) -> list[Any]:
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
