"""A TCP proxy between clients and Redis that can delay, drop, reset, black-hole, and lose
the replies of chosen requests.

``Proxy(("127.0.0.1", 6379)).start()`` listens on a free loopback port (:attr:`Proxy.port`)
and forwards every connection to the target. At any moment:

- :meth:`Proxy.delay` holds each chunk for a while before passing it on;
- :meth:`Proxy.drop` closes every connection cleanly (the peer sees EOF);
- :meth:`Proxy.reset` aborts every connection (the peer sees a reset);
- :meth:`Proxy.blackhole` keeps every connection open but passes nothing either way, as
  a peer that vanished without a word (a half-open connection): only timeouts notice it;
- :meth:`Proxy.lose_replies` lets chosen requests through, and once Redis has answered one
  (so it has applied it) drops the reply and resets that client's connection: the client
  sees a ``ConnectionError`` for a command that took effect (an *ambiguous outcome*);
  :meth:`Proxy.lose_next_reply` does it to the next request, whatever it is;
- :meth:`Proxy.heal` ends the delay, the black hole and every lost-reply rule.

The target is an address, or a function that returns one, asked at each new connection
(a proxy that follows a Sentinel set's primary, as a TCP load balancer with a role check
does).

How a reply is lost
-------------------
The proxy reads the Redis protocol (RESP2 and RESP3) in both directions of every
connection. Client to server it cuts the bytes into requests (arrays of bulk strings, or
inline commands) and, before forwarding a request, checks it against the armed rules: a
request that matches a rule with some of its count left is *chosen*, and its place in the
connection's queue of outstanding requests is marked. Server to client it cuts the bytes
into replies (RESP3 push messages, which answer no request, are passed over) and pairs
each with the oldest outstanding request: Redis answers a connection's requests in order.
The replies before the chosen one's are passed on; when the chosen request's reply is
complete, the proxy passes none of it on, aborts the client side with a TCP reset and
closes its connection to Redis. Redis has written the reply, so it has executed the
request; a blocking command (``BLPOP``) loses its reply when it is finally answered.

Limits:

- pipelined requests: Redis has also executed the requests sent after the chosen one on
  that connection; their replies are lost with the connection. Replies before it are
  passed on, but the reset may overtake them, so the client sees its whole pipeline fail.
  A ``MULTI`` ... ``EXEC`` block is several requests: to lose the outcome of the
  transaction, match ``EXEC``;
- a connection that subscribes (``SUBSCRIBE``, ``PSUBSCRIBE``, ``SSUBSCRIBE``), runs
  ``MONITOR`` or ``CLIENT REPLY``, or sends bytes the proxy cannot read as RESP, no longer
  answers one reply per request: the proxy stops pairing on it and forwards its bytes
  untouched; no reply of it is lost from then on;
- a chosen request whose connection ends before its reply (Redis restarted, the client
  gave up) loses nothing: the rule counts it as *missed*;
- every byte is parsed in Python: the proxy is for tests and fault runs, not for load.

Threads, not asyncio, so that it works the same beside sync tests and asyncio workers.
"""

from __future__ import annotations

import collections
import contextlib
import select
import socket
import struct
import threading
import time
from collections.abc import Callable

__all__ = ["LostReplies", "Proxy"]

CHUNK = 65536
TICK = 0.05  # seconds a pump waits between looks at its sockets and the proxy's state

Address = tuple[str, int]
Match = bytes | Callable[[bytes], bool] | None

# Commands after which a connection no longer gets one reply per request.
UNPAIRED = frozenset({b"SUBSCRIBE", b"PSUBSCRIBE", b"SSUBSCRIBE", b"MONITOR"})


class LostReplies:
    """One rule of :meth:`Proxy.lose_replies`, and what came of it.

    :ivar count: replies to lose (None: every matching request until cancelled)
    :ivar chosen: requests it has chosen so far
    :ivar lost: replies it dropped (each with a reset of its connection)
    :ivar missed: chosen requests whose connection ended before their reply came
    :ivar requests: a short description of each request whose reply was lost
        (``b"EVALSHA 1a2b..."``), in order
    """

    def __init__(self, match: Match, count: int | None) -> None:
        if count is not None and count < 0:
            raise ValueError(f"count must be >= 0 or None, got {count}")
        self.match = match
        self.count = count
        self.chosen = 0
        self.lost = 0
        self.missed = 0
        self.requests: list[bytes] = []
        self.cancelled = False
        self._settled = threading.Condition()

    def __repr__(self) -> str:
        return (f"<LostReplies match={self.match!r} count={self.count} chosen={self.chosen}"
                f" lost={self.lost} missed={self.missed}>")

    @property
    def active(self) -> bool:
        """Whether it still chooses requests."""
        return not self.cancelled and (self.count is None or self.chosen < self.count)

    def matches(self, request: bytes) -> bool:
        if self.match is None:
            return True
        if isinstance(self.match, bytes):
            return self.match in request
        try:
            return bool(self.match(request))
        except Exception:  # a predicate that fails chooses nothing; it must not stop a pump
            return False

    def cancel(self) -> None:
        """Choose no more requests (one already chosen still loses its reply)."""
        self.cancelled = True

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until ``count`` chosen requests have had their reply lost (or missed);
        False on timeout, and at once for a rule without a count."""
        count = self.count
        if count is None:
            return False
        with self._settled:
            return self._settled.wait_for(lambda: self.lost + self.missed >= count, timeout)

    def _note(self, request: bytes | None) -> None:
        with self._settled:
            if request is None:
                self.missed += 1
            else:
                self.lost += 1
                self.requests.append(request)
            self._settled.notify_all()


class Proxy:
    """Forward ``127.0.0.1:<port>`` to ``target``; see the module docstring.

    :param target: (host, port) of the real server, or a function returning it, called
        for each new connection
    """

    def __init__(self, target: Address | Callable[[], Address]) -> None:
        self.target = target
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        self._rules: list[LostReplies] = []
        self._blackholed = False
        self._delay = 0.0
        self._closed = False
        self.connections = 0  # accepted so far
        self.lost = 0  # replies lost so far, all rules together

    @property
    def url(self) -> str:
        """A redis:// URL through the proxy (database 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> Proxy:
        self._listener.listen(64)
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()
        return self

    def delay(self, seconds: float) -> None:
        """Hold each chunk ``seconds`` before forwarding it (0 to stop delaying)."""
        self._delay = max(0.0, seconds)

    def blackhole(self) -> None:
        """Stop forwarding in both directions, keeping every connection open."""
        self._blackholed = True

    def heal(self) -> None:
        """Forward again, without delay, losing no more replies (a request already chosen
        still loses its reply)."""
        self._blackholed = False
        self._delay = 0.0
        with self._lock:
            rules, self._rules = self._rules, []
        for rule in rules:
            rule.cancel()

    def lose_replies(self, match: Match = None, count: int | None = 1) -> LostReplies:
        """Lose the replies of the next ``count`` requests that ``match`` (None: every
        count), on any connection: each such request reaches Redis and is executed, then
        its reply is dropped and its client's connection reset.

        :param match: bytes the raw request must contain (``b"EVALSHA"``, a script's SHA,
            a key), a predicate on the raw request bytes, or None for any request
        :returns: the rule, to wait on, read or cancel
        """
        rule = LostReplies(match, count)
        with self._lock:
            self._rules.append(rule)
        return rule

    def lose_next_reply(self) -> LostReplies:
        """Lose the reply of the next request, whatever it is (see :meth:`lose_replies`)."""
        return self.lose_replies(None, 1)

    def drop(self) -> None:
        """Close every open connection cleanly."""
        self._close_links(abort=False)

    def reset(self) -> None:
        """Abort every open connection with a TCP reset."""
        self._close_links(abort=True)

    def close(self) -> None:
        """Stop listening and close every connection."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        self._close_links(abort=False)

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inside ----------------------------------------------------------------------------

    def _address(self) -> Address:
        return self.target() if callable(self.target) else self.target

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._address(), timeout=5)
            except Exception:  # no server there now (down, or no primary named)
                _abort(client)
                continue
            upstream.settimeout(None)
            link = _Link(client, upstream)
            pumps = [threading.Thread(target=self._pump, args=(link, to_server),
                                      name="proxy-pump", daemon=True)
                     for to_server in (True, False)]
            link.pumps = pumps
            with self._lock:
                self._links.append(link)
                self.connections += 1
            for pump in pumps:
                pump.start()

    def _pump(self, link: _Link, to_server: bool) -> None:
        src = link.client if to_server else link.upstream
        try:
            while not self._closed and not link.cut:
                if self._blackholed:  # leave the bytes where they are: nothing passes
                    time.sleep(TICK)
                    continue
                readable, _, _ = select.select([src], [], [], TICK)
                if not readable:
                    continue
                data = src.recv(CHUNK)
                if not data:
                    break
                if self._delay:
                    time.sleep(self._delay)
                while self._blackholed and not self._closed:
                    time.sleep(TICK)
                if to_server:
                    self._requests(link, data)
                elif not self._replies(link, data):
                    break
        except (OSError, ValueError):
            pass
        finally:
            self._forget(link)

    def _requests(self, link: _Link, data: bytes) -> None:
        """Client to server: note each complete request (chosen by a rule or not) in the
        link's queue before its bytes go on, so its reply always finds it there."""
        if link.paired:
            buf = link.requests
            buf += data
            pos = 0
            try:
                while (end := _request_end(buf, pos)) >= 0:
                    self._admit(link, bytes(buf[pos:end]))
                    pos = end
                    if not link.paired:
                        break
            except ValueError:
                link.unpair()
            if link.paired:
                del buf[:pos]
        link.upstream.sendall(data)

    def _admit(self, link: _Link, request: bytes) -> None:
        name = _command(request)
        if not name:
            return  # an empty inline line: Redis answers nothing
        if name in UNPAIRED or (name == b"CLIENT" and b"REPLY" in request.upper()):
            link.unpair()
            return
        chosen = None
        with self._lock:
            if self._rules:
                for rule in self._rules:
                    if rule.active and rule.matches(request):
                        rule.chosen += 1
                        chosen = rule
                        break
                self._rules = [r for r in self._rules if r.active]
        link.pending.append((chosen, _describe(request) if chosen else b""))

    def _replies(self, link: _Link, data: bytes) -> bool:
        """Server to client: pass replies on, up to a chosen request's; False once the
        link was cut for it."""
        if not link.paired:
            if len(link.replies) > link.sent:  # held back before pairing stopped
                link.client.sendall(link.replies[link.sent:])
            link.replies.clear()
            link.sent = 0
            link.client.sendall(data)
            return True
        buf = link.replies
        buf += data
        pos, sent = 0, link.sent
        try:
            while (end := _value_end(buf, pos)) >= 0:
                if buf[pos] == PUSH:  # RESP3 out-of-band message: answers no request
                    pos = end
                    continue
                if not link.pending:
                    raise ValueError("a reply to no request")
                rule, request = link.pending.popleft()
                if rule is not None:
                    if pos > sent:
                        link.client.sendall(buf[sent:pos])
                    self._cut(link, rule, request)
                    return False
                pos = end
        except ValueError:
            link.unpair()
            return self._replies(link, b"")
        # The rest is an incomplete reply: held back when it answers a chosen request.
        upto = pos if link.pending and link.pending[0][0] is not None else len(buf)
        if upto > sent:
            link.client.sendall(buf[sent:upto])
        del buf[:pos]
        link.sent = max(upto, sent) - pos
        return True

    def _cut(self, link: _Link, rule: LostReplies, request: bytes) -> None:
        """Drop the reply: reset the client, close the upstream (its bytes are discarded).
        The loss is counted first, so a client that saw the reset finds it counted."""
        link.cut = True
        with self._lock:
            self.lost += 1
        rule._note(request)
        _abort(link.client)
        with contextlib.suppress(OSError):
            link.upstream.close()

    def _forget(self, link: _Link) -> None:
        with self._lock:
            if link.forgotten:
                return
            link.forgotten = True
            self._links = [x for x in self._links if x is not link]
        for sock in (link.client, link.upstream):
            with contextlib.suppress(OSError):
                sock.close()
        # Chosen requests left unanswered: their connection ended first.
        while link.pending:
            rule, _ = link.pending.popleft()
            if rule is not None:
                rule._note(None)

    def _close_links(self, abort: bool) -> None:
        """Close every link, and return once their pumps have ended: a pump blocked on a
        socket holds it open in the kernel, so only then has the peer seen the end."""
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            for sock in (link.client, link.upstream):
                if abort:
                    _abort(sock)
                else:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                    with contextlib.suppress(OSError):
                        sock.close()
        for link in links:
            for pump in link.pumps:
                if pump is not threading.current_thread():
                    pump.join(timeout=1.0)


class _Link:
    """One client connection and its connection to Redis."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.pumps: list[threading.Thread] = []
        # Requests forwarded and not yet answered, oldest first: (rule that chose it or
        # None, its description when chosen). Appended by one pump, popped by the other.
        self.pending: collections.deque[tuple[LostReplies | None, bytes]] = (
            collections.deque())
        self.requests = bytearray()  # client bytes not yet cut into requests
        self.replies = bytearray()  # server bytes not yet cut into replies
        self.sent = 0  # bytes at the start of ``replies`` already passed on
        self.paired = True  # one reply per request, in order (see UNPAIRED)
        self.cut = False  # a reply was lost: the link is done
        self.forgotten = False

    def unpair(self) -> None:
        self.paired = False
        self.requests.clear()


# -- the Redis protocol, as far as finding where a request or a reply ends ---------------------

PUSH = ord(">")
_LINE = frozenset(b"+-:_,#(")  # the value is the rest of the line
_BULK = frozenset(b"$!=")  # a length, then that many bytes and CRLF
_ITEMS = frozenset(b"*~>")  # a count, then that many values
_PAIRS = frozenset(b"%|")  # a count, then twice that many values
ATTRIBUTE = ord("|")  # attributes come before the value they describe


def _value_end(buf: bytes | bytearray, pos: int) -> int:
    """Where the RESP value starting at ``pos`` ends, or -1 if ``buf`` does not hold all
    of it yet.

    :raises ValueError: not a RESP value
    """
    if pos >= len(buf):
        return -1
    kind = buf[pos]
    eol = buf.find(b"\r\n", pos)
    if eol < 0:
        return -1
    if kind in _LINE:
        return eol + 2
    size = int(buf[pos + 1:eol])
    if kind in _BULK:
        if size < 0:
            return eol + 2  # RESP2 null bulk string
        end = eol + 4 + size
        return end if end <= len(buf) else -1
    if kind in _ITEMS or kind in _PAIRS:
        p = eol + 2
        for _ in range(size * 2 if kind in _PAIRS else max(size, 0)):
            p = _value_end(buf, p)
            if p < 0:
                return -1
        return _value_end(buf, p) if kind == ATTRIBUTE else p
    raise ValueError(f"not a RESP value: type byte {kind!r}")


def _request_end(buf: bytes | bytearray, pos: int) -> int:
    """Where the request starting at ``pos`` ends (an array of bulk strings, or an inline
    command: one line), or -1 if it is not all there yet."""
    if pos >= len(buf):
        return -1
    if buf[pos] == ord("*"):
        return _value_end(buf, pos)
    eol = buf.find(b"\n", pos)
    return -1 if eol < 0 else eol + 1


def _words(request: bytes, most: int) -> list[bytes]:
    """The first ``most`` words of a request (its command name first)."""
    if not request.startswith(b"*"):
        return request.split(None, most)[:most]
    words: list[bytes] = []
    pos = request.find(b"\r\n") + 2
    while len(words) < most and request.startswith(b"$", pos):
        eol = request.find(b"\r\n", pos)
        size = int(request[pos + 1:eol])
        words.append(request[eol + 2:eol + 2 + size])
        pos = eol + 4 + size
    return words


def _command(request: bytes) -> bytes:
    words = _words(request, 1)
    return words[0].upper() if words else b""


def _describe(request: bytes) -> bytes:
    """The command and its first argument, shortened: ``b"EVALSHA 1a2b..."``."""
    return b" ".join(w[:48] for w in _words(request, 2))


def _abort(sock: socket.socket) -> None:
    """Close with SO_LINGER 0: the peer gets a reset, not an orderly end."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()
