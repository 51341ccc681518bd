"""``conveyor top``: a live view of the backlog and of every task type.

It redraws every ``--interval`` seconds, in the layout that fits the terminal (see
:mod:`.layout`), cropped to its height. ``q`` (or Ctrl-C) quits: on a terminal, keys are
read without waiting for Enter, and the wait between frames is the wait for a key.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import select
import sys
from collections.abc import Iterator
from typing import Any

import click
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from ..app import Conveyor
from ..clock import server_now
from ..monitor.advice import duration
from .base import app_options, main
from .layout import NAME, Column, seconds, view
from .observe import backlog_view, plain

console = Console()
TASK_COLUMNS = [Column("queue", NAME), Column("task", NAME), Column("active"),
                Column("idle"), Column("last finished"), Column("jobs/s"),
                Column("wait p95 (s)"), Column("run p95 (s)"), Column("failed")]


def task_rows(app: Conveyor, window: float) -> list[dict[str, Any]]:
    """Each task type now: activity, and its figures over ``window``."""
    per_task = {(s.queue, s.task): s for s in app.monitor.stats_by_task(window=window)}
    now = server_now(app.redis)  # idle_since is the server's clock
    rows = []
    for row in app.monitor.activity():
        s = per_task.get((row.queue, row.task))
        rows.append({"queue": row.queue, "task": row.task, "active": row.active,
                     "idle": row.idle,
                     "last_finished_ago": None if row.idle_since is None
                     else max(0.0, now - row.idle_since),
                     "throughput": s.throughput if s else None,
                     "wait_p95": s.wait.p95 if s else None,
                     "run_p95": s.run.p95 if s else None,
                     "failed": s.failed if s else None})
    return rows


def top_view(app: Conveyor, window: float, by_shard: bool = False) -> Group:
    """One frame of ``conveyor top``."""
    cells = []
    for r in task_rows(app, window):
        ago = r["last_finished_ago"]
        cells.append([r["queue"], r["task"], str(r["active"]), "idle" if r["idle"] else "-",
                      "never" if ago is None else f"{duration(ago)} ago",
                      "-" if r["throughput"] is None else f"{r['throughput']:.2f}",
                      seconds(r["wait_p95"]), seconds(r["run_p95"]),
                      "-" if r["failed"] is None else str(r["failed"])])
    workers = app.monitor.workers()
    stamp = dt.datetime.now(dt.UTC).strftime("%H:%M:%S")
    header = Text(f"conveyor top · {app.namespace} · {len(workers)} worker(s) · {stamp} UTC"
                  " · q quits", overflow="ellipsis", no_wrap=True)
    return Group(header, backlog_view(app, app.monitor.queue_names(), by_shard),
                 view(console, f"task types (last {duration(window)})", TASK_COLUMNS, cells))


@contextlib.contextmanager
def keys() -> Iterator[bool]:
    """Read keys one at a time while inside (True when stdin is a terminal)."""
    if not sys.stdin.isatty():
        yield False
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def quit_pressed(timeout: float, reading: bool) -> bool:
    """Wait up to ``timeout`` seconds for a key; True if it was ``q``."""
    if not reading:
        select.select([], [], [], timeout)
        return False
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    return bool(ready) and sys.stdin.read(1).lower() == "q"


@main.command()
@click.option("-i", "--interval", default=1.0, show_default=True, help="Seconds per refresh.")
@click.option("-w", "--window", default=60.0, show_default=True, help="Stats window (s).")
@click.option("-n", "--iterations", default=0, help="Stop after N frames (0: until q).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one frame as JSON (backlog per queue, task types) and exit.")
@click.option("--shards", "by_shard", is_flag=True,
              help="Backlog of each shard of a sharded queue (default: its shards summed).")
@app_options
def top(app: Conveyor, interval: float, window: float, iterations: int, as_json: bool,
        by_shard: bool) -> None:
    """Live view: backlog, active and idle task types, throughput, waits and runs.
    q or Ctrl-C quits. A sharded queue shows once, its figures summed over its shards."""
    if as_json:
        backlog = {q: plain(s.backlog)
                   for q, s in app.monitor.queue_states(shards=by_shard).items()}
        click.echo(json.dumps({"backlog": backlog, "tasks": plain(task_rows(app, window))},
                              indent=2))
        return
    frames = 0
    with keys() as reading, Live(top_view(app, window, by_shard), console=console,
                                 auto_refresh=False, screen=reading,
                                 vertical_overflow="crop") as live:
        try:
            while True:
                frames += 1
                if iterations and frames >= iterations:
                    break
                if quit_pressed(interval, reading):
                    break
                live.update(top_view(app, window, by_shard), refresh=True)
        except KeyboardInterrupt:
            pass
