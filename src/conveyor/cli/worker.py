"""``conveyor worker``: run workers for an application."""

from __future__ import annotations

import click

from .base import load_app, main


@main.command()
@click.argument("app_spec", metavar="MODULE:APP")
@click.option("-q", "--queue", "queues", multiple=True,
              help="Queue to serve (repeatable; default: every queue the app's tasks name).")
@click.option("-c", "--concurrency", default=32, show_default=True,
              help="Jobs running at once per process.")
@click.option("--burst", is_flag=True,
              help="Exit once no job is ready (does not wait for delayed jobs or retries).")
@click.option("--grace", default=30.0, show_default=True,
              help="Seconds running jobs get to finish after SIGTERM/SIGINT.")
def worker(app_spec: str, queues: tuple[str, ...], concurrency: int, burst: bool,
           grace: float) -> None:
    """Consume jobs of MODULE:APP.

    SIGTERM or Ctrl-C stops fetching and lets running jobs finish within --grace; a second
    signal stops at once. Jobs still held are retried elsewhere, never lost.
    """
    app = load_app(app_spec)
    app.worker(queues=list(queues) or None, concurrency=concurrency, grace=grace).run(burst=burst)
