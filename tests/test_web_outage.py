"""The dashboard while Redis is out of reach (a banner and JSON errors, not "Loading..."
and a bare 500), and its page titles, through the real ASGI app."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator

import pytest

with warnings.catch_warnings():  # starlette nudges towards httpx2; httpx is what we have
    warnings.filterwarnings("ignore", "Using `httpx`")
    from starlette.testclient import TestClient

import conveyor
from conveyor.web import create_app
from helpers import free_port

PAGES = ["/", "/tasks", "/jobs", "/workers", "/schedules", "/queues/mail",
         "/queues/mail/jobs?state=dead"]
APIS = ["/api/overview", "/api/tasks", "/api/workers", "/api/supervisors", "/api/schedules",
        "/api/queues/mail", "/api/queues/mail/series", "/api/queues/mail/jobs",
        "/api/jobs/mail~abc", "/api/workflows/wf~abc"]


@pytest.fixture
def down() -> Iterator[tuple[TestClient, str]]:
    """A dashboard whose Redis has nothing listening on its port (and a password)."""
    port = free_port()
    app = conveyor.Conveyor(f"redis://:hunter2@127.0.0.1:{port}/0", namespace="outage")
    with TestClient(create_app(app, cache_seconds=0), raise_server_exceptions=False) as c:
        yield c, f"redis://:***@127.0.0.1:{port}/0"


@pytest.mark.parametrize("path", APIS)
def test_the_api_answers_json_errors(down: tuple[TestClient, str], path: str) -> None:
    client, shown = down
    response = client.get(path)
    assert response.status_code == 503
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["error"] == "redis unavailable"
    assert body["detail"].startswith(f"cannot reach Redis at {shown}: connection refused")
    assert "hunter2" not in response.text


@pytest.mark.parametrize("path", PAGES)
def test_pages_say_what_is_wrong(down: tuple[TestClient, str], path: str) -> None:
    client, shown = down
    response = client.get(path)
    assert "hunter2" not in response.text and "Traceback" not in response.text
    banner = re.search(r'<div id="outage"[^>]*>([^<]*)</div>', response.text)
    assert banner is not None
    if response.status_code == 503:  # the page itself needed Redis
        assert banner.group(1).startswith(f"cannot reach Redis at {shown}")
        assert "hidden" not in banner.group(0)
    else:  # a frame whose figures come from the API: its script fills the banner
        assert response.status_code == 200 and "hidden" in banner.group(0)


def test_a_page_with_redis_up_has_no_banner_and_a_plain_title(app: conveyor.Conveyor) -> None:
    app.task(name="mail.send", queue="mail")(lambda: None).enqueue()
    with TestClient(create_app(app, cache_seconds=0)) as client:
        for path in PAGES:
            page = client.get(path)
            assert page.status_code == 200, path
            title = re.search(r"<title>(.*?)</title>", page.text, re.S)
            assert title is not None
            assert re.fullmatch(r"[\w .·-]+ · conveyor", title.group(1)), (path, title.group(1))
            assert re.search(r'<div id="outage"[^>]*hidden', page.text)
        assert "--autoscale MIN:MAX" in client.get("/workers").text
