"""The worker's parts on their own, without Redis: the running set and the way out.

End-to-end behaviour is tested through real workers elsewhere (``test_worker_runs``,
``test_running_jobs``, ``test_faults``); these pin what each part owns.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import conveyor
from conveyor.clock import ServerClock
from conveyor.scripts import calls
from conveyor.worker.executor import Held
from conveyor.worker.shutdown import INTERRUPTED, Shutdown
from conveyor.worker.slots import Slots


def leased(short_id: str, task: str = "t") -> calls.Leased:
    return calls.Leased(short_id, f"tok-{short_id}", task, b"[[],{}]", 1, 3, 0.0, 0.0, 30_000)


class Told:
    """What the running set told the rest of the worker."""

    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str]] = []
        self.freed: list[tuple[str, bool]] = []
        self.quota = 0

    def record(self, queue: str, outcome: calls.Outcome, held: Held) -> None:
        self.recorded.append((queue, outcome.short_id, outcome.outcome))

    def on_freed(self, queue: str, empty: bool) -> None:
        self.freed.append((queue, empty))

    def on_quota(self) -> None:
        self.quota += 1


def make_slots(told: Told, concurrency: int = 2, max_jobs: int | None = None) -> Slots:
    app = conveyor.Conveyor("redis://127.0.0.1:1/0", namespace="parts")

    @app.task(name="t")
    async def t() -> str:
        return "done"

    @app.task(name="slow")
    async def slow() -> None:
        await asyncio.sleep(60)

    return Slots(app, ServerClock(), concurrency, max_jobs=max_jobs, record=told.record,
                 on_freed=told.on_freed, on_quota=told.on_quota)


async def test_a_run_ends_in_the_outbox_and_frees_its_slot() -> None:
    told = Told()
    slots = make_slots(told, concurrency=2, max_jobs=3)
    assert slots.free() == 2
    slots.start("q", leased("a"))
    slots.start("q", leased("b", task="nobody"))  # unknown task: a dead outcome
    assert slots.free() == 0 and slots.leased.is_set()
    await asyncio.wait_for(slots.freed.wait(), 5)
    while slots.held:
        await asyncio.sleep(0.01)
    assert sorted(told.recorded) == [("q", "a", "ok"), ("q", "b", "dead")]
    assert slots.processed == 2 and told.quota == 0
    assert told.freed[-1] == ("q", True)  # the last run ended: nothing held
    assert slots.free() == 1  # max_jobs: one run left in this worker's life
    slots.shutdown()


async def test_a_job_leased_again_goes_on_under_the_new_lease() -> None:
    told = Told()
    slots = make_slots(told)
    slots.start("q", leased("s", task="slow"))
    held = slots.held[("q", "s")]
    again = calls.Leased("s", "tok-new", "slow", b"[[],{}]", 2, 3, 0.0, 0.0, 30_000)
    slots.start("q", again)
    assert len(slots.held) == 1 and held.leased.token == "tok-new"
    slots.cancel(held)
    assert told.recorded == [("q", "s", "cancelled")] and not slots.held
    slots.shutdown()


class Returned:
    """A hand-back that notes what it was given."""

    def __init__(self) -> None:
        self.given: list[tuple[list[str], str]] = []

    async def held(self, jobs: list[Held], reason: str, within: float = 10.0) -> None:
        self.given.append((sorted(h.leased.short_id for h in jobs), reason))


async def test_a_second_stop_request_cuts_the_grace_period_short(
        caplog: pytest.LogCaptureFixture) -> None:
    told = Told()
    slots = make_slots(told)
    slots.start("q", leased("s", task="slow"))
    await asyncio.sleep(0.05)  # its run has begun
    shutdown, returned = Shutdown(grace=60.0), Returned()
    shutdown.request()
    assert shutdown.requested and shutdown.grace == 60.0
    draining = asyncio.create_task(shutdown.drain(slots, returned))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    assert not draining.done()  # the grace period
    shutdown.request()
    await asyncio.wait_for(draining, 5)
    assert shutdown.grace == 0 and "second stop request" in caplog.text
    assert returned.given == [([], ""), (["s"], INTERRUPTED)] and not slots.held
    slots.shutdown()


def test_a_stop_before_the_first_run_is_kept() -> None:
    app: Any = conveyor.Conveyor("redis://127.0.0.1:1/0", namespace="parts")
    worker = conveyor.Worker(app, queues=["q"], concurrency=3)
    worker.stop()
    assert worker.stopping and worker.grace == 30.0
    assert worker.held == {} and worker.processed == 0 and worker.free_slots() == 3
