"""A TCP proxy between clients and Redis that can delay, drop, reset and black-hole.

``Proxy(("127.0.0.1", 6379)).start()`` listens on a free loopback port (:attr:`Proxy.port`)
and forwards every connection to the target. At any moment:

- :meth:`Proxy.delay` holds each chunk for a while before passing it on;
- :meth:`Proxy.drop` closes every connection cleanly (the peer sees EOF);
- :meth:`Proxy.reset` aborts every connection (the peer sees a reset);
- :meth:`Proxy.blackhole` keeps every connection open but passes nothing either way, as
  a peer that vanished without a word (a half-open connection): only timeouts notice it;
- :meth:`Proxy.heal` ends the delay and the black hole.

Threads, not asyncio, so that it works the same beside sync tests and asyncio workers.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time

__all__ = ["Proxy"]

CHUNK = 65536
TICK = 0.05  # seconds a pump waits between looks at its sockets and the proxy's state


class Proxy:
    """Forward ``127.0.0.1:<port>`` to ``target``; see the module docstring.

    :param target: (host, port) of the real server
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._pumps: dict[int, list[threading.Thread]] = {}  # id(client socket) -> its pumps
        self._blackholed = False
        self._delay = 0.0
        self._closed = False
        self.connections = 0  # accepted so far

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
        """Forward again, without delay."""
        self._blackholed = False
        self._delay = 0.0

    def drop(self) -> None:
        """Close every open connection cleanly."""
        self._close_pairs(abort=False)

    def reset(self) -> None:
        """Abort every open connection with a TCP reset."""
        self._close_pairs(abort=True)

    def close(self) -> None:
        """Stop listening and close every connection."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        self._close_pairs(abort=False)

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inside ----------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _abort(client)
                continue
            upstream.settimeout(None)
            pumps = [threading.Thread(target=self._pump, args=(src, dst), name="proxy-pump",
                                      daemon=True)
                     for src, dst in ((client, upstream), (upstream, client))]
            with self._lock:
                self._pairs.append((client, upstream))
                self._pumps[id(client)] = pumps
                self.connections += 1
            for pump in pumps:
                pump.start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self._closed:
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
                dst.sendall(data)
        except (OSError, ValueError):
            pass
        finally:
            self._forget(src, dst)

    def _forget(self, a: socket.socket, b: socket.socket) -> None:
        with self._lock:
            self._pairs = [p for p in self._pairs if a not in p and b not in p]
            self._pumps.pop(id(a), None)
            self._pumps.pop(id(b), None)
        for sock in (a, b):
            with contextlib.suppress(OSError):
                sock.close()

    def _close_pairs(self, abort: bool) -> None:
        """Close every pair, and return once their pumps have ended: a pump blocked on a
        socket holds it open in the kernel, so only then has the peer seen the end."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
            pumps = [t for client, _ in pairs for t in self._pumps.pop(id(client), [])]
        for pair in pairs:
            for sock in pair:
                if abort:
                    _abort(sock)
                else:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                    with contextlib.suppress(OSError):
                        sock.close()
        for pump in pumps:
            if pump is not threading.current_thread():
                pump.join(timeout=1.0)


def _abort(sock: socket.socket) -> None:
    """Close with SO_LINGER 0: the peer gets a reset, not an orderly end."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()
