"""``conveyor acl``: the Redis ACL rules of a role, or a ready ``ACL SETUSER`` line."""

from __future__ import annotations

import os

import click

from .. import acl as rules_of
from .base import main

ROLE_HELP = """Print the least-privilege Redis ACL rules of a conveyor process.

\b
Roles:
  producer            enqueue (single, many, delayed, keyed, debounced, workflows) and
                      read its jobs' status and results; no fetch, cancel, requeue, purge
  worker              run jobs: fetch, heartbeat, finish, retry, progress, periodic tasks,
                      register itself, reclaim expired leases; no pause or limits
  dashboard-readonly  read all the dashboard and `conveyor stats|inspect|top` read;
                      no write command at all
  operator            dashboard-readonly, and requeue dead jobs, cancel, pause, resume;
                      no purge of dead letters, no limits
  admin               everything in the namespace (purge, limits)

With --user, prints an ACL SETUSER line for redis-cli; its password is the placeholder
>PASSWORD unless --password-env names a variable that holds it."""


def _quoted(arg: str) -> str:
    """``arg`` as redis-cli reads one argument."""
    return f'"{arg}"' if any(c in arg for c in ' "()') else arg


@main.command(help=ROLE_HELP)
@click.option("--role", required=True, help="One of: " + ", ".join(rules_of.ROLES) + ".")
@click.option("--namespace", default="conveyor", show_default=True, help="Key namespace.")
@click.option("--user", help="ACL user name: print a whole ACL SETUSER line.")
@click.option("--format", "form", type=click.Choice(["rules", "command"]), default=None,
              help="rules: one rule a line; command: an ACL SETUSER line (default with --user).")
@click.option("--password-env", metavar="VAR",
              help="Environment variable holding the password (else >PASSWORD is printed).")
def acl(role: str, namespace: str, user: str | None, form: str | None,
        password_env: str | None) -> None:
    """Print the rules of ``role``, or the ACL SETUSER line of ``user``."""
    try:
        rules = rules_of.rules(role, namespace)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--role") from exc
    if (form or ("command" if user else "rules")) == "rules":
        click.echo("\n".join(rules))
        return
    password = "PASSWORD"
    if password_env:
        password = os.environ.get(password_env) or ""
        if not password:
            raise click.BadParameter(f"${password_env} is not set", param_hint="--password-env")
    line = rules_of.setuser_command(user or f"{namespace}-{role}", password, role, namespace)
    click.echo(" ".join(_quoted(a) for a in line))
