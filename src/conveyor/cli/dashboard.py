"""``conveyor dashboard``: serve the web dashboard of an application."""

from __future__ import annotations

import json
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

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
@click.option("--users-file", "users_file",
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Users with roles, from a JSON file (TOML when its name ends in .toml): each "
                   "user name maps to its password, role (readonly, operator or admin) and, "
                   "optionally, the queues it may act on. Keeps passwords out of the command "
                   "line and the environment.")
@app_options
def dashboard(app: Conveyor, spec: str | None, host: str, port: int, token: str | None,
              username: str | None, password: str | None, users_file: Path | None) -> None:
    """Serve the web dashboard: queues, task types, jobs, workers, schedules.

    The application is MODULE:APP (or --app), which names its tasks and schedules; without
    one, the dashboard shows what Redis holds at --url in --namespace.
    Without --token, --user or --users-file the dashboard is open to whoever reaches the
    address. --token and --user let in an admin; --users-file lets in users with roles.
    """
    import uvicorn

    from ..web import create_app

    if (username is None) != (password is None):
        raise click.UsageError("--user and --password go together")
    users = read_users_file(users_file) if users_file is not None else None
    if spec:
        app = load_app(spec)
    try:
        web = create_app(app, token=token, username=username, password=password, users=users)
    except ValueError as exc:
        raise click.UsageError(f"{users_file or '--user'}: {exc}") from None
    if (host not in ("127.0.0.1", "localhost", "::1") and token is None and username is None
            and users is None):
        click.echo(f"warning: serving on {host} without --token, --user or --users-file: "
                   "anyone who can reach it can requeue, purge and pause", err=True)
    click.echo(f"conveyor dashboard of {public_url(app.url)} (namespace {app.namespace}) on"
               f" http://{host}:{port}/", err=True)
    uvicorn.run(web, host=host, port=port, log_level="warning")


def read_users_file(path: Path) -> dict[str, Any]:
    """The users of a ``--users-file`` (JSON, or TOML when its name ends in ``.toml``),
    as ``create_app(users=...)`` takes them; the roles are checked there."""
    try:
        text = path.read_text(encoding="utf-8")
        data: Any = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise click.UsageError(f"cannot read users file {path}: {exc}") from None
    if not isinstance(data, dict):
        raise click.UsageError(f"users file {path}: expected an object of users by name")
    if os.name == "posix" and path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        click.echo(f"warning: users file {path} holds passwords and others may read it"
                   " (chmod 600 it)", err=True)
    users: dict[str, Any] = {}
    for name, entry in data.items():
        if not isinstance(entry, dict) or set(entry) - {"password", "role", "queues"}:
            raise click.UsageError(f"users file {path}: user {name!r} must be an object with"
                                   " password, role and, optionally, queues")
        password, role = entry.get("password"), entry.get("role")
        users[name] = ((password, role) if "queues" not in entry
                       else (password, role, entry["queues"]))
    return users
