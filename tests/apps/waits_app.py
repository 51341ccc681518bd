"""An application for durable-wait tests with real worker processes: each run notes what
it reached in a ledger (a Redis list), so a test can count how often each part ran.

Worker processes (``conveyor worker apps.waits_app:app``) find Redis and the namespace in
``$CONVEYOR_REDIS_URL`` and ``$WAITS_NAMESPACE``; a test builds the same app with
:func:`make_app` and reads the ledger with :func:`ledger`.
"""

from __future__ import annotations

import os
import time
from collections import Counter

import redis

import conveyor

VT = 1.5  # short leases: a killed worker's jobs come back soon


def ledger_key(namespace: str) -> str:
    return f"{namespace}:waits-ledger"


def make_app(url: str | None = None, namespace: str | None = None) -> conveyor.Conveyor:
    ns = namespace or os.environ.get("WAITS_NAMESPACE", "waits-test")
    app = conveyor.Conveyor(url, namespace=ns)
    key = ledger_key(ns)

    def note(what: str, label: str) -> None:
        app.redis.rpush(key, f"{what} {label} {os.getpid()}")

    @app.task(name="waits.approval", queue="orders", visibility_timeout=VT, retries=10)
    def approval(label: str, hold: float = 0.0) -> str:
        """Wait for signal 'go'; after it, hold the slot for ``hold`` seconds."""
        ctx = conveyor.current_job()
        note("top", label)
        payload = ctx.wait_for("go")
        note("resumed", label)
        time.sleep(hold)
        note("after", label)
        return f"{label}:{payload}"

    @app.task(name="waits.thumb", queue="images", visibility_timeout=VT, retries=10)
    def thumb(label: str, seconds: float) -> str:
        note("child", label)
        time.sleep(seconds)
        return f"{label}@small"

    @app.task(name="waits.publish", queue="orders", visibility_timeout=VT, retries=10)
    def publish(label: str, seconds: float) -> str:
        ctx = conveyor.current_job()
        note("top", label)
        small = ctx.child("thumb", thumb, label, seconds)
        note("after", label)
        return f"published {small}"

    return app


app = make_app()


def ledger(client: redis.Redis, namespace: str) -> Counter[tuple[str, str]]:
    """How often each (what, label) was noted."""
    return Counter(tuple(raw.decode().split(" ")[:2])  # type: ignore[misc]
                   for raw in client.lrange(ledger_key(namespace), 0, -1))
