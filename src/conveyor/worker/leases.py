"""Keeping leases alive: a running job's lease is extended by heartbeat, so the lease only
bounds how soon a dead worker's job runs again, not how long a job may run."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from ..scripts import calls
from .backoff import CONNECTION_ERRORS

if TYPE_CHECKING:
    from . import Worker

log = logging.getLogger("conveyor.worker")


async def keep_leases(worker: Worker, runner: Any) -> None:
    """Extend the leases of held jobs every third of their visibility timeout."""
    while True:
        vts = [h.leased.visibility_ms for h in worker.held.values()]
        interval = max(0.05, min(vts) / 3000) if vts else 1.0
        await asyncio.sleep(interval)
        by_queue: dict[str, list[tuple[str, str, int]]] = {}
        for held in list(worker.held.values()):
            lease = (held.leased.short_id, held.leased.token, held.leased.visibility_ms)
            by_queue.setdefault(held.queue, []).append(lease)
        for queue, leases in by_queue.items():
            try:
                codes = await runner.run(calls.heartbeat(worker.app.keys(queue), leases))
            except CONNECTION_ERRORS as exc:
                log.warning("could not extend leases (%s); retrying", exc)
                continue
            lost = [lease[0] for lease, code in zip(leases, codes, strict=True)
                    if not code and (queue, lease[0]) in worker.held]
            if lost:
                log.warning("lost the lease of %d job(s) in %s (another worker took them"
                            " over; their results here will be refused): %s",
                            len(lost), queue, ", ".join(lost[:5]))
