"""The outbox records outcomes in batches; stopping must wait for a batch on the wire."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import conveyor
from conveyor.scripts import calls
from conveyor.worker.outbox import Outbox


class HeldUp:
    """The real script runner, except that the first call waits until released."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def run(self, call: Any, client: Any = None) -> Any:
        self.started.set()
        await self.release.wait()
        return await self.runner.run(call, client)


def test_flush_all_waits_for_a_batch_already_on_the_wire(app: conveyor.Conveyor) -> None:
    @app.task(name="t")
    def t() -> None: ...

    job = t.enqueue()

    async def scenario() -> str:
        runner = app.ascripts()
        leased = (await runner.run(calls.fetch(app.keys("default"), 1, app.limits))).jobs[0]
        held_up = HeldUp(runner)
        outbox = Outbox(app, held_up)
        loop_task = asyncio.create_task(outbox.run())
        outbox.add("default", calls.Outcome(leased.short_id, leased.token, "ok", 0.0, b"1"))
        await held_up.started.wait()  # the batch left `pending` and is on its way
        flushing = asyncio.create_task(outbox.flush_all(timeout=5))
        await asyncio.sleep(0.05)
        done_early = flushing.done()
        held_up.release.set()
        await flushing
        loop_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(loop_task, 5)
        await app.aclose()
        return "returned early" if done_early else "waited"

    assert asyncio.run(scenario()) == "waited"
    assert job.info().state == conveyor.JobState.SUCCEEDED
