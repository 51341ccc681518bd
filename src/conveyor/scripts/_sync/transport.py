# Generated from ../_async/transport.py by scripts/generate_sync.py: do not edit;
# change the async source and run that script again.
"""Sending script calls and plain enqueues: the sockets' side of :mod:`..packing` and
:mod:`..plain`, which decide what to send and how to read the reply.

Written once: ``_async/transport.py`` is the source, and ``_sync/transport.py`` is
generated from it by ``scripts/generate_sync.py`` (the ``unasync`` package: ``async`` and
``await`` taken out, ``AsyncScriptRunner`` -> ``ScriptRunner``, ``AsyncKept`` -> ``Kept``);
``make lint`` fails when the generated file drifts, so a fix to reconnects, NOSCRIPT or
re-sends is made once, in the source. What differs for real between the two (how a cluster
is told apart, the sync runner's pipelines, the asyncio MULTI's one deadline) is in
``io.py`` beside each, under the same names.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError, ResponseError

from ... import scripts as loader
from ...clock import TIME_COMMAND, from_reply
from .. import plain
from ..packing import (
    DIRECT,
    Arg,
    Command,
    Confirmed,
    ScriptCall,
    T,
    _confirm,
    _first_trip,
    _merge,
    _Packer,
    _second_trip,
    _text,
    wire,
)
from .io import Pipelines, Script, exchange, pipelines_scripts, sent_later

if TYPE_CHECKING:
    from ...keys import QueueKeys
    from ..calls import JobSpec, Limits

log = plain.log


class ScriptRunner(Pipelines):
    """Runs :class:`~conveyor.scripts.ScriptCall` values through redis-py's ``Script``
    (EVALSHA, reloading the script when the server answers NOSCRIPT, e.g. after a restart
    or SCRIPT FLUSH), and stores single jobs that need no script as a plain MULTI.

    On a Redis Cluster client, ``Script`` routes EVALSHA by its first key's slot and loads
    a missing script on every primary; but a cluster pipeline refuses EVALSHA, so there
    :attr:`pipelined` is false and callers send script calls one by one.
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self._packer = _Packer()
        self._scripts = {name: Script(client, loader.source(name))
                         for name in loader.SCRIPT_NAMES}
        #: whether calls may be pipelined on this client (a cluster's pipelines refuse
        #: scripts)
        self.pipelined = pipelines_scripts(client)
        self._pool = getattr(client, "connection_pool", None) if self.pipelined else None
        self._plain = plain.PlainEnqueue()
        self._kept = Kept(self._pool)
        self._confirmed = Confirmed()

    def enqueue_one(self, k: QueueKeys, spec: JobSpec, limits: Limits,
                          job: tuple[str, bytes],
                          call: Callable[[], ScriptCall[list[tuple[str, bool]]]]
                          ) -> list[tuple[str, bool]]:
        """Store one job in one round trip: as a plain MULTI when it :func:`~..plain.fits`
        (see :mod:`..plain`), else by the enqueue script ``call()`` makes. Until this
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

    def enqueue_plain(self, k: QueueKeys, spec: JobSpec, limits: Limits,
                            short_id: str, args: bytes, now_ms: float | None = None) -> None:
        """Store one job that :func:`..plain.fits` as one MULTI (the clock read already, or
        ``now_ms`` given)."""
        packed = self._plain.pack(k, spec, limits, short_id, args, now_ms)
        send(self._plain, self._kept, packed, k.job(short_id))

    def run(self, call: ScriptCall[T], client: Any = None) -> T:
        """Execute ``call`` on ``client`` (default: the client this runner was made with).

        On a sync pipeline, the reply arrives with the pipeline's results: parse it there.
        """
        if client is None and self._pool is not None and call.name in DIRECT:
            return call.parse(self._send(call, self._pool))
        keys, args = wire(call, self._confirmed.take(call.replies))
        script = self._scripts[call.name]
        if sent_later(client):  # never on asyncio: see io.sent_later
            return call.parse(script(keys=keys, args=args, client=client))
        try:
            reply = script(keys=keys, args=args, client=client)
        except plain.BROKEN:  # sent again, on a fresh connection: see keep_reply
            reply = script(keys=keys, args=args, client=client)
        self._confirmed.add(call)
        return call.parse(reply)

    def _send(self, call: ScriptCall[Any], pool: Any, timed: bool = False,
                    probe: QueueKeys | None = None) -> Any:
        """EVALSHA straight on a pooled connection: the hot path of a single enqueue, with
        the client's own retry of connection errors and a reload on NOSCRIPT, but not its
        per-command layers. ``timed``: a ``TIME`` follows, and sets the plain path's clock.
        ``probe``: a count of that queue's live waiters goes first, and tells the plain path
        whether the next enqueue should hand over too (see :mod:`..plain`)."""
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

            def drop(_error: BaseException) -> None:
                conn.disconnect()

            # Sent again after a broken connection, the call returns its kept reply if it
            # ran (see keep_reply): never a second write, which could undo a worker's lease.
            try:
                reply = conn.retry.call_with_retry(once, drop)
            except NoScriptError:  # it did not run
                conn.send_command("SCRIPT", "LOAD", script.script)
                script.sha = _text(conn.read_response())
                reply = conn.retry.call_with_retry(once, drop)
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
        replies = self._pipeline([*_first_trip(self._scripts, calls, before,
                                                     self._confirmed), *after])
        again, commands = _second_trip(self._scripts, calls, replies, len(before))
        if again:
            _merge(replies, len(before), again, self._pipeline([*commands, *after]),
                   len(after))
        _confirm(self._confirmed, calls, replies[:len(replies) - len(after)], len(before))
        return replies

    def _pipeline(self, commands: Sequence[Command]) -> list[Any]:
        """Send ``commands`` in one round trip; once more if the connection broke (every
        script call in them is a request whose reply is kept, see keep_reply)."""
        try:
            return self._pipeline_once(commands)
        except plain.BROKEN:
            return self._pipeline_once(commands)

    def _pipeline_once(self, commands: Sequence[Command]) -> list[Any]:
        with self._client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            return list(pipe.execute(raise_on_error=False))


def _count(read: Callable[[], Any]) -> Any:
    """The reply of a count sent before a script; an error reply (a mangled key) reads as
    None, the connection still in step."""
    try:
        return read()
    except ResponseError:
        return None


# -- the plain enqueue's connection and its one MULTI (see ..plain) ----------------------

_forks = threading.Lock()


class Kept:
    """The pooled connection a runner keeps for its plain enqueues: checking one out of the
    pool and back costs about a third of a plain enqueue's client time. A call that finds it
    in use (another thread's or task's enqueue) takes one from the pool as before. It goes
    back to the pool and is taken again every :data:`..plain.KEEP_SECONDS`, so that what
    the pool does at checkout still happens (a Sentinel pool follows a failover there); it
    is dropped after a connection error, and a forked child starts without it."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self._conn: Any = None
        self._since = 0.0
        self._pid = os.getpid()
        self._lock = threading.Lock()  # never waited on: a call that finds it held passes

    def take(self) -> Any:
        """The connection, held until :meth:`give_back`; None if another call holds it."""
        if self._pid != os.getpid():
            with _forks:  # the parent's socket and lock are not this process's
                if self._pid != os.getpid():
                    self._conn, self._lock, self._pid = None, threading.Lock(), os.getpid()
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._conn is not None and time.monotonic() - self._since >= plain.KEEP_SECONDS:
                conn, self._conn = self._conn, None
                self.pool.release(conn)
            if self._conn is None:
                self._conn, self._since = self.pool.get_connection(), time.monotonic()
        except BaseException:
            self._lock.release()
            raise
        return self._conn

    def give_back(self, broken: bool = False) -> None:
        try:
            if broken:
                self._conn.disconnect()  # redis-py connects it again on its next use
        finally:
            self._lock.release()


_BUSY, _BROKE = "busy", "broke"  # what became of a send on the kept connection


def send(plain_enqueue: plain.PlainEnqueue, kept: Kept, packed: plain.Packed,
               record_key: str) -> None:
    """Send a packed MULTI and check its replies: on the kept connection when it is free,
    else on a pooled one. A MULTI sent on a connection that broke before its reply may
    have run: before it is sent again (once) the job's record is looked for, and if it is
    there the job is stored (a MULTI is all or nothing) and is not stored twice (a second
    write could undo a worker's lease of it)."""
    message, queued = packed.message, packed.queued
    first = _on_kept(kept, message, queued)
    if isinstance(first, list):
        _check(plain_enqueue, kept.pool, packed, first)
        return
    replies = _on_pool(kept.pool, message, queued, record_key, sent=first == _BROKE)
    if replies is not None:
        _check(plain_enqueue, kept.pool, packed, replies)


def _check(plain_enqueue: plain.PlainEnqueue, pool: Any, packed: plain.Packed,
                 replies: list[Any]) -> None:
    """Parse EXEC's replies; a job the inbox refused is taken back, then its error raised."""
    try:
        plain_enqueue.parse(packed, replies)
    except plain.NotStored as refused:
        conn = pool.get_connection()
        try:
            conn.send_packed_command([packed.undo()])
            for _ in range(plain.UNDO_REPLIES):
                with contextlib.suppress(ResponseError):
                    conn.read_response()
        except plain.BROKEN as exc:
            conn.disconnect()
            log.warning("the record of job %s, which the queue's inbox refused, may be left"
                        " behind (it is never listed, so it never runs): %s",
                        packed.short_id, exc)
        finally:
            pool.release(conn)
        raise refused.error from None


def _on_kept(kept: Kept, message: bytes, queued: int) -> list[Any] | str:
    conn = kept.take()
    if conn is None:
        return _BUSY
    try:
        replies = exchange(conn, message, queued)
    except ResponseError:  # every reply was read: the connection is in step
        kept.give_back()
        raise
    except plain.BROKEN:
        kept.give_back(broken=True)
        return _BROKE
    except BaseException:
        kept.give_back(broken=True)
        raise
    kept.give_back()
    return replies


def _on_pool(pool: Any, message: bytes, queued: int, record_key: str, sent: bool
                   ) -> list[Any] | None:
    """EXEC's replies, or None when the record shows that an earlier send ran. Two sends
    at most in all: one more after a broken one, unless the kept connection's was that."""
    spare = not sent
    conn = pool.get_connection()

    def attempt() -> list[Any] | None:
        nonlocal sent
        if sent:
            conn.send_command("EXISTS", record_key)
            if conn.read_response():
                return None
        sent = True
        return exchange(conn, message, queued)

    def drop(_error: BaseException) -> None:
        conn.disconnect()

    try:
        try:
            return conn.retry.call_with_retry(attempt, drop)  # type: ignore[no-any-return]
        except plain.BROKEN:
            if not spare:
                raise
            return attempt()
    finally:
        pool.release(conn)
