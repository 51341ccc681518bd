"""arq driver: async only (``ArqRedis.enqueue_job``), no bulk API.

Workers run through ``arq.worker.run_worker`` (what the ``arq`` CLI calls).
arq polls (default ``poll_delay`` 0.5 s, ``max_jobs=10``); ``best`` runs two
processes with max_jobs 64 polling every 50 ms.
"""

from __future__ import annotations

from typing import Any

from arq import create_pool
from arq.connections import ArqRedis, RedisSettings
from arq.worker import run_worker

from .base import Driver, Profile
from .common import arecord, redis_url


async def incr(ctx: dict[str, Any], ts: float = 0.0) -> None:
    await arecord(ts)


class WorkerSettings:
    functions = [incr]
    redis_settings = RedisSettings.from_dsn(redis_url())


class BestSettings:
    # arq reads only the class's own __dict__, so no inheritance here.
    functions = [incr]
    redis_settings = RedisSettings.from_dsn(redis_url())
    max_jobs = 64
    poll_delay = 0.05


class ArqDriver(Driver):
    name = "arq"
    dist = "arq"
    modes = ("async",)
    profiles = {
        "default": Profile(1, "run_worker(WorkerSettings) (max_jobs=10)"),
        "best": Profile(2, "2 processes x run_worker, max_jobs=64, poll_delay=0.05 s"),
    }
    notes = ("enqueue = await pool.enqueue_job('incr', ts)",)
    delayed = "async"
    delayed_api = "await pool.enqueue_job('incr', due, _defer_by=seconds)"

    def __init__(self) -> None:
        self.pool: ArqRedis | None = None

    async def asetup(self) -> None:
        self.pool = await create_pool(RedisSettings.from_dsn(redis_url()))

    async def ateardown(self) -> None:
        if self.pool is not None:
            await self.pool.aclose()

    async def aenqueue_one(self, ts: float) -> None:
        assert self.pool is not None
        await self.pool.enqueue_job("incr", ts)

    async def aenqueue_delayed(self, due_ts: float, delay_s: float) -> None:
        assert self.pool is not None
        await self.pool.enqueue_job("incr", due_ts, _defer_by=delay_s)

    def run_worker(self, profile: str, burst: bool) -> None:
        run_worker(BestSettings if profile == "best" else WorkerSettings)  # type: ignore[arg-type]


DRIVER = ArqDriver()
