"""Monitoring commands: ``stats``, ``advice``, ``sink``, ``report``, ``metrics`` (``top`` is in
:mod:`.top`)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import time
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console, RenderableType
from rich.table import Table

from ..app import Conveyor
from ..clock import server_now
from ..monitor import Stats
from ..monitor.advice import duration
from .base import app_options, known_queue, main
from .layout import NAME, Column, seconds, view

console = Console()


def ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def plain(value: Any) -> Any:
    """JSON-safe: dataclasses to dicts, infinities to null."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


STATS_COLUMNS = [Column("queue", NAME), Column("task", NAME), Column("enqueued"),
                 Column("succeeded"), Column("failed"), Column("dead"), Column("expired"),
                 Column("jobs/s"),
                 Column("wait p50 (s)"), Column("wait p95 (s)"), Column("wait p99 (s)"),
                 Column("run p50 (s)"), Column("run p95 (s)"), Column("run p99 (s)")]


def stats_view(rows: list[Stats], title: str) -> RenderableType:
    cells = [[s.queue or "(all queues)", s.task or "(all tasks)", str(s.enqueued), str(s.succeeded),
              str(s.failed), str(s.dead), str(s.expired), f"{s.throughput:.2f}",
              seconds(s.wait.p50),
              seconds(s.wait.p95), seconds(s.wait.p99), seconds(s.run.p50),
              seconds(s.run.p95), seconds(s.run.p99)] for s in rows]
    return view(console, title, STATS_COLUMNS, cells)


BACKLOG_COLUMNS = [Column("queue", NAME), Column("ready"), Column("held"),
                   Column("scheduled"), Column("active"), Column("suspended"), Column("dead")]


def backlog_view(app: Conveyor, queues: list[str], by_shard: bool = False) -> RenderableType:
    """The backlog of ``queues``: a sharded queue's summed, or each shard's."""
    rows = []
    for queue, state in app.monitor.queue_states(queues, shards=by_shard).items():
        b = state.backlog
        rows.append([queue, str(b.ready), str(b.held), str(b.scheduled), str(b.active),
                     str(b.suspended), str(b.dead)])
    return view(console, "backlog (jobs)", BACKLOG_COLUMNS, rows)


@main.command()
@click.option("-q", "--queue", help="Only this queue.")
@click.option("-t", "--task", help="Only this task type.")
@click.option("-w", "--window", default=300.0, show_default=True, help="Seconds to look back.")
@click.option("--shards", "by_shard", is_flag=True,
              help="One row per shard of a sharded queue (default: its shards summed).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@app_options
def stats(app: Conveyor, queue: str | None, task: str | None, window: float, by_shard: bool,
          as_json: bool) -> None:
    """Throughput, failures and wait/run percentiles per task type over a window.

    A sharded queue shows once, its figures summed over its shards (its percentiles from
    their histograms merged); --shards shows each shard apart, and a shard's own name
    (QUEUE~N) given to --queue that shard alone."""
    if queue is not None:
        known_queue(app, queue)
    queues = [queue] if queue else app.monitor.queue_names()
    rows = [s for s in app.monitor.stats_by_task(queue, window, shards=by_shard)
            if task in (None, s.task)]
    total = app.monitor.stats(task=task, queue=queue, window=window)
    if as_json:
        click.echo(json.dumps({"total": plain(total), "tasks": plain(rows)}, indent=2))
        return
    console.print(stats_view([*rows, total], f"last {duration(window)}"))
    console.print(backlog_view(app, queues, by_shard))
    held = held_rows(app, queues)
    if held:
        console.print(view(console, "held by limits (jobs)", HELD_COLUMNS, held))


HELD_COLUMNS = [Column("queue", NAME), Column("tenant", NAME), Column("held"),
                Column("running")]


def held_rows(app: Conveyor, queues: list[str], most: int = 20) -> list[list[str]]:
    """Ready jobs that limits hold back, per queue and tenant (largest first)."""
    rows = []
    for queue in queues:
        flow = app.monitor.flow(queue)
        if not (flow.held or flow.paused or flow.blocked_by):
            continue
        if flow.blocked_by:
            rows.append([queue, f"(all: the queue's {flow.blocked_by})", str(flow.held),
                         str(flow.running)])
        tenants = sorted(flow.held_by_tenant.items(), key=lambda i: -i[1])[:most]
        for tenant, n in tenants:
            rows.append([queue, tenant, str(n), str(flow.running_by_tenant.get(tenant, 0))])
    return rows


def parse_deadline(text: str | None, clock: Callable[[], float] = time.time) -> float | None:
    """``+30m`` / ``+2h`` from now, epoch seconds, or an ISO date-time (UTC if naive).

    :param clock: reads "now" for a relative deadline (the advice compares the deadline
        with the server's clock, so the command passes that)
    """
    if not text:
        return None
    if text.startswith("+"):
        from ..sink.report import parse_since

        now = clock()
        return now + (now - parse_since(text[1:], now))
    try:
        return float(text)
    except ValueError:
        pass
    when = dt.datetime.fromisoformat(text)
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()


@main.command()
@click.argument("queue")
@click.option("--target-wait", default=10.0, show_default=True,
              help="Seconds a job should wait at most before it starts.")
@click.option("--deadline", help="When all pending jobs must be done: +30m, ISO time, epoch.")
@click.option("-w", "--window", default=60.0, show_default=True, help="Rates over (s).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (for autoscalers).")
@app_options
def advice(app: Conveyor, queue: str, target_wait: float, deadline: str | None, window: float,
           as_json: bool) -> None:
    """How many workers QUEUE needs, how long its backlog takes to drain, and why."""
    known_queue(app, queue)
    try:
        due = parse_deadline(deadline, lambda: server_now(app.redis))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--deadline") from exc
    result = app.monitor.advice(queue, target_wait=target_wait, deadline=due, window=window)
    if as_json:
        click.echo(json.dumps(plain(result), indent=2))
        return
    eta = "unknown" if result.eta_seconds is None else duration(result.eta_seconds)
    console.print(f"[bold]{queue}[/bold]: {result.workers_needed} worker(s) needed "
                  f"(at concurrency {result.concurrency}); backlog drains in {eta}")
    for reason in result.reasons:
        console.print(f"  • {reason}")


@main.command()
@click.option("--db", default="sqlite:///conveyor-jobs.db", show_default=True,
              help="SQLAlchemy URL, e.g. postgresql+psycopg://user@host/db")
@click.option("-q", "--queue", "queues", multiple=True, help="Queue (default: all, as seen).")
@click.option("--table", default="conveyor_jobs", show_default=True, help="Table to write.")
@click.option("--batch", default=500, show_default=True, help="Events per transaction.")
@click.option("--consumer", help="Name in the consumer group (default host:pid).")
@click.option("--until-idle", is_flag=True, help="Exit once every stream is written.")
@app_options
def sink(app: Conveyor, db: str, queues: tuple[str, ...], table: str, batch: int,
         consumer: str | None, until_idle: bool) -> None:
    """Copy finished jobs from the events streams into SQL (runs until stopped)."""
    import signal

    from ..sink import Sink

    runner = Sink(app, db, queues=list(queues) or None, table=table, batch=batch,
                  consumer=consumer)
    signal.signal(signal.SIGTERM, lambda *_: runner.stop())
    try:
        written = runner.run(until_idle=until_idle)
    except KeyboardInterrupt:
        written = runner.written
    finally:
        runner.close()
    click.echo(f"wrote {written} job(s) to {table}")


@main.command()
@click.option("--db", default="sqlite:///conveyor-jobs.db", show_default=True,
              help="SQLAlchemy URL of the sink's database.")
@click.option("--table", default="conveyor_jobs", show_default=True,
              help="Table the sink writes.")
@click.option("--since", help="Only jobs finished since: 7d, 24h, 30m, or an ISO date.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def report(db: str, table: str, since: str | None, as_json: bool) -> None:
    """Jobs, mean and p95 wait and run per task type, from the sink's database."""
    import sqlalchemy as sa

    from ..sink import make_engine
    from ..sink.report import parse_since
    from ..sink.report import report as build_report
    from ..sink.schema import jobs_table

    try:
        start = parse_since(since, time.time()) if since else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from exc
    engine = make_engine(db)
    try:
        rows = build_report(engine, jobs_table(sa.MetaData(), table), start)
    except sa.exc.DBAPIError as exc:
        raise click.ClickException(f"cannot read {table}: {str(exc).splitlines()[0]}") from exc
    finally:
        engine.dispose()
    if as_json:
        click.echo(json.dumps(plain(rows), indent=2))
        return
    out = Table("task", "jobs", "succeeded", "dead", "retries", "wait mean", "wait p95",
                "run mean", "run p95", title=f"since {since}" if since else "all time")
    for r in rows:
        out.add_row(r.task, str(r.jobs), str(r.succeeded), str(r.dead), str(r.retries),
                    ms(r.wait_mean), ms(r.wait_p95), ms(r.run_mean), ms(r.run_p95))
    console.print(out)


@main.command()
@click.option("-p", "--port", default=9808, show_default=True, help="Port to listen on.")
@click.option("--addr", default="127.0.0.1", show_default=True,
              help="Address to bind (loopback, like the dashboard; 0.0.0.0 for every"
                   " interface, for a Prometheus on another host).")
@click.option("-q", "--queue", "queues", multiple=True, help="Queue (default: all, as seen).")
@click.option("--shards", "by_shard", is_flag=True,
              help="Report each shard of a sharded queue apart (default: summed).")
@app_options
def metrics(app: Conveyor, port: int, addr: str, queues: tuple[str, ...],
            by_shard: bool) -> None:
    """Serve Prometheus metrics on http://ADDR:PORT/metrics, read from Redis per scrape.

    A sharded queue is reported under its own name, summed over its shards (--shards: each
    shard apart, under its own name)."""
    from ..monitor.prometheus import serve

    serve(app, port, addr, list(queues) or None, by_shard)
    click.echo(f"serving metrics on http://{addr}:{port}/metrics", err=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
