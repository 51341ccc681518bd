"""The dashboard through its ASGI app against a real Redis: pages, JSON API, actions and
their protections (auth, CSRF, escaping)."""

from __future__ import annotations

import asyncio
import base64
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

with warnings.catch_warnings():  # starlette nudges towards httpx2; httpx is what we have
    warnings.filterwarnings("ignore", "Using `httpx`")
    from starlette.testclient import TestClient

import conveyor
from conveyor import testing
from conveyor.clock import ServerClock, server_now
from conveyor.fleet.published import Publisher
from conveyor.schedule import Scheduler
from conveyor.web import create_app, series
from conveyor.web.filters import when
from helpers import env_with_src, free_port, running_worker, wait_until

XSS = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned=1">'


@pytest.fixture
def client(app: conveyor.Conveyor) -> Iterator[TestClient]:
    with TestClient(create_app(app, cache_seconds=0), follow_redirects=False) as c:
        yield c


def csrf_of(client: TestClient, path: str = "/") -> str:
    page = client.get(path)
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert match, "no CSRF token on the page"
    return match.group(1)


def make_dead(app: conveyor.Conveyor, queue: str = "mail", n: int = 1,
              message: str = "relay said no") -> list[conveyor.Job]:
    @app.task(name="mail.bounce", queue=queue, retries=0)
    def bounce(i: int) -> None:
        raise RuntimeError(message)

    jobs = bounce.enqueue_many([(i,) for i in range(n)])
    infos = testing.drain(app, queues=[queue])
    assert {i.id for i in infos} == {j.id for j in jobs}
    assert all(i.state == conveyor.JobState.DEAD for i in infos)
    return jobs


def test_overview_api_counts_each_queue(app: conveyor.Conveyor, client: TestClient) -> None:
    @app.task(name="reports.build", queue="reports")
    def build(i: int) -> int:
        return i

    build.enqueue_many([(i,) for i in range(7)])
    build.options(delay=600).enqueue_many([(i,) for i in range(3)])
    data = client.get("/api/overview").json()
    row = next(q for q in data["queues"] if q["name"] == "reports")
    assert (row["ready"], row["scheduled"], row["active"], row["dead"]) == (7, 3, 0, 0)
    assert data["totals"]["ready"] == 7
    testing.drain(app, queues=["reports"])
    row = next(q for q in client.get("/api/overview").json()["queues"]
               if q["name"] == "reports")
    assert row["ready"] == 0 and row["throughput"] > 0
    assert sum(row["spark"]["processed"]) > 0


def test_every_page_renders(app: conveyor.Conveyor, client: TestClient) -> None:
    jobs = make_dead(app)

    @app.periodic("*/5 * * * *", queue="mail", name="mail.digest")
    def digest() -> None: ...

    for path in ("/", "/queues/mail", "/tasks", "/jobs", "/workers", "/schedules",
                 "/queues/mail/jobs?state=dead", "/queues/mail/jobs?state=scheduled",
                 f"/jobs/{jobs[0].id}", "/static/vendor/uplot/uPlot.iife.min.js"):
        response = client.get(path)
        assert response.status_code == 200, path
    assert "*/5 * * * *" in client.get("/schedules").text
    (row,) = client.get("/api/schedules").json()["schedules"]
    assert row["task"] == "mail.digest" and row["next"] % 300 == 0 and row["last"] is None
    assert client.get("/jobs/mail~nope").status_code == 404
    lookup = client.get("/jobs", params={"id": jobs[0].id})
    assert lookup.status_code == 303 and lookup.headers["location"].endswith(jobs[0].id)


def test_schedules_show_never_until_a_tick_fires(app: conveyor.Conveyor,
                                                client: TestClient) -> None:
    """A worker's first start records the current tick without firing: the page and the
    API show no last fire until a tick fires, then that tick."""

    @app.periodic("*/5 * * * *", queue="mail", name="mail.digest")
    def digest() -> None: ...

    cursor = app.keys("mail").schedule("mail.digest")
    with running_worker(app, queues=["mail"], concurrency=1):
        wait_until(lambda: app.redis.exists(cursor), 10, message="the first start's cursor")
    armed = int(app.redis.get(cursor)) / 1000

    def shown() -> tuple[object, str]:
        (row,) = client.get("/api/schedules").json()["schedules"]
        page = client.get("/schedules").text
        cells = re.findall(r"<td>([^<]*)</td>", page[page.index("mail.digest"):])
        return row["last"], cells[0]  # the first plain cell after the task: last fired

    assert shown() == (None, "never")
    assert when(armed) not in client.get("/schedules").text
    (periodic,) = app.periodics
    tick = periodic.next_after(armed)

    async def fire() -> bool:
        try:
            return await Scheduler(app, ["mail"], ServerClock()).fire(periodic, tick)
        finally:
            await app.aclose()

    assert asyncio.run(fire())
    assert shown() == (tick, when(tick))


def test_queue_api_shows_tenants_per_priority(app: conveyor.Conveyor,
                                              client: TestClient) -> None:
    @app.task(name="news.batch", queue="news")
    def batch(i: int) -> None: ...

    batch.options(tenant="acme", priority=5).enqueue_many([(i,) for i in range(30)])
    batch.options(tenant="globex", priority=5).enqueue_many([(i,) for i in range(4)])
    batch.options(tenant="acme", priority=9).enqueue(1)
    data = client.get("/api/queues/news").json()
    levels = {p["priority"]: p for p in data["priorities"]}
    assert levels[9]["tenants"] == [{"tenant": "acme", "ready": 1}]
    assert levels[5]["tenants"] == [{"tenant": "acme", "ready": 30},
                                    {"tenant": "globex", "ready": 4}]
    assert data["top_tenants"][0] == {"tenant": "acme", "ready": 31}
    assert data["backlog"]["ready"] == 35
    assert data["incoming"] == 0
    for i in range(3):  # plain enqueues: in the inbox until a fetch, shown as incoming
        batch.enqueue(i)
    data = client.get("/api/queues/news").json()
    assert data["incoming"] == app.redis.llen(app.keys("news").inbox) > 0
    assert data["backlog"]["ready"] == 38


def test_task_types_and_series(app: conveyor.Conveyor, client: TestClient) -> None:
    @app.task(name="img.resize", queue="img", idle_threshold=3600)
    def resize(i: int) -> int:
        return i

    @app.task(name="img.never", queue="img")
    def never() -> None: ...

    resize.enqueue_many([(i,) for i in range(20)])
    testing.drain(app, queues=["img"])
    tasks = {t["name"]: t for t in client.get("/api/tasks").json()["tasks"]}
    assert tasks["img.resize"]["succeeded"] == 20 and not tasks["img.resize"]["idle"]
    assert tasks["img.resize"]["run"]["p95"] is not None
    assert tasks["img.never"]["idle"] and tasks["img.never"]["idle_since"] is None
    s = client.get("/api/queues/img/series", params={"window": 300}).json()
    assert s["window"] == 300 and len(s["t"]) == len(s["processed"]) == len(s["wait_p95"])
    assert sum(s["processed"]) * s["step"] == pytest.approx(20)


def test_dashboard_percentiles_are_the_monitors() -> None:
    from conveyor.monitor.series import build_series
    from conveyor.monitor.stats import TaskWindow

    part = TaskWindow()
    for index, n in {0: 1, 10: 97, 50: 2}.items():
        part.wait.add_bin(index, n)
    chart = series.chart(build_series([0], [{"t": part}], 10))
    assert chart["wait_p50"] == [part.wait.quantile(0.50)]
    assert chart["wait_p99"] == [part.wait.quantile(0.99)]
    assert 1e-6 * 1.1**9 <= chart["wait_p50"][0] <= 1e-6 * 1.1**10
    assert chart["run_p50"] == [None]


def test_job_lists_page(app: conveyor.Conveyor, client: TestClient) -> None:
    @app.task(name="later.run", queue="later")
    def run(i: int) -> None: ...

    run.options(delay=3600).enqueue_many([(i,) for i in range(60)])
    first = client.get("/api/queues/later/jobs", params={"state": "scheduled"}).json()
    second = client.get("/api/queues/later/jobs",
                        params={"state": "scheduled", "offset": 50}).json()
    assert first["total"] == 60 and len(first["jobs"]) == 50 and len(second["jobs"]) == 10
    assert not {j["id"] for j in first["jobs"]} & {j["id"] for j in second["jobs"]}
    assert "page 2 of 2" in client.get("/queues/later/jobs?state=scheduled&page=2").text
    bad = client.get("/api/queues/later/jobs", params={"state": "everything"})
    assert bad.status_code == 400


def test_escapes_job_error_and_arguments(app: conveyor.Conveyor, client: TestClient) -> None:
    (job,) = make_dead(app, message=XSS)
    for path in (f"/jobs/{job.id}", "/queues/mail/jobs?state=dead"):
        html = client.get(path).text
        assert "<script>window" not in html and "<img src=x" not in html
        assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in html
    assert XSS in client.get(f"/api/jobs/{job.id}").json()["error"]
    csp = client.get("/").headers["content-security-policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["script-src"] == "'self'"  # no inline script runs, even if injected


def test_workers_page_shows_supervisors_and_their_decisions(app: conveyor.Conveyor,
                                                            client: TestClient) -> None:
    now = server_now(app.redis)
    sup = Publisher(app, "sup-<b>1</b>")
    sup.beat({"host": XSS, "pid": "4242", "queues": "mail,bulk", "concurrency": "8",
              "children": "4", "active": "3", "target": "4", "started_at": f"{now - 90:.3f}",
              "processed": "1200", "min": "1", "max": "8", "target_wait": "10",
              "ready": "600", "rate": "12.50", "p95_wait": "42.000"}, now)
    sup.decision({"at": now - 30, "kind": "scale out", "before": 1, "after": 4,
                  "text": f"1 -> 4 worker processes: {XSS}"})
    sup.decision({"at": now - 5, "kind": "restart",
                  "text": "worker process 2 (pid 77) died (killed by SIGKILL): replacing it"})
    fixed = Publisher(app, "fixed")  # no autoscaling, nothing decided yet
    fixed.beat({"host": "h2", "pid": "1", "queues": "mail", "active": "2", "target": "2"}, now)
    Publisher(app, "long-gone").beat({"host": "h3", "active": "1"}, now - 3600)
    with running_worker(app, queues=["mail"], concurrency=3) as worker:
        data = wait_until(lambda: (d := client.get("/api/workers").json())["workers"] and d,
                          10, message="the worker in the API")
        html = client.get("/workers").text
    (w,) = data["workers"]
    assert (w["id"], w["queues"], w["concurrency"], w["supervisor"]) == (worker.id, "mail", 3,
                                                                          None)
    assert data["capacity"] == 3
    sups = {s["id"]: s for s in data["supervisors"]}
    assert set(sups) == {"sup-<b>1</b>", "fixed"}  # the silent one is not live
    s = sups["sup-<b>1</b>"]
    assert (s["active"], s["target"], s["min"], s["max"], s["target_wait"]) == (3, 4, 1, 8, 10)
    assert (s["ready"], s["rate"], s["p95_wait"], s["host"]) == (600, 12.5, 42, XSS)
    assert [(d["kind"], d["from"], d["to"]) for d in s["decisions"]] == [
        ("restart", None, None), ("scale out", 1, 4)]  # newest first
    assert s["decisions"][1]["at"] == pytest.approx(now - 30)
    assert sups["fixed"]["min"] is None and sups["fixed"]["decisions"] == []
    api = client.get("/api/supervisors", params={"decisions": 1}).json()
    one = next(x for x in api["supervisors"] if x["id"] == "sup-<b>1</b>")
    assert [d["kind"] for d in one["decisions"]] == ["restart"]
    # The page: escaped text, the scaling bounds, decisions newest first.
    assert "<script>window" not in html and "<img src=x" not in html and "<b>1" not in html
    assert html.count("&lt;script&gt;window.__pwned = 1&lt;/script&gt;") == 2  # host, reason
    assert "sup-&lt;b&gt;1&lt;/b&gt;" in html and "long-gone" not in html
    assert "3 / 4" in html and "1\u20138, target wait 10.00 s" in html
    assert "<td>fixed</td>" in html  # the supervisor that does not autoscale
    decisions = html[html.index('id="decisions"'):]
    assert decisions.index("killed by SIGKILL") < decisions.index("1 → 4")
    fixed.remove()
    ids = [x["id"] for x in client.get("/api/supervisors").json()["supervisors"]]
    assert ids == ["sup-<b>1</b>"]


def test_actions_need_token_and_same_origin(app: conveyor.Conveyor, client: TestClient) -> None:
    make_dead(app)
    token = csrf_of(client, "/queues/mail")
    same = {"origin": "http://testserver"}
    form = {"queue": "mail", "next": "/queues/mail"}
    refused = [
        client.post("/actions/pause", data=form, headers=same),  # no token
        client.post("/actions/pause", data=form | {"csrf": "0" * 64}, headers=same),
        client.post("/actions/pause", data=form | {"csrf": token},
                    headers={"origin": "http://evil.example"}),
        client.post("/actions/pause", data=form | {"csrf": token},
                    headers={"referer": "http://evil.example/x"}),
        client.post("/actions/pause", data=form | {"csrf": token}),  # neither header
    ]
    assert [r.status_code for r in refused] == [403] * 5
    assert not app.is_paused("mail")
    other = TestClient(create_app(app))  # another browser: its cookie, not this token
    other.get("/")
    assert other.post("/actions/pause", data=form | {"csrf": token},
                      headers=same).status_code == 403
    done = client.post("/actions/pause", data=form | {"csrf": token}, headers=same)
    assert done.status_code == 303 and app.is_paused("mail")
    assert done.headers["location"] == "/queues/mail?done=paused&n=1"
    assert "the queue accepts jobs but hands none out" in client.get(done.headers["location"]).text
    assert client.get("/actions/pause").status_code == 405


def test_api_never_changes_state(app: conveyor.Conveyor, client: TestClient) -> None:
    make_dead(app)
    for path in ("/api/overview", "/api/queues/mail", "/api/queues/mail/jobs"):
        assert client.post(path).status_code == 405
        assert client.delete(path).status_code == 405
    assert len(app.dead_letters("mail")) == 1


def test_requeue_purge_cancel_resume(app: conveyor.Conveyor, client: TestClient) -> None:
    jobs = make_dead(app, n=3)
    token = csrf_of(client, "/queues/mail")
    post = lambda action, **form: client.post(  # noqa: E731
        f"/actions/{action}", data={"csrf": token, "next": "/x?a=1", **form},
        headers={"origin": "http://testserver"})
    one = post("requeue", queue="mail", job_id=jobs[0].id)
    assert one.headers["location"] == "/x?a=1&done=requeued&n=1"
    assert jobs[0].info().state == conveyor.JobState.READY
    assert post("purge", queue="mail").headers["location"].endswith("done=purged&n=2")
    assert len(app.dead_letters("mail")) == 0

    @app.task(name="mail.later", queue="mail")
    def later() -> None: ...

    job = later.options(delay=600).enqueue()
    assert post("cancel", job_id=job.id).headers["location"].endswith("done=cancelled&n=1")
    assert job.info().state == conveyor.JobState.CANCELLED
    assert post("cancel", job_id=job.id).headers["location"].endswith("done=not-cancelled&n=0")
    app.pause("mail")
    assert post("resume", queue="mail").status_code == 303 and not app.is_paused("mail")
    assert post("pause").headers["location"].endswith("done=bad-request&n=0")
    # Only local paths are followed after an action: no open redirect.
    away = client.post("/actions/resume", data={"csrf": token, "queue": "mail",
                                                "next": "//evil.example/"},
                       headers={"origin": "http://testserver"})
    assert away.headers["location"].startswith("/?done=resumed")


def test_token_auth(app: conveyor.Conveyor) -> None:
    client = TestClient(create_app(app, token="s3cret"), follow_redirects=False)
    assert client.get("/").status_code == 401
    assert client.get("/api/overview").status_code == 401
    assert client.get("/", headers={"authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/api/overview",
                      headers={"authorization": "Bearer s3cret"}).status_code == 200
    swap = client.get("/tasks?token=s3cret&window=300")
    assert swap.status_code == 303 and "token" not in swap.headers["location"]
    assert client.get("/tasks").status_code == 200  # the cookie now carries it


def test_basic_auth(app: conveyor.Conveyor) -> None:
    client = TestClient(create_app(app, username="ops", password="pa:ss"))
    refused = client.get("/")
    assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Basic")
    assert client.get("/", auth=("ops", "wrong")).status_code == 401
    assert client.get("/", auth=("ops", "pa:ss")).status_code == 200
    garbage = {"authorization": "Basic " + base64.b64encode(b"\xff\xfe").decode()}
    assert client.get("/", headers=garbage).status_code == 401
    with pytest.raises(ValueError):
        create_app(app, username="ops")


def test_mounted_under_a_prefix(app: conveyor.Conveyor) -> None:
    make_dead(app)
    outer = Starlette(routes=[Mount("/ops", app=create_app(app))])
    client = TestClient(outer, follow_redirects=False)
    page = client.get("/ops/queues/mail")
    assert page.status_code == 200
    assert 'href="/ops/static/app.css"' in page.text and 'action="/ops/actions/pause"' in page.text
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text).group(1)  # type: ignore[union-attr]
    done = client.post("/ops/actions/pause", data={"csrf": token, "queue": "mail",
                                                   "next": "/ops/queues/mail"},
                       headers={"origin": "http://testserver"})
    assert done.headers["location"].startswith("/ops/queues/mail?done=paused")
    assert client.get("/ops/api/queues/mail").json()["backlog"]["paused"] is True


@pytest.mark.slow
def test_cli_serves_the_dashboard(app: conveyor.Conveyor, tmp_path: object) -> None:
    port = free_port()
    env = env_with_src() | {"CONVEYOR_REDIS_URL": app.url}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from conveyor.cli import main; main()", "dashboard",
         "conveyor.demo:app", "--port", str(port), "--token", "t0k"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def answers() -> int:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/api/overview",
                                 headers={"authorization": "Bearer t0k"}).status_code
            except httpx.TransportError:
                return 0

        assert wait_until(answers, 20, 0.1, "dashboard to answer") == 200
        assert httpx.get(f"http://127.0.0.1:{port}/").status_code == 401
    finally:
        proc.terminate()
        proc.wait(10)


def test_running_job_shows_progress_and_can_be_cancelled(app: conveyor.Conveyor,
                                                         client: TestClient) -> None:
    @app.task(name="export", queue="mail")
    async def export() -> None:
        ctx = conveyor.current_job()
        ctx.progress(0.4, note="400 of 1000 <rows>")
        while True:
            await asyncio.sleep(0.05)

    with running_worker(app, queues=["mail"], concurrency=2):
        job = export.enqueue()
        wait_until(lambda: job.info().progress == 0.4, 10, message="progress recorded")
        page = client.get(f"/jobs/{job.id}")
        assert 'id="progress-bar" style="width:40.0%"' in page.text
        assert "400 of 1000 &lt;rows&gt;" in page.text and "<rows>" not in page.text
        assert 'value="cancel"' in page.text or "/actions/cancel" in page.text
        listing = client.get("/queues/mail/jobs?state=active")
        assert 'style="width:40.0%"' in listing.text and "40 %" in listing.text
        api = client.get(f"/api/jobs/{job.id}").json()
        assert api["progress"] == 0.4 and api["progress_note"] == "400 of 1000 <rows>"
        token = csrf_of(client, f"/jobs/{job.id}")
        done = client.post("/actions/cancel", data={"csrf": token, "job_id": job.id},
                           headers={"origin": "http://testserver"})
        assert done.headers["location"].endswith("done=cancelled&n=1")
        wait_until(lambda: job.info().state == conveyor.JobState.CANCELLED, 5,
                   message="the running job cancelled")
