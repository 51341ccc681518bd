"""The workflow page in a real browser: nodes grouped by state, a node's link, and the
cancel button (with its confirmation) stopping what has not started."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import conveyor
from helpers import running_worker, wait_until
from test_web_browser import browser, page, pytestmark, served, shot

__all__ = ["browser", "page", "pytestmark", "served"]


@pytest.mark.slow
def test_cancel_a_workflow_by_clicking(app: conveyor.Conveyor, served: str,
                                       page: Any) -> None:
    gate = threading.Event()

    @app.task(name="news.fetch")
    def fetch() -> int:
        return 3

    @app.task(name="news.send", retries=0)
    def send(i: int) -> int:
        if i == 0:
            raise RuntimeError("550 relay said no")
        gate.wait(15)
        return i

    @app.task(name="news.report")
    def report() -> str:
        return "sent"

    wf = app.workflow()
    f = wf.add(fetch, name="fetch")
    sends = [wf.add(send, i, name=f"send{i}", after=[f]) for i in range(3)]
    wf.add(report, name="report", after=sends, run_if="finished")
    handle = wf.enqueue()
    with running_worker(app, concurrency=4):
        wait_until(lambda: handle.info().counts.get("active") == 2, 15)
        page.goto(f"{served}/workflows/{handle.id}")
        assert page.locator("#wf-state").inner_text() == "running"
        assert "550 relay said no" in page.locator("#group-dead").inner_text()
        assert "send1" in page.locator("#group-active").inner_text()
        assert "report" in page.locator("#group-scheduled").inner_text()
        shot(page, "workflow.png")
        page.locator('button[data-action="cancel_workflow"]').click()
        page.locator(".notice.ok").wait_for()
        assert "Cancelled 3 node(s)" in page.locator(".notice.ok").inner_text()  # 2 running
        assert page.dialogs and handle.id in page.dialogs[-1]
        gate.set()
        wait_until(lambda: handle.info().state != "running", 15)
        page.reload()
        assert page.locator("#wf-state").inner_text() == "failed"
        assert "report" in page.locator("#group-cancelled").inner_text()
        page.locator("#group-succeeded a", has_text="~").first.click()
        page.wait_for_url("**/jobs/**")
        assert page.locator('[data-f="state"]').inner_text() == "succeeded"
