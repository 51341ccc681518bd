"""What one poll of the dashboard's overview costs Redis: ``python -m bench.dashboard_cost``.

On a private redis-server, 1, 3 and 20 queues each get jobs in every state (ready,
scheduled, active, dead, succeeded) from real scripts and a real worker process (killed
while it holds its leases, so nothing else talks to Redis during the measurement) and
metric buckets over the last hour (the bucket the scripts wrote, copied to every earlier
start). Then each overview poll is counted: commands from ``INFO commandstats`` after
``CONFIG RESETSTAT`` (its own INFO left out), round trips as the client's sends. The
first poll (a fresh reader) sums each queue's stats window in Redis; its sparklines fill
in over the next polls (``fill``: polls until every chart is whole, ``fill max``: the
dearest of them); ``steady`` is a poll after that, which reads only the open buckets.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

import conveyor
from bench.curves import private_redis

ROOT = Path(__file__).resolve().parent.parent
HOLDERS = 2  # active jobs per queue


def make_app(url: str | None = None, namespace: str | None = None,
             queues: int | None = None) -> conveyor.Conveyor:
    """The app: per queue ``q<i>``, a task that succeeds, one that fails for good and one
    that holds its lease (sleeps for an hour)."""
    app = conveyor.Conveyor(url or os.environ.get("CONVEYOR_REDIS_URL"),
                            namespace=namespace or os.environ.get("COST_NAMESPACE", "cost"))
    for i in range(queues if queues is not None else int(os.environ.get("COST_QUEUES", "1"))):
        register(app, f"q{i}")
    return app


def register(app: conveyor.Conveyor, queue: str) -> None:
    @app.task(name=f"{queue}.ok", queue=queue)
    def ok(n: int) -> int:
        return n

    @app.task(name=f"{queue}.bad", queue=queue, retries=0)
    def bad(n: int) -> None:
        raise RuntimeError(f"failed on purpose: {n}")

    @app.task(name=f"{queue}.hold", queue=queue, visibility_timeout=3600)
    def hold(n: int) -> None:
        time.sleep(3600)


app = make_app()


def activity(app: conveyor.Conveyor, queues: int) -> None:
    """Jobs in every state in each queue, and buckets over the last hour."""
    from conveyor import testing

    names = [f"q{i}" for i in range(queues)]
    for q in names:
        app.tasks[f"{q}.ok"].enqueue_many([(n,) for n in range(5)])
        app.tasks[f"{q}.bad"].enqueue_many([(1,), (2,)])
    testing.drain(app, queues=names)
    for q in names:
        app.tasks[f"{q}.hold"].enqueue_many([(n,) for n in range(HOLDERS)])
    env = os.environ | {"CONVEYOR_REDIS_URL": app.url, "COST_NAMESPACE": app.namespace,
                        "COST_QUEUES": str(queues),
                        "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    worker = subprocess.Popen([sys.executable, "-m", "conveyor", "worker",
                               "bench.dashboard_cost:app", "-c", str(HOLDERS * queues)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while sum(app.monitor.backlog(q).active for q in names) < HOLDERS * queues:
            if time.monotonic() > deadline:
                raise RuntimeError("the worker never leased the holding jobs")
            time.sleep(0.05)
    finally:
        os.kill(worker.pid, signal.SIGKILL)  # its leases stand: active until they expire
        worker.wait(10)
    for q in names:  # its registrations as an idle waiter would take the jobs below
        app.redis.delete(app.keys(q).waiters, app.keys(q).waiter_offers)
    for q in names:
        app.tasks[f"{q}.ok"].options(delay=3600).enqueue_many([(n,) for n in range(3)])
        app.tasks[f"{q}.ok"].enqueue_many([(n,) for n in range(4)])
    spread_buckets(app, names)


def spread_buckets(app: conveyor.Conveyor, queues: list[str], seconds: int = 3600) -> None:
    """Copy each queue's newest bucket to every start of the last ``seconds`` (whatever
    type the scripts write buckets as, so that versions compare)."""
    width = app.limits.bucket_seconds
    sec, _ = app.redis.time()
    now = int(sec) // width * width
    for q in queues:
        k = app.keys(q)
        # The activity above may straddle a bucket boundary (its jobs finished in one
        # bucket, the last enqueues landed in the next): the template sums the last three
        # minutes (the activity, its worker's start included, takes at most about one).
        recent = [k.metrics(start) for start in range(now - 180, now + width, width)
                  if app.redis.exists(k.metrics(start))]
        zset = bool(recent) and app.redis.type(recent[-1]) == b"zset"
        fields: dict[Any, Any] = {}
        for bucket in recent:
            part = dict(app.redis.zrange(bucket, 0, -1, withscores=True)) if zset \
                else app.redis.hgetall(bucket)
            for name, value in part.items():
                fields[name] = float(fields.get(name, 0)) + float(value)
        if not zset:  # a hash's counters are integers; its sums ('wsum', 'rsum') are not
            fields = {n: (int(v) if float(v).is_integer() else v) for n, v in fields.items()}
        with app.redis.pipeline(transaction=False) as pipe:
            for start in range(now - seconds, now, width):
                if zset:
                    pipe.zadd(k.metrics(start), fields)
                else:
                    pipe.hset(k.metrics(start), mapping=fields)
            pipe.execute()


@contextlib.contextmanager
def counting_sends() -> Iterator[list[int]]:
    """Count the client's sends to Redis (one per round trip) while the block runs."""
    from redis.connection import AbstractConnection

    sent = [0]
    original = AbstractConnection.send_packed_command

    def send(self: Any, command: Any, check_health: bool = True) -> None:
        sent[0] += 1
        original(self, command, check_health)

    AbstractConnection.send_packed_command = send  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        AbstractConnection.send_packed_command = original  # type: ignore[method-assign]


def cost(client: redis.Redis, poll: Callable[[], Any]) -> tuple[int, int]:
    """(commands, round trips) of one ``poll()``."""
    client.config_resetstat()
    with counting_sends() as sent:
        poll()
    stats = client.info("commandstats")
    commands = sum(int(v["calls"]) for name, v in stats.items()
                   if not name.startswith(("cmdstat_config", "cmdstat_info")))
    return commands, sent[0]


def polls(app: conveyor.Conveyor, client: redis.Redis, most: int = 1000) -> dict[str, Any]:
    """Poll as a fresh dashboard does: the first poll, the polls until every sparkline is
    whole (at most ``most``), then one steady poll; the cost of each."""
    from conveyor.web import figures

    seen: list[dict[str, Any]] = []

    def poll() -> None:
        seen.append(figures.overview(app))

    first = cost(client, poll)
    filling = []
    while any(q["spark"]["read"] < 1 for q in seen[-1]["queues"]) and len(filling) < most:
        filling.append(cost(client, poll))
    return {"first": first, "fill": filling, "steady": cost(client, poll)}


def measure(queue_counts: tuple[int, ...] = (1, 3, 20)) -> list[dict[str, Any]]:
    rows = []
    for n in queue_counts:
        with private_redis() as url:
            app = make_app(url, f"cost-{uuid.uuid4().hex[:6]}", n)
            activity(app, n)
            rows.append({"queues": n} | polls(app, redis.Redis.from_url(url)))
            app.close()
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| queues | first poll: commands (per queue), round trips "
             "| polls until the charts are whole: count, dearest (per queue) "
             "| steady poll: commands (per queue), round trips |", "|---|---|---|---|"]
    for r in rows:
        (c1, t1), (c2, t2), n = r["first"], r["steady"], r["queues"]
        fill = r["fill"]
        dearest = max((c for c, _ in fill), default=0)
        lines.append(f"| {n} | {c1:,} ({c1 / n:.1f}), {t1} "
                     f"| {len(fill)}, {dearest:,} ({dearest / n:.1f}) "
                     f"| {c2:,} ({c2 / n:.1f}), {t2} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(measure()))
