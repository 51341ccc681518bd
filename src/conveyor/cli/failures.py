"""One line for the faults an operator meets, instead of a traceback.

Redis down, a wrong password, an unknown host or a bad URL are expected: the command says
which Redis it tried (without the password), what went wrong and what to check, and
exits with status 1. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from typing import Any

import click
import redis.exceptions

from ..errors import ConfigurationError
from ..urls import public_url

URL_KEY = "conveyor.url"  # where commands leave the URL they use (click's ctx.meta)
WHERE_TO_LOOK = "pass --url or --app, or set CONVEYOR_REDIS_URL"


def cause(exc: BaseException) -> tuple[str, str]:
    """What went wrong reaching Redis, and what to check, in a few words each."""
    text = str(exc)
    if isinstance(exc, redis.exceptions.AuthenticationError) or "NOAUTH" in text \
            or "WRONGPASS" in text:
        return "authentication failed", "the user name and password in the URL"
    if isinstance(exc, redis.exceptions.TimeoutError | TimeoutError):
        return "no answer in time", "the host and port, and any firewall between"
    if "refused" in text.lower():
        return "connection refused", "that redis-server is running and listens there"
    if "not known" in text or "resolution" in text or "getaddrinfo" in text:
        return "unknown host", "the host name in the URL"
    if "No such file" in text:
        return "no socket at that path", "the socket path and that redis-server runs"
    first = text.splitlines()[0] if text else type(exc).__name__
    return first, "that the URL names a running Redis server"


def one_line(exc: BaseException, url: str | None) -> str:
    """The message for an expected fault."""
    where = f" at {public_url(url)}" if url else ""
    if isinstance(exc, ConfigurationError):
        return str(exc)
    what, check = cause(exc)
    return f"cannot reach Redis{where}: {what}; check {check} ({WHERE_TO_LOOK})"


EXPECTED = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
            redis.exceptions.AuthenticationError, redis.exceptions.BusyLoadingError,
            ConnectionError, TimeoutError)


class ConveyorGroup(click.Group):
    """The command group: expected faults of any subcommand become one line."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ConfigurationError as exc:
            raise click.ClickException(str(exc)) from None
        except redis.exceptions.ResponseError as exc:
            if "NOAUTH" not in str(exc) and "WRONGPASS" not in str(exc):
                raise
            raise click.ClickException(one_line(exc, ctx.meta.get(URL_KEY))) from None
        except EXPECTED as exc:
            raise click.ClickException(one_line(exc, ctx.meta.get(URL_KEY))) from None
