"""Redis out of reach, said in one line: which Redis, what went wrong, what to check.

The CLI, the worker and the dashboard meet the same faults (a server that is down, a
wrong password, an unknown host) and say them the same way, with the URL's password
hidden (see :func:`conveyor.urls.public_url`).
"""

from __future__ import annotations

import redis.exceptions

from .urls import public_url

# What these mean is "Redis cannot be used now", not a bug: said in one line, no traceback.
EXPECTED = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
            redis.exceptions.BusyLoadingError, ConnectionError, TimeoutError)


def is_expected(exc: BaseException) -> bool:
    """Whether ``exc`` means Redis cannot be reached or used (rather than a bug)."""
    text = str(exc)
    return isinstance(exc, EXPECTED) or (
        isinstance(exc, redis.exceptions.ResponseError)
        and ("NOAUTH" in text or "WRONGPASS" in text))


def cause(exc: BaseException) -> tuple[str, str]:
    """What went wrong reaching Redis, and what to check, in a few words each."""
    text = str(exc)
    if isinstance(exc, redis.exceptions.AuthenticationError) or "NOAUTH" in text \
            or "WRONGPASS" in text:
        return "authentication failed", "the user name and password in the URL"
    if isinstance(exc, redis.exceptions.BusyLoadingError):
        return "Redis is loading its data", "again in a moment"
    if isinstance(exc, redis.exceptions.TimeoutError | TimeoutError):
        return "no answer in time", "the host and port, and any firewall between"
    if "certificate verify failed" in text or "CERTIFICATE_VERIFY_FAILED" in text:
        return ("certificate verify failed: the server's TLS certificate is not trusted",
                "that ssl_ca_certs names the CA that signed it, and that the host name is"
                " one the certificate names")
    if "certificate required" in text.lower():
        return ("the server requires a client certificate (TLS)",
                "ssl_certfile and ssl_keyfile in the URL, or Conveyor(ssl=...)")
    if "refused" in text.lower():
        return "connection refused", "that redis-server is running and listens there"
    if ("reset by peer" in text or "closed by server" in text.lower()
            or "connection lost" in text.lower()):  # redis-py: "... Connection lost."
        return "the connection was cut", "that redis-server is still running"
    if "not known" in text or "resolution" in text or "getaddrinfo" in text:
        return "unknown host", "the host name in the URL"
    if "No such file" in text:
        return "no socket at that path", "the socket path and that redis-server runs"
    first = text.splitlines()[0] if text else type(exc).__name__
    return first, "that the URL names a running Redis server"


def describe(exc: BaseException, url: str | None) -> str:
    """``cannot reach Redis at URL: cause; check ...``"""
    where = f" at {public_url(url)}" if url else ""
    what, check = cause(exc)
    text = str(exc)
    if url and url.lower().startswith("rediss") and (
            "EOF occurred" in text or "reset by peer" in text or "closed by server" in text):
        # A server that requires client certificates hangs up after the handshake.
        check += ("; with TLS, that the server accepts this client's certificate"
                  " (ssl_certfile and ssl_keyfile in the URL, or Conveyor(ssl=...))")
    return f"cannot reach Redis{where}: {what}; check {check}"
