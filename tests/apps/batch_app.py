"""An application for batch tests with real worker processes: each call notes its items
in a ledger (a Redis list) before and after its work, so a test can count how often each
item ran to the end.

Worker processes (``conveyor worker apps.batch_app:app``) find Redis and the namespace in
``$CONVEYOR_REDIS_URL`` and ``$BATCH_NAMESPACE``; a test builds the same app with
:func:`make_app`. While the key :func:`hold_key` exists, a call holds on after noting its
start (a test kills the worker then).
"""

from __future__ import annotations

import os
import time

import conveyor

VT = 1.5  # short leases: a killed worker's jobs come back soon


def ledger_key(namespace: str) -> str:
    return f"{namespace}:batch-ledger"


def hold_key(namespace: str) -> str:
    return f"{namespace}:batch-hold"


def make_app(url: str | None = None, namespace: str | None = None) -> conveyor.Conveyor:
    ns = namespace or os.environ.get("BATCH_NAMESPACE", "batch-test")
    app = conveyor.Conveyor(url, namespace=ns)

    @app.task(name="batch.index", queue="index", visibility_timeout=VT, retries=5,
              batch=conveyor.Batch(max=20, wait=0.5))
    def index(items: list[conveyor.BatchItem]) -> None:
        pid = os.getpid()
        app.redis.rpush(ledger_key(ns), *[f"start {i.args[0]} {pid}" for i in items])
        while app.redis.exists(hold_key(ns)):
            time.sleep(0.05)
        app.redis.rpush(ledger_key(ns), *[f"done {i.args[0]} {pid}" for i in items])
        for item in items:
            item.result = f"indexed {item.args[0]} by {pid}"

    return app


app = make_app()
