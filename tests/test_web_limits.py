"""The dashboard's flow-control panel: limits shown, changed through a CSRF-checked form."""

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

XSS = '<script>window.__pwned = 1</script>'


@pytest.fixture
def client(app: conveyor.Conveyor) -> Iterator[TestClient]:
    with TestClient(create_app(app), follow_redirects=False) as c:
        yield c


def csrf_of(client: TestClient, path: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', client.get(path).text)
    assert match
    return match.group(1)


def test_limits_panel_shows_and_changes_limits(app: conveyor.Conveyor,
                                               client: TestClient) -> None:
    q = app.queue("mail")
    q.set_limits(concurrency=7, rate="120/m")
    q.set_tenant_limits(XSS, concurrency=2)
    page = client.get("/queues/mail").text
    assert 'name="concurrency" size="6" value="7"' in page
    assert 'value="2"' in page  # 120/m is 2/s
    assert XSS not in page and "&lt;script&gt;" in page
    token = csrf_of(client, "/queues/mail")
    same = {"origin": "http://testserver"}
    form = {"queue": "mail", "next": "/queues/mail", "concurrency": "9", "rate": "",
            "tenant_concurrency": "3", "tenant_rate": "5/s"}
    assert client.post("/actions/limits", data=form, headers=same).status_code == 403
    assert client.post("/actions/limits", data=form | {"csrf": token},
                       headers={"origin": "http://evil.example"}).status_code == 403
    assert q.limits().concurrency == 7
    done = client.post("/actions/limits", data=form | {"csrf": token}, headers=same)
    assert done.status_code == 303 and done.headers["location"].endswith("done=limits-set&n=1")
    lim = q.limits()
    assert (lim.concurrency, lim.rate, lim.tenant_concurrency, lim.tenant_rate) == (9, None, 3, 5.0)
    bad = client.post("/actions/limits", data=form | {"csrf": token, "concurrency": "lots"},
                      headers=same)
    assert bad.headers["location"].endswith("done=bad-limits&n=1")
    assert q.limits().concurrency == 9
    tenant = client.post("/actions/limits", headers=same, data={
        "csrf": token, "queue": "mail", "next": "/queues/mail", "tenant": "acme",
        "concurrency": "4", "rate": "10"})
    assert tenant.status_code == 303
    assert q.limits().tenants["acme"] == conveyor.TenantLimits(4, 10.0)
    assert "Limits changed" in client.get(done.headers["location"]).text


def test_queue_api_reports_the_flow_state(app: conveyor.Conveyor, client: TestClient) -> None:
    from conveyor.scripts import calls

    app.queue("mail").set_limits(tenant_concurrency=1, rate="50/s")
    spec = calls.JobSpec(task="mail.send", tenant="acme")
    app.store("mail", spec, [(f"a{i}", b"[[]]") for i in range(4)])
    app.scripts.run(calls.fetch(app.keys("mail"), 10, app.limits))
    flow = client.get("/api/queues/mail").json()["flow"]
    assert flow["limits"]["tenant_concurrency"] == 1 and flow["limits"]["rate"] == 50.0
    assert flow["running"] == 1 and flow["held"] == 3
    assert flow["held_tenants"] == [{"tenant": "acme", "held": 3, "running": 1}]
