"""Dashboard roles in a real browser (Debian's Chromium through Playwright), logged in by
HTTP basic auth: a read-only user sees no action, an operator sees requeue and cancel but
not purge, an admin sees purge and uses it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvicorn

import conveyor
from conveyor import testing
from conveyor.web import create_app
from helpers import free_port, wait_until
from test_web_browser import browser, pytestmark  # Chromium, and when it is missing

__all__ = ["browser", "pytestmark"]

USERS: dict[str, Any] = {"ann": ("ann-pw", "admin"), "ola": ("ola-pw", "operator"),
                         "rob": ("rob-pw", "readonly")}


@pytest.fixture
def login(browser: Any) -> Iterator[Callable[[str], Any]]:
    """``login(name)``: a tab of a browser context of its own, logged in as that user."""
    contexts: list[Any] = []

    def make(name: str) -> Any:
        context = browser.new_context(viewport={"width": 1280, "height": 800},
                                      http_credentials={"username": name,
                                                        "password": USERS[name][0]})
        contexts.append(context)
        tab = context.new_page()
        tab.set_default_timeout(15_000)
        tab.on("dialog", lambda d: d.accept())
        return tab

    yield make
    for context in contexts:
        context.close()


@pytest.fixture
def served(app: conveyor.Conveyor) -> Iterator[str]:
    """The dashboard of ``app``, with USERS, served by uvicorn in a thread."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(app, users=USERS), host="127.0.0.1",
                                          port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 15, message="uvicorn start")
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(15)


@pytest.fixture
def jobs(app: conveyor.Conveyor) -> dict[str, list[conveyor.Job[Any]]]:
    """Two dead jobs and one scheduled job on queue mail."""

    @app.task(name="mail.bounce", queue="mail", retries=0)
    def bounce(i: int) -> None:
        raise RuntimeError("550 mailbox unavailable")

    @app.task(name="mail.later", queue="mail")
    def later() -> None: ...

    dead = bounce.enqueue_many([(1,), (2,)])
    # In a thread: Playwright's sync API owns this thread's event loop.
    thread = threading.Thread(target=lambda: testing.drain(app, queues=["mail"]))
    thread.start()
    thread.join(30)
    assert all(j.info().state == conveyor.JobState.DEAD for j in dead)
    return {"dead": dead, "waiting": [later.options(delay=3600).enqueue()]}


def buttons(page: Any) -> set[str]:
    return set(page.locator("button[data-action]").evaluate_all(
        "buttons => buttons.map(b => b.dataset.action)"))


def test_a_readonly_user_sees_no_action(app: conveyor.Conveyor, served: str, login: Any,
                                        jobs: dict[str, list[conveyor.Job[Any]]]) -> None:
    page = login("rob")
    for path in (f"/jobs/{jobs['waiting'][0].id}", f"/jobs/{jobs['dead'][0].id}",
                 "/queues/mail", "/queues/mail/jobs?state=dead"):
        page.goto(served + path)
        page.locator("h1").wait_for()
        assert buttons(page) == set(), path
        assert page.locator('form[method="post"]').count() == 0, path
    assert page.locator("#role").inner_text() == "rob: readonly"
    page.goto(served + "/queues/mail")
    assert page.locator("#limits").is_visible()  # the limits shown as text, not a form


def test_an_operator_sees_requeue_and_cancel_but_not_purge(
        app: conveyor.Conveyor, served: str, login: Any,
        jobs: dict[str, list[conveyor.Job[Any]]]) -> None:
    page = login("ola")
    page.goto(served + "/queues/mail/jobs?state=dead")
    page.locator("#jobs").wait_for()
    assert buttons(page) == {"requeue"}
    page.goto(served + "/queues/mail")
    page.locator("h1").wait_for()
    assert buttons(page) == {"pause", "requeue"}
    waiting = jobs["waiting"][0]
    page.goto(f"{served}/jobs/{waiting.id}")
    assert buttons(page) == {"cancel", "signal"}
    page.locator('button[data-action="cancel"]').click()
    page.locator(".notice.ok").wait_for()
    assert waiting.info().state == conveyor.JobState.CANCELLED


def test_an_admin_sees_purge_and_uses_it(app: conveyor.Conveyor, served: str, login: Any,
                                         jobs: dict[str, list[conveyor.Job[Any]]]) -> None:
    page = login("ann")
    page.goto(served + "/queues/mail")
    page.locator("h1").wait_for()
    assert {"purge", "requeue", "pause", "limits"} <= buttons(page)
    page.locator('button[data-action="purge"]').click()
    page.locator(".notice.ok").wait_for()
    assert page.locator(".notice.ok").inner_text() == "Purged 2 dead job(s)."
    assert len(app.dead_letters("mail")) == 0
