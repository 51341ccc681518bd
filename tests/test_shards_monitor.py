"""A sharded queue seen by the monitor, the dead letters, the exporter, the CLI and the
dashboard: once, its figures summed over its shards, and each shard on request; against a
private redis-server with a real worker."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import conveyor
from conveyor.monitor import shards as sharded
from conveyor.monitor.histogram import Histogram
from conveyor.monitor.prometheus import RedisCollector
from conveyor.monitor.stats import bucket_starts, read_windows
from conveyor.web.roles import User
from helpers import env_with_src

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx`")
    from starlette.testclient import TestClient

CONVEYOR = str(Path(sys.executable).with_name("conveyor"))
JOBS = 30  # every fifth fails for good: 24 succeed, 6 go dead


@pytest.fixture
def ran(app: conveyor.Conveyor) -> conveyor.Conveyor:
    """Queue ``emails`` over three shards, 30 jobs run (6 dead), and an unsharded queue."""

    @app.task(queue="emails", retries=0)
    def send(i: int) -> int:
        if i % 5 == 0:
            raise ValueError("boom")
        return i

    @app.task(queue="plain", retries=0)
    def alone() -> None:
        return None

    assert app.queue("emails").set_shards(3) == 3
    for i in range(JOBS):
        send.enqueue(i)
    alone.enqueue()
    app.worker(queues=["emails", "plain"], concurrency=4).run(burst=True)
    return app


def test_group_puts_the_queue_first_and_orders_shards_by_number() -> None:
    names = ["b", "a~10", "a~2", "a", "c~1"]
    assert sharded.group(names) == {"a": ["a", "a~2", "a~10"], "b": ["b"], "c": ["c", "c~1"]}
    assert sharded.members("a~2", names) == ["a~2"]
    assert sharded.members("z", names) == ["z"]


def test_a_sharded_queue_is_listed_once_with_its_figures_summed(ran: conveyor.Conveyor
                                                               ) -> None:
    m = ran.monitor
    assert ran.known_queues() == ["emails", "emails~1", "emails~2", "plain"]
    assert m.queue_names() == ["emails", "plain"]
    assert m.shards_of("emails") == ["emails", "emails~1", "emails~2"]
    per_shard = m.queue_states(shards=True)
    assert set(per_shard) == {"emails", "emails~1", "emails~2", "plain"}
    assert m.backlog("emails").dead == 6 == sum(per_shard[s].backlog.dead
                                                for s in m.shards_of("emails"))
    assert m.queue_states()["emails"].backlog.dead == 6
    whole = m.stats(queue="emails")
    parts = m.stats_by_task("emails", shards=True)
    assert [p.queue for p in parts] == ["emails", "emails~1", "emails~2"]
    assert m.stats(queue="emails~1").succeeded == parts[1].succeeded
    assert whole.succeeded == 24 == sum(p.succeeded for p in parts)
    assert whole.failed == sum(p.failed for p in parts) == 6
    assert all(0 < p.succeeded < 24 for p in parts)
    assert whole.throughput == pytest.approx(sum(p.throughput for p in parts), rel=0.05)
    # percentiles from the merged histograms: those of every job of the queue
    starts = bucket_starts(whole.now, 300, ran.limits.bucket_seconds)
    windows = read_windows(ran.redis, {s: ran.keys(s) for s in m.shards_of("emails")}, starts)
    merged = Histogram()
    for per_task in windows.values():
        for part in per_task.values():
            merged.merge(part.wait)
    assert merged.count == 30 and whole.wait.p95 == merged.quantile(0.95)
    assert [(s.queue, s.succeeded) for s in m.stats_by_task()] == [
        ("emails", 24), ("plain", 1)]
    assert [(a.queue, a.active) for a in m.activity()] == [("emails", 0), ("plain", 0)]
    assert [a.queue for a in m.activity(shards=True)] == [
        "emails", "emails~1", "emails~2", "plain"]
    assert m.active(next(t for t in ran.tasks if t.endswith("send"))) == 0
    assert sum(m.series("emails", 300).processed) * m.series("emails", 300).step == 30
    view = m.overview()
    assert [(q.name, q.backlog.dead, q.stats.succeeded, q.shards) for q in view.queues] == [
        ("emails", 6, 24, ("emails", "emails~1", "emails~2")), ("plain", 0, 1, ("plain",))]
    assert [q.name for q in m.overview(shards=True).queues] == [
        "emails", "emails~1", "emails~2", "plain"]


def test_the_dead_jobs_of_every_shard_are_listed_requeued_and_purged(
        ran: conveyor.Conveyor) -> None:
    page = ran.monitor.jobs("emails", "dead", 0, 4)
    assert page.total == 6 and len(page.jobs) == 4
    assert [due for _, due in page.jobs] == sorted((due for _, due in page.jobs), reverse=True)
    rest = ran.monitor.jobs("emails", "dead", 4, 4)
    assert len({j.id for j, _ in page.jobs + rest.jobs}) == 6
    shard_job = next(j for j, _ in page.jobs + rest.jobs if j.queue == "emails~2")
    assert ran.monitor.job_detail(shard_job.id).info.id == shard_job.id
    letters = ran.dead_letters("emails")
    assert len(letters) == 6 and {i.queue for i in letters.list()} == set(
        ran.monitor.shards_of("emails"))
    assert len(ran.dead_letters("emails~2")) == ran.monitor.backlog("emails~2").dead
    assert letters.requeue(shard_job.id) == 1 and len(letters) == 5
    with pytest.raises(ValueError):
        ran.dead_letters("plain").requeue(shard_job.id)
    assert letters.purge() == 5 and len(letters) == 0


def test_the_exporter_sums_shards_or_reports_each(ran: conveyor.Conveyor) -> None:
    def succeeded(collector: RedisCollector) -> dict[str, float]:
        family = next(f for f in collector.collect() if f.name == "conveyor_jobs_succeeded")
        return {s.labels["queue"]: s.value for s in family.samples
                if s.name.endswith("_total")}

    assert succeeded(RedisCollector(ran, advice=False)) == {"emails": 24, "plain": 1}
    apart = succeeded(RedisCollector(ran, advice=False, shards=True))
    assert set(apart) == {"emails", "emails~1", "emails~2", "plain"}
    assert sum(v for k, v in apart.items() if k != "plain") == 24


def cli(app: conveyor.Conveyor, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CONVEYOR, *args, "--url", app.url, "--namespace", app.namespace],
                          env={**env_with_src(), "COLUMNS": "200"}, capture_output=True,
                          text=True, timeout=60)


def test_conveyor_shards_shows_and_changes_the_count(ran: conveyor.Conveyor) -> None:
    shown = cli(ran, "shards", "emails")
    assert shown.returncode == 0, shown.stderr
    assert "3 active shard(s)" in shown.stdout and "emails~2" in shown.stdout
    changed = cli(ran, "shards", "emails", "2")
    assert changed.returncode == 0, changed.stderr
    assert "3 -> 2 shard(s)" in changed.stdout and "retired" in changed.stdout
    assert ran.queue("emails").shards() == 2
    assert "retired" in cli(ran, "shards", "emails").stdout
    data = json.loads(cli(ran, "shards", "emails", "--json").stdout)
    assert data["shards"] == 2 and [s["name"] for s in data["served"]] == [
        "emails", "emails~1", "emails~2"]
    for bad in ("0", "65", "two"):
        refused = cli(ran, "shards", "emails", bad)
        assert refused.returncode == 2 and "1 to 64" in refused.stderr
    assert cli(ran, "shards", "a~1", "2").returncode == 2
    assert "QUEUE" in subprocess.run([CONVEYOR, "shards", "--help"], env=env_with_src(),
                                     capture_output=True, text=True, timeout=60).stdout


def test_cli_stats_job_and_dead_cover_the_shards(ran: conveyor.Conveyor) -> None:
    summed = json.loads(cli(ran, "stats", "-q", "emails", "--json").stdout)
    assert summed["total"]["succeeded"] == 24
    assert [t["queue"] for t in summed["tasks"]] == ["emails"]
    apart = json.loads(cli(ran, "stats", "-q", "emails", "--shards", "--json").stdout)
    assert [t["queue"] for t in apart["tasks"]] == ["emails", "emails~1", "emails~2"]
    table = cli(ran, "stats", "--shards").stdout
    assert "emails~1" in table
    assert "emails~1" not in cli(ran, "stats").stdout
    top = json.loads(cli(ran, "top", "--json").stdout)
    assert set(top["backlog"]) == {"emails", "plain"} and top["backlog"]["emails"]["dead"] == 6
    dead = json.loads(cli(ran, "dead", "list", "emails", "--json").stdout)
    assert len(dead) == 6
    shard_id = next(d["id"] for d in dead if d["queue"] == "emails~1")
    job = cli(ran, "job", shard_id, "--json")
    assert job.returncode == 0 and json.loads(job.stdout)["id"] == shard_id
    assert "requeued 6" in cli(ran, "dead", "requeue", "emails", "--yes").stdout


@pytest.fixture
def client(ran: conveyor.Conveyor) -> Iterator[TestClient]:
    from conveyor.web import create_app

    with TestClient(create_app(ran), follow_redirects=False) as c:
        yield c


def test_the_dashboard_shows_a_sharded_queue_once_and_its_shards_on_its_page(
        ran: conveyor.Conveyor, client: TestClient) -> None:
    overview = client.get("/api/overview").json()
    assert [q["name"] for q in overview["queues"]] == ["emails", "plain"]
    assert overview["queues"][0]["dead"] == 6
    detail = client.get("/api/queues/emails").json()
    assert detail["backlog"]["dead"] == 6
    assert [s["name"] for s in detail["shards"]] == ["emails", "emails~1", "emails~2"]
    assert "shards" not in client.get("/api/queues/plain").json()
    page = client.get("/queues/emails").text
    assert 'id="shards"' in page and "emails~2" in page
    assert 'id="shards"' not in client.get("/queues/plain").text
    dead = client.get("/api/queues/emails/jobs?state=dead").json()
    assert dead["total"] == 6
    shard_id = next(j["id"] for j in dead["jobs"] if j["queue"] == "emails~2")
    assert client.get(f"/api/jobs/{shard_id}").json()["id"] == shard_id
    assert client.get(f"/jobs/{shard_id}").status_code == 200
    jobs_page = client.get("/jobs").text
    assert not re.search(r"emails~\d", jobs_page)


def test_a_user_of_a_queue_may_act_on_its_shards() -> None:
    user = User("ops", "operator", frozenset({"emails"}))
    assert user.can("requeue", ["emails~2"]) and user.can("requeue", "emails")
    assert not user.can("requeue", ["emailsx~1"]) and not user.can("requeue", "other")
