"""The command group, and how commands find the application they work on."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import click

from ..app import Conveyor
from ..errors import ConfigurationError
from ..loading import import_app
from .failures import URL_KEY, ConveyorGroup

VERBOSE_KEY = "conveyor.verbose"  # -v count, for commands that set up their own logging


@click.group(cls=ConveyorGroup,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="conveyor")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.pass_context
def main(ctx: click.Context, verbose: int) -> None:
    """conveyor: a reliable, fair, precisely scheduled task queue on Redis.

    Commands that read or change queues find Redis through --app MODULE:APP, else --url,
    else $CONVEYOR_REDIS_URL, else redis://127.0.0.1:6379/0.
    """
    ctx.meta[VERBOSE_KEY] = verbose
    level = logging.WARNING - 10 * verbose
    logging.basicConfig(level=max(logging.DEBUG, level),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def load_app(spec: str) -> Conveyor:
    """Import ``MODULE:APP`` (see :func:`conveyor.loading.import_app`) for a command.

    :raises click.BadParameter: the module or the attribute is missing, or is not an app
    """
    try:
        app = import_app(spec)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc)) from exc
    click.get_current_context().meta[URL_KEY] = app.url
    return app


def app_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add --app / --url / --namespace and pass a ready ``app`` to the command."""

    @click.option("-a", "--app", "app_spec", metavar="MODULE:APP", envvar="CONVEYOR_APP",
                  help="Application to load (gives task names, queues and thresholds).")
    @click.option("--url", envvar="CONVEYOR_REDIS_URL", help="Redis URL (without --app).")
    @click.option("--namespace", default="conveyor", show_default=True,
                  help="Key namespace (without --app).")
    @click.pass_context
    def wrapper(ctx: click.Context, /, app_spec: str | None, url: str | None, namespace: str,
                **kwargs: Any) -> Any:
        if app_spec:
            app = load_app(app_spec)
        else:
            ctx.meta[URL_KEY] = url
            app = Conveyor(url, namespace=namespace)
            ctx.meta[URL_KEY] = app.url  # with the default filled in
        return ctx.invoke(func, app=app, **kwargs)

    wrapper.__doc__ = func.__doc__
    wrapper.__name__ = func.__name__
    return wrapper


def known_queue(app: Conveyor, queue: str) -> str:
    """``queue`` if it ever received a job (or a task of the app names it).

    :raises click.ClickException: it is unknown (a misspelling, or another namespace)
    """
    known = app.known_queues()
    if queue in known:
        return queue
    listed = ", ".join(known[:20]) if known else "none yet"
    raise click.ClickException(
        f"unknown queue {queue!r} in namespace {app.namespace!r} (known queues: {listed});"
        " check the name, --namespace or --app")
