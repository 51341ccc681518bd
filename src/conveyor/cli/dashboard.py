"""``conveyor dashboard``: serve the web dashboard of an application."""

from __future__ import annotations

import click

from ..app import Conveyor
from ..urls import public_url
from .base import app_options, load_app, main


@main.command()
@click.argument("spec", metavar="[MODULE:APP]", required=False)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind (loopback by default: put a proxy with TLS in front "
                   "before exposing it).")
@click.option("--port", default=8600, show_default=True, type=int, help="Port to listen on.")
@click.option("--token", envvar="CONVEYOR_DASHBOARD_TOKEN",
              help="Require this token (bearer header, or open a page once with ?token=).")
@click.option("--user", "username", envvar="CONVEYOR_DASHBOARD_USER",
              help="Require HTTP basic auth with this user name (with --password).")
@click.option("--password", envvar="CONVEYOR_DASHBOARD_PASSWORD",
              help="Password for --user.")
@app_options
def dashboard(app: Conveyor, spec: str | None, host: str, port: int, token: str | None,
              username: str | None, password: str | None) -> None:
    """Serve the web dashboard: queues, task types, jobs, workers, schedules.

    The application is MODULE:APP (or --app), which names its tasks and schedules; without
    one, the dashboard shows what Redis holds at --url in --namespace.
    Without --token or --user the dashboard is open to whoever reaches the address.
    """
    import uvicorn

    from ..web import create_app

    if (username is None) != (password is None):
        raise click.UsageError("--user and --password go together")
    if spec:
        app = load_app(spec)
    web = create_app(app, token=token, username=username, password=password)
    if host not in ("127.0.0.1", "localhost", "::1") and token is None and username is None:
        click.echo(f"warning: serving on {host} without --token or --user: anyone who can "
                   "reach it can requeue, purge and pause", err=True)
    click.echo(f"conveyor dashboard of {public_url(app.url)} (namespace {app.namespace}) on"
               f" http://{host}:{port}/", err=True)
    uvicorn.run(web, host=host, port=port, log_level="warning")
