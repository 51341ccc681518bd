"""``conveyor worker``: run workers for an application, alone or under a supervisor."""

from __future__ import annotations

import re
import time

import click
from rich.console import Console

from .. import logs
from ..app import Conveyor
from ..clock import server_now
from .base import VERBOSE_KEY, load_app, main
from .layout import NAME, Column, view

SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_bounds(value: str | None) -> tuple[int, int] | None:
    """``MIN:MAX`` -> (MIN, MAX); raises click.BadParameter when malformed."""
    if value is None:
        return None
    low, sep, high = value.partition(":")
    try:
        bounds = (int(low), int(high)) if sep else (1, int(low))
    except ValueError:
        raise click.BadParameter(f"expected MIN:MAX, got {value!r}") from None
    if not 1 <= bounds[0] <= bounds[1]:
        raise click.BadParameter(f"expected 1 <= MIN <= MAX, got {value!r}")
    return bounds


def parse_size(value: str | None) -> int | None:
    """'512' (MiB), '512M', '1.5G', '800MiB' -> bytes."""
    if value is None:
        return None
    match = SIZE.match(value)
    if match is None:
        raise click.BadParameter(f"expected a size such as 512M or 2G, got {value!r}")
    number, unit = float(match[1]), (match[2] or "m").lower()
    return int(number * 1024 ** " kmgt".index(unit))


@main.command()
@click.argument("app_spec", metavar="MODULE:APP")
@click.option("-q", "--queue", "queues", multiple=True,
              help="Queue to serve (repeatable; default: every queue the app's tasks name).")
@click.option("-c", "--concurrency", default=32, show_default=True,
              help="Jobs running at once per process.")
@click.option("-p", "--processes", type=click.IntRange(min=1),
              help="Run this many worker processes under a supervisor.")
@click.option("--autoscale", metavar="MIN:MAX",
              help="Scale worker processes between MIN and MAX on the queues' signals.")
@click.option("--target-wait", default=2.0, show_default=True, type=click.FloatRange(min=0.01),
              help="Seconds a job may wait before autoscaling adds processes.")
@click.option("--cooldown", type=click.FloatRange(min=0),
              help="Seconds between scale-in steps (default: the shortest idle threshold of"
                   " the served tasks, 2-60 s).")
@click.option("--max-jobs-per-child", type=click.IntRange(min=1),
              help="Replace a worker process after it ran this many jobs.")
@click.option("--max-memory-per-child", metavar="SIZE",
              help="Replace a worker process whose memory exceeds SIZE (512M, 2G; plain: MiB).")
@click.option("--burst", is_flag=True,
              help="Exit once no job is ready (does not wait for delayed jobs or retries).")
@click.option("--grace", default=30.0, show_default=True,
              help="Seconds running jobs get to finish after SIGTERM/SIGINT.")
@click.option("--log-format", type=click.Choice(logs.FORMATS), default="text",
              show_default=True, help="Log lines on stderr: text, or one JSON object per line.")
@click.option("-v", "--verbose", count=True,
              help="A line per job that ends (-vv for debug); the same as `conveyor -v worker`.")
@click.pass_context
def worker(ctx: click.Context, app_spec: str, queues: tuple[str, ...], concurrency: int,
           processes: int | None, autoscale: str | None, target_wait: float,
           cooldown: float | None, max_jobs_per_child: int | None,
           max_memory_per_child: str | None, burst: bool, grace: float,
           log_format: str, verbose: int) -> None:
    """Consume jobs of MODULE:APP.

    SIGTERM or Ctrl-C stops fetching and lets running jobs finish within --grace; a second
    signal stops at once. Jobs still held are retried elsewhere, never lost.

    With -p, --autoscale or a per-child limit, a supervisor runs the worker processes:
    it replaces any that die, replaces one whose sync task overran its timeout (its thread
    cannot be interrupted), and with --autoscale adds processes within seconds when jobs
    wait longer than --target-wait and removes them one at a time, each after draining,
    once the served task types are idle.

    The worker logs a banner (Redis, namespace, queues, concurrency, tasks), a line per
    retry and a warning per dead job; -v adds a line per job that ends otherwise.
    """
    bounds = parse_bounds(autoscale)
    memory = parse_size(max_memory_per_child)
    verbose += ctx.meta.get(VERBOSE_KEY, 0)  # the group's -v and the command's add up
    logs.configure(verbose, log_format, worker=True)
    app = load_app(app_spec)
    logs.OUTAGES.url = app.url
    if processes is None and bounds is None and max_jobs_per_child is None and memory is None:
        app.worker(queues=list(queues) or None, concurrency=concurrency,
                   grace=grace).run(burst=burst)
        return
    from ..fleet.supervisor import Supervisor

    Supervisor(app_spec, processes=processes or 1, autoscale=bounds, target_wait=target_wait,
               cooldown=cooldown, queues=queues, concurrency=concurrency, grace=grace,
               burst=burst, max_jobs_per_child=max_jobs_per_child,
               max_memory_per_child=memory, app=app, verbose=verbose,
               log_format=log_format).run()


FLEET_COLUMNS = [Column("worker", NAME), Column("queues", NAME), Column("concurrency"),
                 Column("jobs now"), Column("processed"), Column("up (s)")]


def show_fleet(app: Conveyor, console: Console) -> None:
    """Print the live workers and the supervisors with their latest decisions."""
    from ..fleet.published import live_supervisors
    from ..worker.registry import live_workers

    now = server_now(app.redis)  # workers stamp their start by the server's clock
    workers = live_workers(app, now=now)
    if workers:
        rows = [[w.id, ",".join(w.queues), str(w.concurrency), str(w.jobs), str(w.processed),
                 "-" if w.started_at is None else f"{max(0.0, now - w.started_at):.0f}"]
                for w in workers]
        console.print(view(console, f"workers ({len(workers)} live)", FLEET_COLUMNS, rows))
    else:
        console.print("no live workers")
    for sup in live_supervisors(app):
        f = sup.fields
        bounds = f" (autoscaling {f['min']}..{f['max']})" if "min" in f else ""
        console.print(f"supervisor {sup.id}: {f.get('active', '?')} worker processes{bounds},"
                      f" {f.get('ready', '-')} ready, p95 wait {f.get('p95_wait') or '-'} s")
        for d in sup.decisions:
            stamp = time.strftime("%H:%M:%S", time.gmtime(float(d.get("at", 0))))
            console.print(f"  {stamp}Z {d.get('kind')}: {d.get('text')}", markup=False)
