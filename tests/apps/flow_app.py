"""An application for flow-control tests: each run writes its start and end to a ledger.

Worker processes (``conveyor worker apps.flow_app:app``) find Redis and the namespace in
``$CONVEYOR_REDIS_URL`` and ``$FLOW_NAMESPACE``; a test builds the same app with
:func:`make_app` and reads the ledger with :func:`read_ledger`.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

import redis

import conveyor

QUEUE = "flow"
VT = 1.5  # short leases: a killed worker's slots come back soon


def ledger_key(namespace: str) -> str:
    return f"{namespace}:flow-ledger"


def make_app(url: str | None = None, namespace: str | None = None) -> conveyor.Conveyor:
    ns = namespace or os.environ.get("FLOW_NAMESPACE", "flow-test")
    app = conveyor.Conveyor(url, namespace=ns)
    key = ledger_key(ns)

    @app.task(name="flow.work", queue=QUEUE, visibility_timeout=VT, retries=10)
    async def work(label: str, seconds: float) -> str:
        """Note the start, hold a slot for ``seconds``, note the end."""
        client = app.aredis()
        await client.rpush(key, f"start {label} {time.time():.6f} {os.getpid()}")
        await asyncio.sleep(seconds)
        await client.rpush(key, f"end {label} {time.time():.6f} {os.getpid()}")
        return label

    return app


app = make_app()


@dataclass
class Run:
    label: str
    start: float
    end: float | None
    pid: int


def read_ledger(client: redis.Redis, namespace: str) -> list[Run]:
    """Runs in start order; ``end`` is None for a run that never ended (a killed worker)."""
    runs: dict[str, list[Run]] = {}
    ordered: list[Run] = []
    for raw in client.lrange(ledger_key(namespace), 0, -1):
        kind, label, at, pid = raw.decode().split(" ")
        if kind == "start":
            run = Run(label, float(at), None, int(pid))
            runs.setdefault(label, []).append(run)
            ordered.append(run)
        else:
            for run in runs.get(label, []):
                if run.end is None and run.pid == int(pid):
                    run.end = float(at)
                    break
    return ordered


def max_overlap(runs: list[Run], until: float | None = None) -> int:
    """Most runs in progress at any instant (an unended run lasts until ``until``)."""
    events: list[tuple[float, int]] = []
    for run in runs:
        end = run.end if run.end is not None else (until or float("inf"))
        events.append((run.start, 1))
        events.append((end, -1))
    events.sort(key=lambda e: (e[0], e[1]))  # ends before starts at the same instant
    now = best = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def most_starts_in_window(starts: list[float], window: float = 1.0) -> int:
    """Most starts in any window of ``window`` seconds."""
    starts = sorted(starts)
    best, lo = 0, 0
    for hi, t in enumerate(starts):
        while t - starts[lo] > window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best
