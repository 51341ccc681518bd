"""Redis URLs as conveyor reads them: checked when an app is made, shown without secrets.

A URL that redis-py would only reject on the first command (``localhost:6379``, a
misspelled scheme, a port that is not a number) is refused when the
:class:`~conveyor.Conveyor` is made, with a message that lists what is accepted; a
mistake in configuration then fails at deploy time, not at the first enqueue.

:func:`public_url` is the form every message and log line uses: the password never
leaves the process.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from .errors import ConfigurationError

SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster", "redis+sentinel",
           "rediss+sentinel")
ACCEPTED = ", ".join(f"{scheme}://" for scheme in SCHEMES)
EXAMPLE = "redis://127.0.0.1:6379/0"


def public_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (the user name is kept)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unreadable URL>"
    if parts.password is None:
        return url
    user, _, hosts = parts.netloc.rpartition("@")
    name = user.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{name}:***@{hosts}"))


def _refuse(url: str, why: str) -> ConfigurationError:
    return ConfigurationError(f"bad Redis URL {public_url(url)!r}: {why} (conveyor accepts"
                              f" {ACCEPTED}; for example {EXAMPLE})")


def _check_host(url: str, scheme: str, netloc: str) -> None:
    hosts = netloc.rpartition("@")[2]
    if not hosts:
        raise _refuse(url, "no host")
    items = hosts.split(",") if scheme.endswith("+sentinel") else [hosts]
    for item in items:
        host, colon, port = item.strip().rpartition(":")
        if colon and host and not host.endswith("]") and ":" in host:
            continue  # a bare IPv6 address: redis-py reads it as it is
        if colon and not (port.isdigit() and 0 < int(port) < 65536):
            raise _refuse(url, f"port {port!r} is not a number from 1 to 65535")


def check_url(url: str) -> str:
    """Return ``url`` if conveyor can connect with it.

    :raises ConfigurationError: the scheme is not one conveyor accepts, or the host, port
        or database cannot be read; the message names the accepted schemes
    """
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise _refuse(url, str(exc)) from None
    scheme = parts.scheme.lower()
    if "://" not in url or scheme not in SCHEMES:
        found = f"scheme {scheme + '://'!r} is not supported" if "://" in url else \
            "no scheme"
        raise _refuse(url, found)
    if scheme == "unix":
        if not parts.path:
            raise _refuse(url, "no socket path (unix:///path/to/redis.sock)")
        return url
    _check_host(url, scheme, parts.netloc)
    if scheme.endswith("+sentinel"):
        from .clients import parse_sentinel_url

        parse_sentinel_url(url)  # names its own mistakes
        return url
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise _refuse(url, f"database {db!r} is not a number")
    return url
