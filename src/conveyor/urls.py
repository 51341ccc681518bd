"""Redis URLs as conveyor reads them: checked when an app is made, shown without secrets.

A URL that redis-py would only reject on the first command (``localhost:6379``, a
misspelled scheme, a port that is not a number) is refused when the
:class:`~conveyor.Conveyor` is made, with a message that lists what is accepted; a
mistake in configuration then fails at deploy time, not at the first enqueue.

:func:`public_url` is the form every message and log line uses: the password never
leaves the process.

TLS options ride in the query of a ``rediss://`` URL under redis-py's names
(``?ssl_ca_certs=ca.pem&ssl_certfile=c.pem&ssl_keyfile=k.pem``), for every kind of URL:
:func:`split_tls` takes them out typed (a flag is a bool, not the text ``"false"``, which
Python reads as true), so the plain, Cluster and Sentinel clients all get the same
options. ``Conveyor(url, ssl={...})`` adds its options to the URL (:func:`with_tls`), so
every client made from ``app.url``, a worker's own listener included, uses them.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from .errors import ConfigurationError

SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster", "redis+sentinel",
           "rediss+sentinel")
ACCEPTED = ", ".join(f"{scheme}://" for scheme in SCHEMES)
EXAMPLE = "redis://127.0.0.1:6379/0"
TLS_SCHEMES = ("rediss", "rediss+cluster", "rediss+sentinel")
_FLAGS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
_CERT_REQS = ("none", "optional", "required")


def _flag(text: str) -> bool:
    try:
        return _FLAGS[text.lower()]
    except KeyError:
        raise ValueError(f"{text!r} is not one of {', '.join(_FLAGS)}") from None


def _cert_reqs(text: str) -> str:
    if text.lower() not in _CERT_REQS:
        raise ValueError(f"{text!r} is not one of {', '.join(_CERT_REQS)}")
    return text.lower()


# The TLS options a URL may carry (redis-py's names), each with how its text is read.
TLS_OPTIONS: dict[str, Callable[[str], Any]] = {
    "ssl_ca_certs": str,        # a PEM file of the CA certificates to trust
    "ssl_ca_path": str,         # a folder of them
    "ssl_ca_data": str,         # the PEM text itself
    "ssl_certfile": str,        # the client certificate (mutual TLS)
    "ssl_keyfile": str,         # its private key
    "ssl_password": str,        # the key's password
    "ssl_cert_reqs": _cert_reqs,   # none | optional | required (the default)
    "ssl_check_hostname": _flag,   # the default: true
    "ssl_ciphers": str,
}
SECRET_OPTIONS = frozenset({"ssl_password"})


def public_url(url: str) -> str:
    """``url`` with its password (and a TLS key's password) replaced by ``***`` (the user
    name is kept)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unreadable URL>"
    secret_query = any(name in SECRET_OPTIONS for name, _ in parse_qsl(parts.query))
    if parts.password is None and not secret_query:
        return url
    if secret_query:
        query = [(name, "***" if name in SECRET_OPTIONS else value)
                 for name, value in parse_qsl(parts.query, keep_blank_values=True)]
        parts = parts._replace(query=urlencode(query, safe="*/", quote_via=quote))
    if parts.password is None:
        return urlunsplit(parts)
    user, _, hosts = parts.netloc.rpartition("@")
    name = user.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{name}:***@{hosts}"))


def split_tls(url: str) -> tuple[str, dict[str, Any]]:
    """``url`` without the TLS options of its query, and those options, typed.

    :raises ConfigurationError: an ``ssl_*`` option is unknown or its value unreadable, or
        the URL carries TLS options but its scheme is not a TLS one (``rediss...``)
    """
    parts = urlsplit(url)
    kept: list[tuple[str, str]] = []
    tls: dict[str, Any] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if not name.startswith("ssl_"):
            kept.append((name, value))
        elif name not in TLS_OPTIONS:
            raise _refuse(url, f"unknown TLS option {name!r} (known: {', '.join(TLS_OPTIONS)})")
        else:
            try:
                tls[name] = TLS_OPTIONS[name](value)
            except ValueError as exc:
                raise _refuse(url, f"{name}: {exc}") from None
    if tls and parts.scheme.lower() not in TLS_SCHEMES:
        raise _refuse(url, f"TLS options ({', '.join(tls)}) need a TLS scheme"
                           f" ({', '.join(s + '://' for s in TLS_SCHEMES)})")
    if not tls:
        return url, tls
    return urlunsplit(parts._replace(query=urlencode(kept))), tls


def _option_text(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, ssl.VerifyMode):
        return {ssl.CERT_NONE: "none", ssl.CERT_OPTIONAL: "optional"}.get(value, "required")
    if isinstance(value, str | os.PathLike):
        return os.fspath(value)
    raise ConfigurationError(f"ssl option {name!r}: {value!r} is not a str, path or bool")


def with_tls(url: str, options: Mapping[str, Any]) -> str:
    """``url`` with the TLS ``options`` of ``Conveyor(ssl=...)`` added to its query.

    :param options: redis-py's ``ssl_*`` options without the prefix, e.g.
        ``{"ca_certs": "ca.pem", "certfile": "c.pem", "keyfile": "k.pem"}``
    :raises ConfigurationError: (a ``ValueError``) the URL is not a TLS one, ``options`` is
        not a mapping, names an unknown option, or names one the URL already sets
    """
    if not isinstance(options, Mapping):
        raise ConfigurationError(
            f"ssl= takes a dict of TLS options (redis-py accepts no {type(options).__name__});"
            f" known: {', '.join(name.removeprefix('ssl_') for name in TLS_OPTIONS)}")
    if urlsplit(url).scheme.lower() not in TLS_SCHEMES:
        raise ConfigurationError(
            f"ssl= needs a TLS URL ({', '.join(s + '://' for s in TLS_SCHEMES)}),"
            f" not {public_url(url)!r}")
    _, present = split_tls(url)
    added: list[tuple[str, str]] = []
    for key, value in options.items():
        name = "ssl_" + key
        if name not in TLS_OPTIONS:
            raise ConfigurationError(f"unknown ssl option {key!r} (known: "
                                     f"{', '.join(n.removeprefix('ssl_') for n in TLS_OPTIONS)})")
        if name in present:
            raise ConfigurationError(f"ssl option {key!r} is set both by ssl= and in the URL"
                                     f" ({name})")
        added.append((name, _option_text(key, value)))
    if not added:
        return url
    parts = urlsplit(url)
    query = "&".join(q for q in (parts.query, urlencode(added, safe="/", quote_via=quote)) if q)
    return urlunsplit(parts._replace(query=query))


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

        parse_sentinel_url(split_tls(url)[0])  # names its own mistakes
        return url
    split_tls(url)
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise _refuse(url, f"database {db!r} is not a number")
    return url
