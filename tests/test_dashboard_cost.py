"""What the dashboard's overview costs Redis, counted by the server (``INFO
commandstats`` after ``CONFIG RESETSTAT`` on the test's private redis-server) and by the
client's sends (round trips), for 1, 3 and 20 queues with jobs in every state and metric
buckets over the whole sparkline window."""

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
from conveyor.web import create_app, figures
from helpers import RedisServer, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.dashboard_cost import HOLDERS, activity, cost, make_app

pytestmark = pytest.mark.xdist_group("dashboard_cost")


@pytest.mark.parametrize("queues", [1, 3, 20])
def test_overview_poll_is_bounded(make_server: type[RedisServer], queues: int) -> None:
    server = make_server().start()  # private: nothing else counted
    if True:
        app = make_app(server.url, f"cost-{uuid.uuid4().hex[:6]}", queues)
        activity(app, queues)
        client = redis.Redis.from_url(server.url)
        data: dict[str, Any] = {}

        def poll() -> None:
            data.update(figures.overview(app))

        _, first_trips = cost(client, poll)
        assert first_trips <= 3
        for row in data["queues"]:  # every state is there, and buckets over the window
            assert (row["ready"], row["scheduled"], row["active"], row["dead"]) == \
                (4, 3, HOLDERS, 2), row
            points = row["spark"]["processed"]
            assert len(points) >= 30 and sum(1 for v in points if v) >= len(points) - 2
            assert row["wait_p95"] is not None and row["throughput"] > 0
        commands, trips = cost(client, poll)
        assert trips <= 3 and commands <= 10 * queues, (commands, trips)
        assert [r["spark"] for r in data["queues"]] == \
            [r["spark"] for r in figures.overview(app)["queues"]]
        app.close()


def test_many_dashboards_cost_one(make_server: type[RedisServer]) -> None:
    server = make_server().start()
    if True:
        app = make_app(server.url, f"cost-{uuid.uuid4().hex[:6]}", 3)
        activity(app, 3)
        client = redis.Redis.from_url(server.url)
        lone = TestClient(create_app(app, cache_seconds=0))
        lone.get("/api/overview")  # the closed buckets are now kept
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
    for _ in range(5):  # the kept buckets missed nothing written after they were read
        kept = app.monitor.overview()
        fresh = Monitor(app).overview()
        if kept.now // width == fresh.now // width:
            break
    assert kept.queues[0].spark == fresh.queues[0].spark
    assert kept.queues[0].stats.succeeded == fresh.queues[0].stats.succeeded > 0
    app.close()
