"""The dashboard in a real browser (Debian's Chromium through Playwright) against a real
Redis with a worker running: live numbers, a running job's start and worker, a requeue by
clicking, a refused cross-site POST, and an error holding markup that shows as text and
never runs."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

import conveyor
from conveyor.fleet.published import Publisher
from conveyor.web import create_app
from conveyor.web.filters import when
from helpers import free_port, running_worker, wait_until

CHROMIUM = "/usr/bin/chromium"
PLACEHOLDER = "\u2013"  # what a figure shows before its first refresh
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
XSS = ('boom <script>window.__pwned = 1; alert(1)</script>'
       '<img src=x onerror="window.__pwned = 1">')

pytestmark = [
    pytest.mark.browser,
    pytest.mark.xdist_group("browser"),
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK),
                       reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    tab = context.new_page()
    tab.set_default_timeout(15_000)
    dialogs: list[str] = []
    tab.on("dialog", lambda d: (dialogs.append(d.message), d.accept()))
    tab.dialogs = dialogs
    yield tab
    context.close()


@pytest.fixture
def served(app: conveyor.Conveyor) -> Iterator[str]:
    """The dashboard of ``app`` served by uvicorn in a thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(app), host="127.0.0.1", port=port,
                                          log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 15, message="uvicorn start")
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(15)


def burst(app: conveyor.Conveyor, queues: list[str]) -> None:
    """Run a burst worker in a thread: Playwright's sync API owns this thread's loop."""
    thread = threading.Thread(target=lambda: app.worker(queues=queues).run(burst=True))
    thread.start()
    thread.join(30)
    assert not thread.is_alive()


def shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name))


def test_overview_numbers_move_while_jobs_flow(app: conveyor.Conveyor, served: str,
                                               page: Any) -> None:
    @app.task(name="newsletter.send_batch", queue="newsletter", retries=0)
    def send_batch(tenant: str, n: int) -> int:
        time.sleep(0.02)
        if n % 25 == 0:
            raise RuntimeError(f"relay rejected batch {n} of {tenant}: 550 mailbox unavailable")
        return n

    @app.task(name="billing.invoice", queue="billing")
    def invoice(n: int) -> int:
        time.sleep(0.01)
        return n

    tenants = ["acme", "globex", "initech", "umbrella"]
    send_batch.options(delay=3600).enqueue_many([("acme", 1)] * 5)
    stop = threading.Event()

    def produce() -> None:  # a steady trickle so the figures keep changing
        n = 0
        while not stop.is_set() and n < 4000:
            for t in tenants:
                send_batch.options(tenant=t, priority=5 + n % 3).enqueue(t, n)
            invoice.enqueue(n)
            n += 1
            stop.wait(0.03)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        with running_worker(app, queues=["newsletter", "billing"], concurrency=4):
            page.goto(served + "/")
            row = page.locator('#queues tr[data-queue="newsletter"]')
            row.wait_for()
            assert page.locator('#queues tr[data-queue="billing"]').count() == 1
            # A fast worker may keep "ready" at 0 throughout: watch the whole row (ready,
            # active, dead, jobs/s, wait p95), which moves while jobs flow.
            cells = row.locator("td")
            first = [cells.nth(i).inner_text() for i in range(1, 7)]
            wait_until(lambda: [cells.nth(i).inner_text() for i in range(1, 7)] != first, 15,
                       0.1, "the queue's figures to change without a reload")
            throughput = page.locator('[data-total="throughput"]')
            wait_until(lambda: throughput.inner_text() not in (PLACEHOLDER, "0.00"), 20, 0.2,
                       "a non-zero throughput")
            assert page.locator('[data-total="scheduled"]').inner_text() != PLACEHOLDER
            assert row.locator("svg.spark").count() == 2
            page.locator('#activity tr[data-task="billing.invoice"]').wait_for()
            shot(page, "overview.png")

            page.goto(served + "/queues/newsletter")
            page.locator("#tenants tbody tr td").first.wait_for()
            page.locator("#chart-rate .uplot").wait_for()
            wait_until(lambda: page.locator('[data-f="stats.throughput"]').inner_text()
                       not in (PLACEHOLDER, "n/a"), 15, 0.2, "queue throughput")
            with page.expect_response(lambda r: "/series" in r.url):
                pass  # one more chart refresh lands before the picture
            shot(page, "queue.png")
    finally:
        stop.set()
        producer.join(10)


def test_requeue_a_dead_job_by_clicking(app: conveyor.Conveyor, served: str,
                                        page: Any) -> None:
    healed = threading.Event()

    @app.task(name="mail.deliver", queue="mail", retries=0)
    def deliver(to: str) -> str:
        if not healed.is_set():
            raise RuntimeError("550 mailbox unavailable")
        return f"delivered to {to}"

    job = deliver.enqueue("ops@example.com")
    with running_worker(app, queues=["mail"], concurrency=2):
        wait_until(lambda: job.info().state == conveyor.JobState.DEAD, 15,
                   message="the job to go dead")
        healed.set()
        page.goto(served + "/queues/mail/jobs?state=dead")
        row = page.locator("#jobs tbody tr", has_text=job.id)
        assert "550 mailbox unavailable" in row.inner_text()
        row.locator('button[data-action="requeue"]').click()
        page.locator(".notice.ok").wait_for()
        assert page.locator(".notice.ok").inner_text() == "Requeued 1 dead job(s)."
        assert page.dialogs and job.id in page.dialogs[-1]  # it asked before acting
        page.goto(f"{served}/jobs/{job.id}")
        badge = page.locator('[data-f="state"]')
        wait_until(lambda: badge.inner_text() == "succeeded", 15, 0.1,
                   "the page to show the job succeeded")
        assert "delivered to ops@example.com" in page.locator("#result").inner_text()
    assert job.result(timeout=1) == "delivered to ops@example.com"


def test_cross_site_post_is_refused(app: conveyor.Conveyor, served: str, page: Any) -> None:
    @app.task(name="mail.deliver", queue="mail")
    def deliver() -> None: ...

    deliver.enqueue()
    page.goto(served + "/queues/mail")  # the victim has the dashboard open: cookie set
    attack = f"""<html><body><form id=f method=post action="{served}/actions/pause">
      <input name=queue value=mail><input name=csrf value=guessed></form>
      <script>document.getElementById('f').submit()</script></body></html>"""
    page.route("http://attacker.test/**",
               lambda route: route.fulfill(status=200, content_type="text/html", body=attack))
    with page.expect_response(f"{served}/actions/pause") as answer:
        page.goto("http://attacker.test/")
    assert answer.value.status == 403
    assert "refused" in page.locator("body").inner_text()
    assert not app.is_paused("mail")
    # The same action from the dashboard itself goes through.
    page.goto(served + "/queues/mail")
    page.locator('button[data-action="pause"]').click()
    page.locator(".notice.ok").wait_for()
    assert app.is_paused("mail")
    assert page.locator('button[data-action="resume"]').count() == 1


def test_markup_in_an_error_is_text(app: conveyor.Conveyor, served: str, page: Any) -> None:
    @app.task(name="mail.deliver", queue="mail", retries=0)
    def deliver(subject: str) -> None:
        raise RuntimeError(XSS)

    job = deliver.enqueue("<b>hello</b><script>window.__pwned = 2</script>")
    burst(app, ["mail"])
    for path in (f"/jobs/{job.id}", "/queues/mail/jobs?state=dead"):
        page.goto(served + path)
        page.wait_for_load_state("networkidle")
        assert page.evaluate("window.__pwned") is None
        assert page.locator("img[src=x]").count() == 0
    page.goto(f"{served}/jobs/{job.id}")
    assert XSS in page.locator("#error").inner_text()
    assert "<script>window.__pwned = 2</script>" in page.locator("#args").inner_text()
    with page.expect_response(lambda r: "/api/jobs/" in r.url):
        pass  # a live refresh rewrites the error text: it must stay text
    assert XSS in page.locator("#error").inner_text()
    assert page.evaluate("window.__pwned") is None
    assert not page.dialogs


def test_workers_page_refreshes_supervisors_as_text(app: conveyor.Conveyor, served: str,
                                                    page: Any) -> None:
    page.goto(served + "/workers")
    assert "No supervisor is running" in page.locator("#supervisors").inner_text()
    # Published after the page loaded: only the page's live refresh can show it.
    sup = Publisher(app, "sup-1")
    sup.beat({"host": XSS, "active": "2", "target": "3", "min": "1", "max": "6",
              "target_wait": "5"}, time.time())
    sup.decision({"at": time.time(), "kind": "scale out", "before": 2, "after": 3,
                  "text": f"jobs wait 9.0 s {XSS}"})
    row = page.locator("#decisions tbody tr", has_text="scale out")
    row.wait_for()
    assert "2 \u2192 3" in row.inner_text() and XSS in row.inner_text()
    assert XSS in page.locator("#supervisors tbody").inner_text()
    assert "1\u20136, target wait 5.00 s" in page.locator("#supervisors tbody").inner_text()
    assert page.evaluate("window.__pwned") is None and not page.dialogs
    assert page.locator("img[src=x]").count() == 0


def test_readme_shows_the_dashboard() -> None:
    """The README's picture exists (refresh it from test-artifacts/overview.png)."""
    root = Path(__file__).resolve().parents[1]
    picture = root / "docs" / "dashboard.png"
    assert picture.exists() and picture.stat().st_size > 10_000
    assert "docs/dashboard.png" in (root / "README.md").read_text()


def test_running_job_progress_moves_live_and_cancel_stops_it(app: conveyor.Conveyor,
                                                             served: str, page: Any) -> None:
    step = threading.Event()

    @app.task(name="export", queue="mail")
    def export() -> None:
        ctx = conveyor.current_job()
        ctx.progress(0.25, note="a quarter")
        step.wait(30)
        ctx.progress(0.75, note="three quarters")
        deadline = time.monotonic() + 20
        while not ctx.cancelled and time.monotonic() < deadline:
            time.sleep(0.02)

    with running_worker(app, queues=["mail"], concurrency=2):
        job = export.enqueue()
        wait_until(lambda: job.info().progress == 0.25, 10, message="first progress")
        page.goto(f"{served}/jobs/{job.id}")
        bar = page.locator("#progress-bar")
        assert bar.get_attribute("style") == "width:25.0%"
        step.set()  # the page refreshes itself: the bar and the note follow
        wait_until(lambda: bar.get_attribute("style") == "width: 75%;", 10, interval=0.1,
                   message="the bar at 75 %")
        assert page.locator('[data-f="progress_note"]').inner_text() == "three quarters"
        page.locator('button[data-action="cancel"]').click()
        page.locator(".notice.ok").wait_for()
        wait_until(lambda: job.info().state == conveyor.JobState.CANCELLED, 5,
                   message="cancelled from the dashboard")
        assert page.dialogs and "Its run is stopped" in page.dialogs[-1]


def test_a_running_job_shows_since_when_and_on_which_worker(app: conveyor.Conveyor,
                                                           served: str, page: Any) -> None:
    """From the active list to the job's page: its start time and the id the worker
    registered, as rendered and after the page refreshed itself; the holder goes when the
    run ends, the start time stays."""
    release = threading.Event()

    @app.task(name="reports.build", queue="reports")
    def build() -> str:
        release.wait(20)  # bounded, in case the test fails before it releases the job
        return "built"

    try:
        with running_worker(app, queues=["reports"], concurrency=2) as worker:
            job = build.enqueue()
            info = wait_until(lambda: (i := job.info()).state == "active" and i, 10,
                              message="the job to run")
            registered = wait_until(lambda: [w.id for w in app.monitor.workers()], 10,
                                    message="the worker's registration")
            assert registered == [worker.id]
            assert info.worker == worker.id and info.started_at is not None
            started = when(info.started_at)

            page.goto(f"{served}/queues/reports/jobs?state=active")
            page.locator("#jobs tbody a", has_text=job.id).click()
            page.wait_for_url(f"**/jobs/{job.id}")
            state, holder = page.locator('[data-f="state"]'), page.locator('[data-f="worker"]')
            since = page.locator('[data-f="started_at"]')
            ran = page.locator('[data-f="running_for"]')
            assert state.inner_text() == "active"
            assert (holder.inner_text(), since.inner_text()) == (registered[0], started)
            first = ran.inner_text()
            wait_until(lambda: ran.inner_text() != first, 10, 0.1,
                       "the page to refresh the time it has run")
            assert (holder.inner_text(), since.inner_text()) == (registered[0], started)
            assert ran.inner_text() != "n/a"
            shot(page, "job-running.png")

            release.set()
            wait_until(lambda: state.inner_text() == "succeeded", 10, 0.1,
                       "the page to show the run ended")
            assert holder.inner_text() == ""
            assert since.inner_text() == started
            assert page.locator('[data-f="finished_at"]').inner_text() != "-"
    finally:
        release.set()


def test_an_operator_changes_a_queues_limits(app: conveyor.Conveyor, served: str,
                                           page: Any) -> None:
    q = app.queue("mail")
    q.set_limits(concurrency=3)
    page.goto(served + "/queues/mail")
    panel = page.locator("#flow")
    assert panel.locator('input[name="concurrency"]').first.input_value() == "3"
    panel.locator('input[name="concurrency"]').first.fill("12")
    panel.locator('input[name="rate"]').first.fill("200/s")
    panel.locator('button[data-action="limits"]').click()
    page.locator(".notice.ok").wait_for()
    assert "Limits changed" in page.locator(".notice.ok").inner_text()
    assert page.dialogs and "Change the limits of queue mail" in page.dialogs[-1]
    lim = q.limits()
    assert (lim.concurrency, lim.rate) == (12, 200.0)
    assert page.locator("#flow").locator('input[name="concurrency"]').first.input_value() == "12"


def test_a_sharded_queue_shows_its_shards_and_their_jobs(app: conveyor.Conveyor, served: str,
                                                         page: Any) -> None:
    @app.task(queue="fan")
    def noop(i: int) -> None:
        return None

    app.queue("fan").set_shards(3)
    noop.enqueue_many([(i,) for i in range(9)])
    page.goto(served + "/queues/fan")
    assert page.locator("[data-f='backlog.ready']").inner_text() == "9"
    rows = page.locator("#shards tbody tr")
    assert rows.count() == 3
    assert [rows.nth(i).locator("td").first.inner_text() for i in range(3)] == [
        "fan", "fan~1", "fan~2"]
    assert sum(int(rows.nth(i).locator("td").nth(2).inner_text()) for i in range(3)) == 9
    burst(app, ["fan"])
    page.goto(served + "/queues/fan")
    page.locator("[data-f='stats.throughput']").wait_for()
    wait_until(lambda: page.locator("[data-f='backlog.ready']").inner_text() == "0", 15,
               message="the ready count to drop to 0")


def test_jobs_no_fetch_has_seen_yet_show_as_new(app: conveyor.Conveyor, served: str,
                                               page: Any) -> None:
    @app.task(name="intake.scan", queue="intake")
    def scan(n: int) -> int:
        return n

    scan.options(tenant="acme").enqueue(0)  # on its level at once (the enqueue script)
    for n in range(1, 6):
        scan.enqueue(n)  # plain enqueues: no worker has fetched them
    incoming = app.redis.llen(app.keys("intake").inbox)
    assert incoming > 0
    page.goto(served + "/queues/intake")
    new = page.locator("#priorities tbody tr", has_text="new")
    new.wait_for()
    assert new.locator("td").nth(1).inner_text() == str(incoming)
    assert page.locator("#priorities tbody tr", has_text="acme").count() == 1


def test_overview_with_redis_down_says_so_then_recovers(make_server: Any, page: Any) -> None:
    from helpers import RedisServer

    server: RedisServer = make_server()  # its port is free: nothing listens yet
    app = conveyor.Conveyor(server.url, namespace="outage")
    port = free_port()
    web = uvicorn.Server(uvicorn.Config(create_app(app, cache_seconds=0), host="127.0.0.1",
                                        port=port, log_level="critical", lifespan="off"))
    thread = threading.Thread(target=web.run, daemon=True)
    thread.start()
    wait_until(lambda: web.started, 15, message="uvicorn start")
    try:
        page.goto(f"http://127.0.0.1:{port}/")
        banner = page.locator("#outage")
        banner.wait_for(state="visible")
        assert banner.inner_text().startswith(f"cannot reach Redis at {server.url}:"
                                              " connection refused")
        assert page.locator("#live").inner_text() == "offline"
        shot(page, "overview-redis-down.png")
        server.start()
        banner.wait_for(state="hidden")
        page.locator("#live", has_text="live").wait_for()
        assert page.title() == "Overview · conveyor"
    finally:
        web.should_exit = True
        thread.join(15)
        app.close()


def test_a_suspended_job_is_listed_and_resumed_by_a_signal_sent_from_its_page(
        app: conveyor.Conveyor, served: str, page: Any) -> None:
    @app.task(name="approve", queue="mail")
    def approve(order: str) -> str:
        decision = conveyor.current_job().wait_for("approved", timeout=3600)
        return f"{order} approved by {decision['by']}"

    with running_worker(app, queues=["mail"], concurrency=2):
        job = approve.enqueue("o-7")
        wait_until(lambda: job.info().state == conveyor.JobState.SUSPENDED, 10,
                   message="suspended")
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{served}/queues/mail")  # its charts draw in UTC, on a 24-hour clock
        page.locator("#chart-rate canvas").first.wait_for()
        assert errors == []
        page.goto(f"{served}/queues/mail/jobs?state=suspended")
        row = page.locator("#jobs tbody tr").first
        assert job.id in row.inner_text() and "signal 'approved' until" in row.inner_text()
        page.goto(f"{served}/jobs/{job.id}")
        assert page.locator('[data-f="state"]').inner_text() == "suspended"
        assert "signal 'approved'" in page.locator('[data-f="waiting_for"]').inner_text()
        form = page.locator("#signal-form")
        assert form.locator('input[name="name"]').input_value() == "approved"  # filled in
        form.locator('input[name="data"]').fill('{"by": "ann"}')
        form.locator('button[data-action="signal"]').click()
        page.locator(".notice.ok").wait_for()
        assert job.result(timeout=10) == "o-7 approved by ann"
