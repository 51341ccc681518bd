"""A small application for monitoring tests that run workers as separate processes.

The namespace comes from ``MONITOR_APP_NAMESPACE`` and Redis from ``CONVEYOR_REDIS_URL``,
so a test can point a ``conveyor worker monitor_app:app`` process at its own keys.
"""

from __future__ import annotations

import asyncio
import os

import conveyor


def make_app(url: str | None = None, namespace: str | None = None) -> conveyor.Conveyor:
    app = conveyor.Conveyor(url, namespace=namespace or os.environ.get(
        "MONITOR_APP_NAMESPACE", "monitor-test"))

    @app.task(name="block", visibility_timeout=1.0, retries=3)
    async def block(gate: str) -> str:
        """Run until the key ``gate`` exists: a job that stays active as long as we like."""
        client = app.aredis()
        while not await client.exists(gate):
            await asyncio.sleep(0.02)
        return "released"

    @app.task(name="nap")
    async def nap(seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    @app.task(name="doomed", retries=0)
    def doomed(n: int) -> None:
        raise RuntimeError(f"doomed job {n} failed on purpose")

    return app


app = make_app()
