"""``conveyor doctor``: what conveyor needs from the server, one line per check.

Exit status 0 when every check passed, 2 when some warned (conveyor works but can lose
jobs or run slowly), 1 when one failed (conveyor cannot work there) or the server cannot
be reached (see :mod:`conveyor.doctor`).
"""

from __future__ import annotations

import asyncio
import json
import sys

import click
from rich.console import Console
from rich.markup import escape

from ..clients import async_client
from ..doctor import FAIL, OK, SKIP, WARN, Check, Report, run_checks
from ..urls import check_url
from .base import main
from .failures import URL_KEY

DEFAULT_URL = "redis://127.0.0.1:6379/0"
MARKS = {OK: "[green]✓[/]", WARN: "[yellow]![/]", FAIL: "[red]✗[/]", SKIP: "[dim]-[/]"}
NAME_WIDTH = 12


def line(check: Check) -> str:
    """One check as rich markup: mark, name, what was found, and its fix."""
    fix = f" [dim]→[/] [bold]{escape(check.fix)}[/]" if check.fix else ""
    return f"{MARKS[check.status]} {check.name:<{NAME_WIDTH}}{escape(check.detail)}{fix}"


async def _examine(url: str, namespace: str) -> Report:
    client = async_client(url)
    try:
        return await run_checks(client, namespace)
    finally:
        await client.aclose()


@main.command()
@click.option("--url", envvar="CONVEYOR_REDIS_URL", default=DEFAULT_URL, show_default=True,
              help="Redis URL (redis://, rediss://, redis+sentinel://, redis+cluster://).")
@click.option("--namespace", default="conveyor", show_default=True,
              help="Key namespace (the probes' keys and the ACL check use it).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.pass_context
def doctor(ctx: click.Context, url: str, namespace: str, as_json: bool) -> None:
    """Check what conveyor needs from the server: engine, scripting, persistence,
    eviction, topology, argument limit, latency, clock and ACL.

    Exit status: 0 all well, 2 warnings only, 1 something conveyor needs is missing.
    """
    ctx.meta[URL_KEY] = url
    report = asyncio.run(_examine(check_url(url), namespace))
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        console = Console(highlight=False, soft_wrap=False)
        for check in report.checks:
            console.print(line(check))
    sys.exit(report.exit_code)
