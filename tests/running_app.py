"""An application whose tasks report what they do to a ledger, for tests that control running
jobs (cancel, steps) through real worker processes.

The namespace comes from ``RUNNING_APP_NAMESPACE`` and Redis from ``CONVEYOR_REDIS_URL``;
the ledger is the Redis list ``<namespace>:ledger``, written with the sync client so that
an entry is stored before the task goes on.
"""

from __future__ import annotations

import asyncio
import os
import time

import conveyor


def make_app(url: str | None = None, namespace: str | None = None) -> conveyor.Conveyor:
    app = conveyor.Conveyor(url, namespace=namespace or os.environ.get(
        "RUNNING_APP_NAMESPACE", "running-test"))
    ledger = f"{app.namespace}:ledger"

    def note(entry: str) -> None:
        app.redis.rpush(ledger, entry)

    @app.task(name="spin_async", visibility_timeout=30)
    async def spin_async(tag: str) -> str:
        note(f"start:{tag}")
        try:
            for _ in range(1200):
                await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            note(f"cancelled:{tag}")
            raise
        return "ran to the end"

    @app.task(name="spin_sync", visibility_timeout=30)
    def spin_sync(tag: str) -> str:
        ctx = conveyor.current_job()
        note(f"start:{tag}")
        deadline = time.monotonic() + 60
        while not ctx.cancelled and time.monotonic() < deadline:
            time.sleep(0.02)
        note(f"saw-cancel:{tag}" if ctx.cancelled else f"timeout:{tag}")
        return "late result"

    @app.task(name="hold", visibility_timeout=2, retries=3)
    def hold(tag: str, seconds: float) -> str:
        note(f"start:{tag}:{conveyor.current_job().attempt}")
        time.sleep(seconds)
        return "held"

    def record(tag: str, n: int) -> int:
        note(f"ran:{n}:{tag}")
        return n * 10

    @app.task(name="three_steps", visibility_timeout=2, retries=3)
    def three_steps(tag: str) -> list[int]:
        ctx = conveyor.current_job()
        one = ctx.step("one", record, tag, 1)
        two = ctx.step("two", record, tag, 2)
        note(f"after-two:{tag}:{ctx.attempt}")
        if ctx.attempt == 1:
            time.sleep(120)  # the test kills the worker here
        three = ctx.step("three", record, tag, 3)
        return [one, two, three]

    return app


app = make_app()
