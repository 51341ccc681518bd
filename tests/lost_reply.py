"""Lose the reply of a chosen request after Redis has applied it.

:class:`LoseReplies` patches redis-py's connections (sync and asyncio) while it is
active: a request whose bytes contain ``match`` is sent to the real server, which runs
it; the client then reads the reply and throws it away, closes the connection and raises
``ConnectionError``, exactly what a client sees when a reset or a timeout comes between
the server's write and its reply. (``conveyor.faults.Proxy`` does the same on the wire;
this one picks requests by their bytes in process, so a test can aim at one path.)
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from typing import Any

import redis.asyncio.connection as aconnection
import redis.connection as connection
import redis.exceptions

from conveyor.scripts import source


def script(name: str) -> bytes:
    """What identifies a call of script ``name`` on the wire: EVALSHA and its SHA (a
    ``SCRIPT EXISTS`` naming the SHA is not a call)."""
    return b"EVALSHA\r\n$40\r\n" + hashlib.sha1(source(name).encode()).hexdigest().encode()


def _joined(command: Any) -> bytes:
    if isinstance(command, (bytes, bytearray, memoryview)):
        return bytes(command)
    if isinstance(command, str):
        return command.encode()
    return b"".join(_joined(part) for part in command)


class LoseReplies:
    """Lose the replies of the next ``times`` requests that contain ``match``."""

    def __init__(self, match: bytes, times: int = 1) -> None:
        self.match = match
        self.remaining = times
        self.lost = 0
        self._lock = threading.Lock()

    def _take(self, data: bytes) -> bool:
        with self._lock:
            if self.remaining > 0 and self.match in data:
                self.remaining -= 1
                self.lost += 1
                return True
        return False

    def __enter__(self) -> LoseReplies:
        plan = self
        self._saved = (connection.AbstractConnection.send_packed_command,
                       connection.AbstractConnection.read_response,
                       aconnection.AbstractConnection.send_packed_command,
                       aconnection.AbstractConnection.read_response)
        send, read, asend, aread = self._saved

        def send_packed(conn: Any, command: Any, *args: Any, **kwargs: Any) -> None:
            conn._lose_reply = plan._take(_joined(command))
            send(conn, command, *args, **kwargs)

        def read_response(conn: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(conn, "_lose_reply", False):
                conn._lose_reply = False
                read(conn, *args, **kwargs)  # the server ran it and answered
                time.sleep(0.02)  # the rest of a pipeline is run too
                conn.disconnect()
                raise redis.exceptions.ConnectionError("injected: reply lost (connection reset)")
            return read(conn, *args, **kwargs)

        async def asend_packed(conn: Any, command: Any, *args: Any, **kwargs: Any) -> None:
            conn._lose_reply = plan._take(_joined(command))
            await asend(conn, command, *args, **kwargs)

        async def aread_response(conn: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(conn, "_lose_reply", False):
                conn._lose_reply = False
                await aread(conn, *args, **kwargs)
                await asyncio.sleep(0.02)
                await conn.disconnect()
                raise redis.exceptions.ConnectionError("injected: reply lost (connection reset)")
            return await aread(conn, *args, **kwargs)

        connection.AbstractConnection.send_packed_command = send_packed  # type: ignore[method-assign]
        connection.AbstractConnection.read_response = read_response  # type: ignore[method-assign]
        aconnection.AbstractConnection.send_packed_command = asend_packed  # type: ignore[method-assign]
        aconnection.AbstractConnection.read_response = aread_response  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        (connection.AbstractConnection.send_packed_command,  # type: ignore[method-assign]
         connection.AbstractConnection.read_response,  # type: ignore[method-assign]
         aconnection.AbstractConnection.send_packed_command,  # type: ignore[method-assign]
         aconnection.AbstractConnection.read_response) = self._saved  # type: ignore[method-assign]
