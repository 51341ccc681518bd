"""``conveyor signal``: send a signal to a job that waits for it (durable waits)."""

from __future__ import annotations

import json
from typing import Any

import click

from ..app import Conveyor
from .base import app_options, main


def _payload(data: str | None) -> Any:
    if data is None:
        return None
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--data") from exc


@main.command()
@click.argument("job_id")
@click.argument("name")
@click.option("--data", default=None, metavar="JSON",
              help="The signal's payload, as JSON (what the task's wait_for returns);"
                   " default null.")
@app_options
def signal(app: Conveyor, job_id: str, name: str, data: str | None) -> None:
    """Send signal NAME to job JOB_ID: its ``ctx.wait_for(NAME)`` returns the payload. A
    signal sent before the job waits for it is kept until it does. Exits 1 when the job
    has ended or does not exist.

    Example: conveyor signal orders~3kTq0x approved --data '{"by": "ann"}'
    """
    payload = _payload(data)
    try:
        delivered = app.signal(job_id, name, payload)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    if not delivered:
        click.echo(f"job {job_id} did not take signal {name!r}: it has ended, or no such job")
        raise SystemExit(1)
    click.echo(f"signal {name!r} sent to job {job_id}")
