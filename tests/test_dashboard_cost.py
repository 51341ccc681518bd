"""What the dashboard's overview costs Redis, counted by the server (``INFO
commandstats`` after ``CONFIG RESETSTAT`` on the test's private redis-server) and by the
client's sends (round trips), for 1, 3 and 20 queues with jobs in every state and an hour
of metric buckets: every poll, the first one of a fresh dashboard included, stays within
3 round trips and 10 commands per queue shown, and shows exact figures from the first."""

from __future__ import annotations

import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient

from conveyor import testing
from conveyor.clock import server_now
from conveyor.monitor import Monitor
from conveyor.monitor.stats import bucket_starts
from conveyor.web import create_app, figures
from helpers import RedisServer, wait_until, within_one_bucket

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.dashboard_cost import HOLDERS, activity, cost, make_app

pytestmark = pytest.mark.xdist_group("dashboard_cost")


def fill_charts(app: Any, client: redis.Redis, queues: int, most: int = 200
                ) -> list[tuple[int, int]]:
    """Poll until every sparkline is whole; the cost of each poll."""
    seen = []
    while any(q.spark_read < 1 for q in app.monitor.overview().queues):
        assert len(seen) < most, "the sparklines never filled in"
        seen.append(cost(client, lambda: figures.overview(app)))
    return seen


@pytest.mark.parametrize("queues", [1, 3, 20])
def test_overview_poll_is_bounded(make_server: type[RedisServer], queues: int) -> None:
    server = make_server().start()  # private: nothing else counted
    app = make_app(server.url, f"cost-{uuid.uuid4().hex[:6]}", queues)
    activity(app, queues)
    client = redis.Redis.from_url(server.url)
    data: dict[str, Any] = {}
    seen: list[Any] = []

    def first_poll() -> dict[str, Any]:
        app.monitor._cache = None  # a fresh dashboard
        seen[:] = []
        commands, trips = cost(client, lambda: seen.append(
            app.monitor.overview(figures.SPARK_WINDOW, 60)))  # what figures.overview reads
        return {"cost": (commands, trips),
                "minute": {q: Monitor(app).stats(queue=q, window=60) for q in app.queues()}}

    first = within_one_bucket(app, first_poll)
    commands, trips = first["cost"]
    assert trips <= 3 and commands <= 10 * queues, (commands, trips)
    for row in seen[0].queues:  # every state, and the figures exact from the first poll
        b, stats, minute = row.backlog, row.stats, first["minute"][row.name]
        assert (b.ready, b.scheduled, b.active, b.dead) == (4, 3, HOLDERS, 2), row
        assert (stats.succeeded, stats.dead, stats.enqueued, stats.wait, stats.run) == \
            (minute.succeeded, minute.dead, minute.enqueued, minute.wait, minute.run)
        assert stats.succeeded > 0 and stats.wait.p95 is not None
        assert stats.throughput == (minute.succeeded + minute.dead) / stats.span
    filling = fill_charts(app, client, queues)
    assert filling and max(c for c, _ in filling) <= 10 * queues, filling
    assert max(t for _, t in filling) <= 3, filling
    commands, trips = cost(client, lambda: data.update(figures.overview(app)))
    assert trips <= 3 and commands <= 10 * queues, (commands, trips)
    for row in data["queues"]:  # the charts are whole: buckets over the window
        points = row["spark"]["processed"]
        assert row["spark"]["read"] == 1
        assert len(points) >= 30 and sum(1 for v in points if v) >= len(points) - 2

    def charts() -> tuple[list[Any], list[Any]]:
        kept = [q.spark for q in app.monitor.overview().queues]
        return kept, [Monitor(app).series(q.name, 600, points=60) for q in
                      app.monitor.overview().queues]

    kept, fresh = within_one_bucket(app, charts)
    assert kept == fresh  # the chart filled in over polls is the one read at once
    app.close()


def test_first_poll_is_bounded_whatever_the_activity(make_server: type[RedisServer]) -> None:
    """A thousand tenants per queue, hundreds of dead letters, task types by the dozen
    and a day of metric buckets cost the first poll no more than an idle queue's."""
    server = make_server().start()
    app = make_app(server.url, f"cost-{uuid.uuid4().hex[:6]}", 3)
    activity(app, 3)
    for q in ("q0", "q1"):
        app.tasks[f"{q}.bad"].enqueue_many([(n,) for n in range(300)])
    testing.drain(app, queues=["q0", "q1"])
    for q in ("q0", "q1", "q2"):
        for t in range(1000):
            app.tasks[f"{q}.ok"].options(tenant=f"t{t}").enqueue_many([(1,), (2,)])
        with app.redis.pipeline(transaction=False) as pipe:  # task types by the dozen
            k = app.keys(q)
            for start in bucket_starts(server_now(app.redis), 86_400,
                                       app.limits.bucket_seconds)[:-1]:
                pipe.zadd(k.metrics(start), {f"{q}.kind{n}|{what}": 3 for n in range(30)
                                             for what in ("succeeded", "w|90", "r|120")})
            pipe.execute()
    client = redis.Redis.from_url(server.url)
    data: dict[str, Any] = {}
    commands, trips = cost(client, lambda: data.update(figures.overview(app)))
    assert trips <= 3 and commands <= 30, (commands, trips)
    assert [r["dead"] for r in data["queues"]] == [302, 302, 2]
    assert [r["ready"] for r in data["queues"]] == [2000, 2000, 2004]
    assert all(r["wait_p95"] is not None for r in data["queues"])
    filling = fill_charts(app, client, 3)
    assert max(c for c, _ in filling) <= 30 and max(t for _, t in filling) <= 3, filling
    app.close()


def test_many_dashboards_cost_one(make_server: type[RedisServer]) -> None:
    server = make_server().start()
    if True:
        app = make_app(server.url, f"cost-{uuid.uuid4().hex[:6]}", 3)
        activity(app, 3)
        client = redis.Redis.from_url(server.url)
        lone = TestClient(create_app(app, cache_seconds=0))
        fill_charts(app, client, 3)  # the closed buckets are now kept
        one, _ = cost(client, lambda: lone.get("/api/overview"))
        web = TestClient(create_app(app, cache_seconds=30))
        web.get("/api/overview")
        answers: list[bytes] = []

        def dashboards() -> None:
            def tab() -> None:
                answers.append(web.get("/api/overview").content)
                assert web.get("/").status_code == 200

            tabs = [threading.Thread(target=tab) for _ in range(10)]
            for t in tabs:
                t.start()
            for t in tabs:
                t.join(30)

        shared, _ = cost(client, dashboards)
        assert len(answers) == 10 and len(set(answers)) == 1
        assert shared <= one, (shared, one)
        quick = TestClient(create_app(app, cache_seconds=0.2))
        before = quick.get("/api/overview").json()["time"]
        wait_until(lambda: quick.get("/api/overview").json()["time"] > before, 10,
                   message="a fresh answer once the shared one expired")
        app.close()


def test_every_poll_stays_within_budget(make_server: type[RedisServer]) -> None:
    """Polls across bucket boundaries and the periodic re-reads of the queue set and the
    worker registry, with jobs still finishing: none costs more than 10 commands."""
    server = make_server().start()
    app = make_app(server.url, f"cost-{uuid.uuid4().hex[:6]}", 1)
    activity(app, 1)
    client = redis.Redis.from_url(server.url)
    figures.overview(app)
    width = app.limits.bucket_seconds
    first = server_now(app.redis) // width
    seen: list[tuple[int, int]] = []
    while server_now(app.redis) // width < first + 2 and len(seen) < 200:
        app.tasks["q0.ok"].enqueue(1)  # a job ready, then run: the open bucket changes
        testing.drain(app, queues=["q0"])
        seen.append(cost(client, lambda: figures.overview(app)))
        threading.Event().wait(0.3)  # polls spread over two bucket boundaries
    assert len(seen) >= 10
    assert max(c for c, _ in seen) <= 10 and max(t for _, t in seen) <= 3, seen
    fill_charts(app, client, 1)
    for _ in range(5):  # the kept buckets missed nothing written after they were read
        kept = app.monitor.overview()
        fresh = Monitor(app).overview()
        chart = Monitor(app).series("q0", 600, points=60)
        if kept.now // width == fresh.now // width == server_now(app.redis) // width:
            break
    assert kept.queues[0].spark == chart
    assert kept.queues[0].stats.succeeded == fresh.queues[0].stats.succeeded > 0
    assert kept.queues[0].stats.wait == fresh.queues[0].stats.wait
    app.close()
