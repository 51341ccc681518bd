"""The dashboard's workflow page and API: nodes grouped by state, links, cancel."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator

import pytest

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx`")
    from starlette.testclient import TestClient

import conveyor
from conveyor.web import create_app
from conveyor.web.filters import segment
from helpers import running_worker, wait_until

XSS = '<script>window.__pwned = 1</script>'


@pytest.fixture
def client(app: conveyor.Conveyor) -> Iterator[TestClient]:
    with TestClient(create_app(app), follow_redirects=False) as c:
        yield c


def test_workflow_page_groups_nodes_and_cancels(app: conveyor.Conveyor,
                                                client: TestClient) -> None:
    @app.task(name="w.ok")
    def ok() -> str:
        return "fine"

    @app.task(name="w.gate", queue="later")
    def gate() -> None: ...

    wf = app.workflow()
    first = wf.add(ok, name=XSS)
    wf.add(ok, name="second", after=[first])
    g = wf.add(gate, name="gate", after=[first])
    wf.add(ok, name="last", after=[g])
    handle = wf.enqueue()
    with running_worker(app, queues=["default"], concurrency=2):
        wait_until(lambda: handle.info().nodes["second"].state == conveyor.JobState.SUCCEEDED,
                   30)
    page = client.get(f"/workflows/{segment(handle.id)}")
    assert page.status_code == 200
    assert XSS not in page.text and "&lt;script&gt;" in page.text
    assert 'id="group-succeeded"' in page.text and 'id="group-ready"' in page.text
    assert 'id="group-scheduled"' in page.text
    assert f'/jobs/{segment(first.id)}' in page.text
    api = client.get(f"/api/workflows/{segment(handle.id)}").json()
    assert api["state"] == "running"
    assert {g["state"]: len(g["nodes"]) for g in api["groups"]} == {
        "ready": 1, "scheduled": 1, "succeeded": 2}
    # the job page links back to its workflow
    assert f'/workflows/{segment(handle.id)}' in client.get(f"/jobs/{segment(g.id)}").text
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert token is not None
    done = client.post("/actions/cancel_workflow",
                       data={"csrf": token.group(1), "job_id": handle.id,
                             "next": f"/workflows/{segment(handle.id)}"},
                       headers={"origin": "http://testserver"})
    assert done.status_code == 303
    assert done.headers["location"].endswith("done=workflow-cancelled&n=2")
    assert handle.info().state == "cancelled"
    assert client.get("/workflows/default~nope").status_code == 404
    assert client.get("/api/workflows/default~nope").status_code == 404
