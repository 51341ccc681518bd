"""``conveyor reseal``: re-encrypt a queue's stored jobs under the current key."""

from __future__ import annotations

import click
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from ..app import Conveyor
from ..errors import ConfigurationError
from ..reseal import reseal as reseal_queue
from .base import app_options, known_queue, main


@main.command()
@click.argument("queue")
@app_options
def reseal(app: Conveyor, queue: str) -> None:
    """Seal every encrypted value stored in QUEUE's jobs (arguments, results, step values)
    under the current key of the app's encryption, so that an older key can be dropped.

    Rotate a key in three steps: list the new key beside the old and make it current
    (Encryption(keys={"k2": new, "k1": old}, current="k2")) and deploy; run this for each
    queue; then drop "k1". Jobs keep running meanwhile; a record that changes while it is
    read is read again. Needs --app (the keys are in the app). Exits 1 when some job could
    not be opened here (listed), or kept changing.
    """
    queue = known_queue(app, queue)
    console = Console(stderr=True)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        bar = progress.add_task(f"resealing {queue}: 0 records read")
        try:
            report = reseal_queue(app, queue, on_record=lambda n: progress.update(
                bar, description=f"resealing {queue}: {n:,} records read"))
        except ConfigurationError as exc:
            raise click.ClickException(str(exc)) from exc
    click.echo(f"{queue}: {report.records:,} job records read, {report.resealed:,} resealed"
               f" under key {app.encryption.current if app.encryption else '?'!r}")
    for short_id, why in sorted(report.unreadable.items())[:50]:
        click.echo(f"  not resealed: {short_id}: {why}")
    for key in report.busy[:50]:
        click.echo(f"  kept changing, not resealed: {key}")
    if report.unreadable or report.busy:
        raise SystemExit(1)
