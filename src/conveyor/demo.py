"""The demo's application: a newsletter cut into batches for several tenants.

Run it with ``conveyor demo``. The tasks are ordinary conveyor tasks, so the same module
also works with a real worker: ``conveyor worker conveyor.demo:app``.
"""

from __future__ import annotations

import asyncio
import os
import random

from .app import Conveyor
from .job import JobState

app = Conveyor(namespace=os.environ.get("CONVEYOR_DEMO_NAMESPACE", "conveyor-demo"))

# A few batches go to mail servers that always bounce: they end in the dead letters.
BOUNCING = {("globex", 7), ("initech", 13)}


class TransientSMTPError(Exception):
    """The mail relay said 'try again later'."""


@app.task(name="newsletter.send_batch", queue="newsletter", retries=3, backoff=0.2, timeout=10)
async def send_batch(tenant: str, batch: int, recipients: int) -> dict[str, int]:
    """Send one batch of a tenant's newsletter (simulated: a few ms per 100 recipients)."""
    await asyncio.sleep(0.002 + recipients / 100 * 0.002)
    if (tenant, batch) in BOUNCING:
        raise RuntimeError(f"relay rejected batch {batch} of {tenant}: 550 mailbox unavailable")
    if random.random() < 0.08:
        raise TransientSMTPError("421 service not available, try again later")
    return {"sent": recipients}


@app.task(name="email.transactional", queue="newsletter", retries=5, backoff=0.1)
def send_transactional(user_id: int, template: str) -> str:
    """A password reset or receipt: small, urgent, enqueued at priority 9."""
    return f"sent {template} to user {user_id}"


@app.task(name="newsletter.report", queue="newsletter")
def report(tenant: str, workflow_id: str) -> dict[str, int | str]:
    """The completion job of a tenant's newsletter workflow: it runs once, after every
    batch ended (``run_if="finished"``), and sums what the batches reported."""
    nodes = app.workflow_handle(workflow_id).info().nodes
    batches = [info for name, info in nodes.items() if name != "report"]
    if not all(info.state.finished for info in batches):  # cannot happen: said loudly
        raise RuntimeError(f"report of {tenant} ran before its batches ended")
    sent = sum(info.result["sent"] for info in batches if info.state == JobState.SUCCEEDED)
    failed = sum(1 for info in batches if info.state != JobState.SUCCEEDED)
    return {"tenant": tenant, "batches": len(batches), "sent": sent, "failed": failed}
