"""``conveyor demo``: the main job, end to end, on a fresh machine."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click
import redis
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..urls import public_url
from .base import main

if TYPE_CHECKING:
    from ..app import Conveyor
    from ..job import Job

console = Console()
TENANTS = {"acme": 40, "globex": 25, "initech": 20, "umbrella": 10, "hooli": 5}


def _answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except redis.exceptions.RedisError:
        return False


FROM_ENV, LOCAL, PRIVATE = "$CONVEYOR_REDIS_URL", "the Redis on 127.0.0.1:6379", "private"


@contextlib.contextmanager
def redis_for_demo() -> Iterator[tuple[str, str]]:
    """$CONVEYOR_REDIS_URL, else a local Redis on 6379, else a private server for the demo;
    with where it came from (:data:`FROM_ENV`, :data:`LOCAL` or :data:`PRIVATE`)."""
    url = os.environ.get("CONVEYOR_REDIS_URL")
    if url:
        yield url, FROM_ENV
        return
    if _answers("redis://127.0.0.1:6379/0"):
        yield "redis://127.0.0.1:6379/0", LOCAL
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise click.ClickException(
            "no Redis answers on 127.0.0.1:6379 and redis-server is not installed.\n"
            "Install it (Debian/Ubuntu: sudo apt-get install -y redis-server; macOS: brew"
            " install redis) or set CONVEYOR_REDIS_URL."
        )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = tempfile.mkdtemp(prefix="conveyor-demo-")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", folder, "--save", "",
         "--appendonly", "yes"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        while not _answers(url):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise click.ClickException("the private redis-server did not start")
            time.sleep(0.05)
        yield url, PRIVATE
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 \
        else values[0]


@main.command()
@click.option("-c", "--concurrency", default=32, show_default=True,
              help="Jobs the demo's worker runs at once.")
@click.option("--scale", default=5, show_default=True, help="Multiply the number of batches.")
@click.option("--clean", is_flag=True, help="Delete the demo's keys afterwards.")
def demo(concurrency: int, scale: int, clean: bool) -> None:
    """Send a newsletter for five tenants through conveyor and report how it went.

    Uses $CONVEYOR_REDIS_URL, else Redis on 127.0.0.1:6379, else starts a private
    redis-server for the run. Some batches fail and are retried; two always fail and end in
    the dead letters; some are scheduled for later; urgent emails jump the queue.
    The jobs stay in Redis, in a namespace of their own, for the commands it prints at the
    end (--clean deletes them; a private redis-server takes them with it).
    """
    os.environ.setdefault("CONVEYOR_DEMO_NAMESPACE", f"conveyor-demo-{os.getpid()}")
    # The summary lists the dead letters; a log line for each would break the progress bar.
    logging.getLogger("conveyor.jobs").setLevel(logging.ERROR)
    with redis_for_demo() as (url, origin):
        os.environ["CONVEYOR_REDIS_URL"] = url
        from .. import demo as demo_app

        demo_app.app.url = url
        where = "a private redis-server for this run, removed at the end" \
            if origin == PRIVATE else origin
        console.print(f"Redis: [bold]{public_url(url)}[/bold] ({where}); namespace"
                      f" [bold]{demo_app.app.namespace}[/bold]", highlight=False)
        _run(demo_app, concurrency, scale)
        if clean:
            _clean_up(demo_app.app)
            console.print(f"deleted the keys of namespace {demo_app.app.namespace}")
        elif origin == PRIVATE:
            console.print("The private redis-server goes now, and the jobs with it; start"
                          " Redis on 127.0.0.1:6379 (or set CONVEYOR_REDIS_URL) to keep them.")
        else:
            _next_steps(url, demo_app.app.namespace, origin)


def _next_steps(url: str, namespace: str, origin: str) -> None:
    """What to type next: the demo's jobs are still in Redis. A URL from the environment
    is not repeated (it may hold a password, and the commands read it there too)."""
    server = '"$CONVEYOR_REDIS_URL"' if origin == FROM_ENV else shlex.quote(url)
    where = f"--namespace {shlex.quote(namespace)}"
    if origin != FROM_ENV:
        where = f"--url {server} {where}"
    console.print("The jobs stay in Redis. Look at them with:", highlight=False)
    for line in (f"conveyor info {where}", f"conveyor stats {where}",
                 f"conveyor dead list newsletter {where}", f"conveyor top {where}",
                 f"conveyor dashboard {where}"):
        console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)
    console.print("and delete them with:", highlight=False)
    console.print(f"  redis-cli -u {server} --scan --pattern '*{namespace}*'"
                  f" | xargs redis-cli -u {server} del",
                  highlight=False, markup=False, soft_wrap=True)


def _run(d: object, concurrency: int, scale: int) -> None:
    from .. import demo as demo_app

    app = demo_app.app
    jobs: list[Job[Any]] = []
    started = time.monotonic()
    handles = []
    for tenant, batches in TENANTS.items():
        # One workflow per tenant: its batches, then a report once all of them ended.
        n = batches * scale
        wf = app.workflow()
        send = demo_app.send_batch.options(tenant=tenant)
        later = send.options(delay=1.5)
        sends = [wf.add(send, tenant, b, 100 + (b * 37) % 400) for b in range(n)]
        sends += [wf.add(later, tenant, 1000 + b, 50) for b in range(max(1, n // 10))]
        wf.add(demo_app.report, tenant, wf.id, name="report", after=sends, run_if="finished")
        handles.append(wf.enqueue())
        jobs += [app.job(node.id) for node in wf.nodes]
    jobs += demo_app.send_transactional.options(priority=9).enqueue_many(
        [(uid, "password-reset") for uid in range(20)])
    console.print(f"enqueued [bold]{len(jobs)}[/bold] jobs for {len(TENANTS)} tenants"
                  " (one workflow each: batches, some delayed by 1.5 s, then a report;"
                  " and 20 urgent emails at priority 9)")
    worker = app.worker(queues=["newsletter"], concurrency=concurrency)
    thread = threading.Thread(target=worker.run, kwargs={"burst": False}, daemon=True)
    thread.start()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
                  console=console) as progress:
        bar = progress.add_task("jobs finished", total=len(jobs), detail="")
        while True:
            b = app.monitor.backlog("newsletter")
            running = [h for h in handles if h.info().state == "running"]
            left = b.ready + b.scheduled + b.active + len(running)
            progress.update(bar, completed=len(jobs) - left,
                            detail=f"ready {b.ready} · scheduled {b.scheduled} · "
                                   f"active {b.active} · dead {b.dead}")
            if left == 0:
                break
            time.sleep(0.1)
    elapsed = time.monotonic() - started
    worker.stop()
    thread.join(30)
    _summary(app, jobs, elapsed)
    _reports(handles)


def _reports(handles: list) -> None:  # type: ignore[type-arg]
    """Each tenant's report, the completion job of its workflow."""
    table = Table("tenant", "batches", "sent", "failed batches", "report ran after",
                  title="newsletter reports (one per tenant, after all its batches)")
    for handle in handles:
        info = handle.info()
        node = info.nodes["report"]
        last = max(i.finished_at or 0 for name, i in info.nodes.items() if name != "report")
        r = node.result or {}
        after = "-" if node.started_at is None else f"{(node.started_at - last) * 1000:.1f} ms"
        table.add_row(str(r.get("tenant", "?")), str(r.get("batches", "?")),
                      str(r.get("sent", "?")), str(r.get("failed", "?")), after)
    console.print(table)


def _clean_up(app: Conveyor) -> None:
    """Remove the demo's keys (its own namespace)."""
    redis_client = app.redis
    pattern = "*" + app.namespace + "*"
    batch = []
    for key in redis_client.scan_iter(match=pattern, count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            redis_client.delete(*batch)
            batch.clear()
    if batch:
        redis_client.delete(*batch)


def _summary(app: object, jobs: list, elapsed: float) -> None:  # type: ignore[type-arg]
    from .. import demo as demo_app

    infos = [j.info() for j in jobs]
    ok = [i for i in infos if i.state.value == "succeeded"]
    waits = [i.wait_time for i in ok if i.wait_time is not None]
    runs = [i.run_time for i in ok if i.run_time is not None]
    retried = sum(1 for i in infos if i.attempts > 1)
    table = Table(title="conveyor demo", show_header=False)
    table.add_row("jobs", str(len(infos)))
    table.add_row("succeeded", str(len(ok)))
    table.add_row("retried (succeeded later or dead)", str(retried))
    table.add_row("throughput", f"{len(infos) / elapsed:.0f} jobs/s over {elapsed:.2f} s")
    for label, values in (("wait", waits), ("run", runs)):
        table.add_row(f"{label} p50 / p95 / p99", " / ".join(
            f"{_pct(values, q) * 1000:.1f} ms" for q in (50, 95, 99)))
    console.print(table)
    dead = demo_app.app.dead_letters("newsletter").list(limit=10)
    dead_table = Table(title=f"dead letters ({len(dead)})")
    dead_table.add_column("tenant", no_wrap=True)
    dead_table.add_column("attempts", justify="right")
    dead_table.add_column("reason", ratio=1)
    for d in dead:
        dead_table.add_row(d.tenant or "", str(d.attempts), (d.error or "").splitlines()[0])
    console.print(dead_table)
    urgent = [i for i in infos if i.priority == 9 and i.wait_time is not None]
    if urgent:
        console.print(f"urgent emails waited at most {max(i.wait_time for i in urgent) * 1000:.1f}"
                      " ms behind the newsletter backlog (priority 9)")
