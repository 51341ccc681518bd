"""``conveyor shards``: how a queue is spread over shards, and changing it."""

from __future__ import annotations

import json

import click
from rich.console import Console

from ..app import Conveyor
from ..errors import ConfigurationError
from ..limits import Queue
from ..monitor import ShardState
from ..sharding import MAX_SHARDS, read_layout
from .base import app_options, main
from .layout import NAME, Column, view
from .observe import plain

console = Console(highlight=False)
COLUMNS = [Column("shard", NAME), Column("state"), Column("ready"), Column("running"),
           Column("share of cap"), Column("dead")]


def _count(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise click.BadParameter(f"N must be an integer from 1 to {MAX_SHARDS}, got {text!r}",
                                 param_hint="N") from None


def _handle(app: Conveyor, queue: str) -> Queue:
    try:
        return app.queue(queue)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint="QUEUE") from None


def _show(app: Conveyor, queue: str, rows: list[ShardState]) -> None:
    clustered = any(r.node is not None for r in rows)
    columns = COLUMNS + ([Column("node", NAME)] if clustered else [])
    cells = [[r.name, "retired" if r.retired else "active", str(r.backlog.ready),
              str(r.running), "-" if r.share is None else str(r.share), str(r.backlog.dead),
              *([r.node or "-"] if clustered else [])] for r in rows]
    active = sum(not r.retired for r in rows)
    console.print(view(console, f"queue {queue}: {active} active shard(s)", columns, cells))


@main.command()
@click.argument("queue")
@click.argument("count", metavar="[N]", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the shards as JSON.")
@app_options
def shards(app: Conveyor, queue: str, count: str | None, as_json: bool) -> None:
    """Show how QUEUE is spread over shards, or spread it over N shards (1 to 64).

    Without N: the number of shards new jobs go to, and every shard that may hold jobs
    (retired ones too) with its ready and running jobs, its share of the queue's
    concurrency cap and, on a Redis Cluster, the node that holds it.

    With N: new jobs are spread over N shards from the next second on (producers read the
    layout again within a second). A shard a smaller N stops sending to keeps its jobs and
    is served until it is empty. One queue runs on one Redis core (some 40-70k jobs/s);
    shards let it use more, each on its own hash tag (its own Cluster node where there are
    enough)."""
    q = _handle(app, queue)
    if count is not None:
        wanted = _count(count)
        before = q.shards()
        try:
            after = q.set_shards(wanted)
        except ConfigurationError as exc:
            raise click.BadParameter(str(exc), param_hint="N") from None
        layout = read_layout(app, queue)
        if after == before:
            click.echo(f"{queue} already spreads new jobs over {after} shard(s)")
        else:
            click.echo(f"{queue}: {before} -> {after} shard(s); new jobs go to"
                       f" {', '.join(layout.active)}")
        if layout.retired:
            click.echo(f"retired (served until empty): {', '.join(layout.retired)}")
        return
    rows = app.monitor.shard_states(queue)
    if as_json:
        click.echo(json.dumps({"queue": queue, "shards": q.shards(), "served": plain(rows)},
                              indent=2))
        return
    _show(app, queue, rows)
