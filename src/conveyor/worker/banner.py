"""The line a worker logs once it is connected and serving: what it serves, and where."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..urls import public_url

log = logging.getLogger("conveyor.worker")


def announce(worker_id: str, url: str, namespace: str, queues: Sequence[str],
             concurrency: int, tasks: Sequence[str]) -> None:
    """Log the worker's banner (INFO), with its parts as fields for JSON output."""
    shown = public_url(url)
    names = ", ".join(sorted(tasks)) or "none (every job it takes will go dead)"
    log.info("worker %s ready: redis %s, namespace %s, queues %s, concurrency %d, tasks %s",
             worker_id, shown, namespace, ", ".join(queues), concurrency, names,
             extra={"worker": worker_id, "redis": shown, "namespace": namespace,
                    "queues": list(queues), "concurrency": concurrency,
                    "tasks": sorted(tasks)})
