"""``conveyor limits``, ``pause`` and ``resume``: a queue's flow control."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ..app import Conveyor
from ..errors import ConfigurationError
from ..limits import UNSET
from ..monitor.flow import FlowState
from .base import app_options, known_queue, main

console = Console(highlight=False)
NONE_WORDS = {"none", "off", "-"}


def _cap(value: str | None) -> Any:
    if value is None:
        return UNSET
    if value.lower() in NONE_WORDS:
        return None
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter(f"expected an integer or 'none', got {value!r}") from None


def _rate(value: str | None) -> Any:
    if value is None:
        return UNSET
    if value.lower() in NONE_WORDS:
        return None
    try:
        return float(value)
    except ValueError:
        return value  # "200/s", "5/m": checked by Queue.set_limits


def _show(state: FlowState) -> None:
    lim = state.limits

    def text(value: Any, unit: str = "") -> str:
        return "-" if value is None else f"{value:g}{unit}"

    table = Table("limit", "value", title=f"limits of queue {state.queue}")
    table.add_row("concurrency", text(lim.concurrency))
    table.add_row("rate", text(lim.rate, "/s"))
    table.add_row("tenant concurrency", text(lim.tenant_concurrency))
    table.add_row("tenant rate", text(lim.tenant_rate, "/s"))
    console.print(table)
    status = f"paused: {'yes' if state.paused else 'no'} · running {state.running} · " \
             f"ready {state.ready} · held {state.held}"
    if state.blocked_by:
        why = {"paused": "the queue is paused", "concurrency": "held by its concurrency cap",
               "rate": "held by its rate"}.get(state.blocked_by, state.blocked_by)
        status += f" ({why})"
    console.print(status)
    tenants = sorted(set(lim.tenants) | set(state.running_by_tenant) | set(state.held_by_tenant))
    if tenants:
        rows = Table("tenant", "concurrency", "rate", "running", "held", title="tenants")
        for t in tenants:
            own = lim.tenants.get(t)
            rows.add_row(t, text(own.concurrency if own else None),
                         text(own.rate if own else None, "/s"),
                         str(state.running_by_tenant.get(t, 0)),
                         str(state.held_by_tenant.get(t, 0)))
        console.print(rows)


@main.command()
@click.argument("queue")
@click.option("--concurrency", metavar="N", help="Jobs running at once ('none' removes).")
@click.option("--rate", metavar="R", help="Starts per second: 200, 200/s, 50/m ('none').")
@click.option("--tenant-concurrency", metavar="N", help="Default cap of every tenant.")
@click.option("--tenant-rate", metavar="R", help="Default rate of every tenant.")
@click.option("--tenant", "tenants", multiple=True, metavar="T",
              help="Apply --concurrency/--rate to these tenants instead of the queue.")
@click.option("--clear", is_flag=True, help="Remove every limit first.")
@click.option("--json", "as_json", is_flag=True, help="Print the state as JSON.")
@app_options
def limits(app: Conveyor, queue: str, concurrency: str | None, rate: str | None,
           tenant_concurrency: str | None, tenant_rate: str | None, tenants: tuple[str, ...],
           clear: bool, as_json: bool) -> None:
    """Show QUEUE's flow-control limits (no option), or change them; every worker obeys a
    change at its next claim."""
    q = app.queue(queue)
    try:
        if clear:
            q.clear_limits()
        if tenants:
            if tenant_concurrency is not None or tenant_rate is not None:
                raise click.UsageError("--tenant takes --concurrency and --rate; the"
                                       " --tenant-* options set the defaults of all tenants")
            for tenant in tenants:
                q.set_tenant_limits(tenant, concurrency=_cap(concurrency), rate=_rate(rate))
        elif any(v is not None for v in (concurrency, rate, tenant_concurrency, tenant_rate)):
            q.set_limits(concurrency=_cap(concurrency), rate=_rate(rate),
                         tenant_concurrency=_cap(tenant_concurrency),
                         tenant_rate=_rate(tenant_rate))
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc)) from None
    state = app.monitor.flow(queue)
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(state), indent=2))
    else:
        _show(state)


@main.command()
@click.argument("queue")
@app_options
def pause(app: Conveyor, queue: str) -> None:
    """Stop handing out QUEUE's jobs (it keeps accepting new ones; running jobs finish)."""
    q = app.queue(known_queue(app, queue))
    if q.is_paused():
        click.echo(f"{queue} was already paused")
        return
    q.pause()
    click.echo(f"paused {queue}: it accepts jobs and hands none out until"
               f" `conveyor resume {queue}`")


@main.command()
@click.argument("queue")
@app_options
def resume(app: Conveyor, queue: str) -> None:
    """Hand out QUEUE's jobs again, waking its idle workers."""
    q = app.queue(known_queue(app, queue))
    if not q.is_paused():
        click.echo(f"{queue} was not paused")
        return
    q.resume()
    click.echo(f"resumed {queue}")


@main.command()
@click.argument("queue")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@app_options
def purge(app: Conveyor, queue: str, yes: bool) -> None:
    """Cancel every job of QUEUE that is ready now (scheduled, running and suspended jobs
    are left alone); each ends cancelled, its record saying so. For dead letters, see
    `conveyor dead purge`."""
    q = app.queue(known_queue(app, queue))
    ready = app.monitor.backlog(queue).ready
    if not yes:
        click.confirm(f"cancel the {ready:,} ready job(s) of {queue}?", abort=True)
    n = q.purge_ready(reason="purged with conveyor purge")
    click.echo(f"cancelled {n:,} ready job(s) of {queue}")
