"""Read and repair commands: ``conveyor job``, ``conveyor cancel``, ``conveyor dead``,
``conveyor info``."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..app import Conveyor
from ..encryption import ENCRYPTED
from ..errors import JobNotFound
from ..job import JobInfo
from ..monitor.lists import read_job_detail
from .base import app_options, known_queue, main
from .layout import NAME, TEXT, Column, view
from .observe import plain
from .worker import show_fleet

console = Console()


def when(ts: float | None, timespec: str = "milliseconds") -> str:
    if ts is None:
        return "-"
    stamp = dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(sep=" ", timespec=timespec)
    return stamp.replace("+00:00", "Z")


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def info_dict(info: JobInfo) -> dict[str, Any]:
    out = {f: getattr(info, f) for f in info.__dataclass_fields__}
    out["state"] = info.state.value
    return out


@main.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print the record as JSON.")
@app_options
def job(app: Conveyor, job_id: str, as_json: bool) -> None:
    """Show the record of job JOB_ID: state, attempts, timings, arguments, error, result.

    Arguments and results of encrypted tasks show as [encrypted], parameters a task
    redacts as [redacted]."""
    try:
        detail = read_job_detail(app, job_id)
    except (JobNotFound, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    info = detail.info
    if as_json:
        click.echo(json.dumps(info_dict(info) | {"args": detail.args, "kwargs": detail.kwargs},
                              default=str, indent=2))
        return
    table = Table(show_header=False, box=None)
    for name in ("id", "task", "queue", "tenant", "priority", "state"):
        table.add_row(name, str(getattr(info, name) if name != "state" else info.state.value))
    if info.waiting_for:
        table.add_row("waiting for", info.waiting_for)
    table.add_row("attempts", f"{info.attempts} of {info.max_attempts}")
    if info.progress is not None:
        note = f"  {info.progress_note}" if info.progress_note else ""
        table.add_row("progress", f"{info.progress:.0%}{note}")
    # Text, not markup: "[redacted]" and "[encrypted]" are no style tags
    table.add_row("args", Text(detail.args if isinstance(detail.args, str)
                               else repr(detail.args)))
    if detail.kwargs:
        table.add_row("kwargs", Text(repr(detail.kwargs)))
    for name in ("enqueued_at", "run_at", "started_at", "finished_at"):
        table.add_row(name, when(getattr(info, name)))
    if detail.running_for is not None:  # active, held by a worker
        table.add_row("running", f"for {seconds(detail.running_for)} on worker {info.worker}")
    table.add_row("wait_time", seconds(info.wait_time))
    table.add_row("run_time", seconds(info.run_time))
    if info.error:
        table.add_row("error", Text(info.error))
    if info.result is not None:
        table.add_row("result", Text(info.result if info.result == ENCRYPTED
                                     else repr(info.result)))
    console.print(table)


@main.command()
@click.argument("job_id")
@click.option("--reason", default=None, help="Why (stored on the job after who cancelled it).")
@app_options
def cancel(app: Conveyor, job_id: str, reason: str | None) -> None:
    """Cancel job JOB_ID: a waiting job never runs; a running one is stopped within about a
    second and ends cancelled. Exits 1 when the job had already ended."""
    try:
        handle = app.job(job_id)
        done = handle.cancel(reason=reason)
        state = handle.info().state.value
    except (JobNotFound, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    if not done:
        click.echo(f"job {job_id} was not cancelled: it is {state}")
        raise SystemExit(1)
    if state == "active":
        click.echo(f"job {job_id} is running: its worker has been asked to stop it")
    else:
        click.echo(f"job {job_id} cancelled")


@main.group()
def dead() -> None:
    """Inspect, requeue and purge dead letters."""


DEAD_COLUMNS = [Column("id", NAME), Column("task", NAME), Column("tenant", NAME),
                Column("attempts"), Column("died (UTC)"), Column("error", TEXT)]


@dead.command("list")
@click.argument("queue")
@click.option("-n", "--limit", default=50, show_default=True, help="Show at most this many.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@app_options
def dead_list(app: Conveyor, queue: str, limit: int, as_json: bool) -> None:
    """List the dead jobs of QUEUE, oldest first, with the first line of their errors."""
    letters = app.dead_letters(known_queue(app, queue))
    infos = letters.list(limit=limit)
    if as_json:
        click.echo(json.dumps([info_dict(i) for i in infos], default=str, indent=2))
        return
    rows = [[i.id, i.task, i.tenant or "", str(i.attempts), when(i.finished_at, "seconds"),
             (i.error or "").strip().split("\n", 1)[0]] for i in infos]
    total = len(letters)
    shown = f"{len(infos):,} of {total:,}" if total > len(infos) else f"{total:,}"
    console.print(view(console, f"dead in {queue}: {shown}, oldest first", DEAD_COLUMNS,
                       rows))
    if total > len(infos):
        console.print(f"(-n {total} shows them all; `conveyor job ID` shows one in full)",
                      style="dim")


@dead.command("requeue")
@click.argument("queue")
@click.option("--id", "job_id", help="Requeue only this job (default: all, after asking).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@app_options
def dead_requeue(app: Conveyor, queue: str, job_id: str | None, yes: bool) -> None:
    """Give dead jobs of QUEUE fresh attempts."""
    letters = app.dead_letters(known_queue(app, queue))
    if job_id is None and not yes:
        click.confirm(f"requeue all {len(letters):,} dead jobs of {queue}?", abort=True)
    n = letters.requeue(job_id)
    click.echo(f"requeued {n} job(s) from {queue}")


@dead.command("purge")
@click.argument("queue")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@app_options
def dead_purge(app: Conveyor, queue: str, yes: bool) -> None:
    """Delete every dead job of QUEUE."""
    letters = app.dead_letters(known_queue(app, queue))
    if not yes:
        click.confirm(f"delete all {len(letters):,} dead jobs of {queue}?", abort=True)
    n = letters.purge()
    click.echo(f"purged {n} job(s) from {queue}")


QUEUE_COLUMNS = [Column("queue", NAME), Column("ready"), Column("scheduled"),
                 Column("active"), Column("suspended"), Column("dead"), Column("paused")]
SCHEDULE_COLUMNS = [Column("periodic", NAME), Column("queue", NAME), Column("cron (UTC)"),
                    Column("last fired"), Column("next")]


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@app_options
def info(app: Conveyor, as_json: bool) -> None:
    """Queues with their backlog, live workers and supervisors, and periodic schedules."""
    queues = app.monitor.overview().queues
    if as_json:
        out = {"queues": {row.name: {**plain(row.backlog), "paused": row.paused}
                          for row in queues},
               "workers": plain(app.monitor.workers()),
               "schedules": plain(app.monitor.schedules()) if app.periodics else []}
        click.echo(json.dumps(out, default=str, indent=2))
        return
    rows = [[row.name, str(row.backlog.ready), str(row.backlog.scheduled),
             str(row.backlog.active), str(row.backlog.suspended), str(row.backlog.dead),
             "yes" if row.paused else "-"]
            for row in queues]
    console.print(view(console, "queues (jobs)", QUEUE_COLUMNS, rows))
    show_fleet(app, console)
    show_schedules(app)


def show_schedules(app: Conveyor) -> None:
    """Periodic jobs of the app (needs --app): cron, last tick fired, next tick."""
    if not app.periodics:
        return
    rows = [[row.task, row.queue, row.cron,
             when(row.last, "seconds") if row.last is not None else "never",
             when(row.next, "seconds")] for row in app.monitor.schedules()]
    console.print(view(console, "schedules", SCHEDULE_COLUMNS, rows))
