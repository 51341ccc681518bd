"""One line for the faults an operator meets, instead of a traceback.

Redis down, a wrong password, an unknown host or a bad URL are expected: the command says
which Redis it tried (without the password), what went wrong and what to check, and
exits with status 1. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from typing import Any

import click

from ..errors import ConfigurationError
from ..unreachable import describe, is_expected

URL_KEY = "conveyor.url"  # where commands leave the URL they use (click's ctx.meta)
WHERE_TO_LOOK = "pass --url or --app, or set CONVEYOR_REDIS_URL"


def one_line(exc: BaseException, url: str | None) -> str:
    """The message for an expected fault."""
    if isinstance(exc, ConfigurationError):
        return str(exc)
    return f"{describe(exc, url)} ({WHERE_TO_LOOK})"


class ConveyorGroup(click.Group):
    """The command group: expected faults of any subcommand become one line."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ConfigurationError as exc:
            raise click.ClickException(str(exc)) from None
        except Exception as exc:
            if not is_expected(exc):
                raise
            raise click.ClickException(one_line(exc, ctx.meta.get(URL_KEY))) from None
