"""arq driver: async only (``ArqRedis.enqueue_job``), no bulk API.

Workers run through ``arq.worker.run_worker`` (what the ``arq`` CLI calls).
arq defaults to ``max_jobs=10`` per process; ``best`` runs two processes with
32 each.
"""

from __future__ import annotations

from typing import Any

from arq import create_pool
from arq.connections import ArqRedis, RedisSettings
from arq.worker import run_worker

from .common import Driver, Profile, arecord, redis_url


async def incr(ctx: dict[str, Any], ts: float = 0.0) -> None:
    await arecord(ts)


class WorkerSettings:
    functions = [incr]
    redis_settings = RedisSettings.from_dsn(redis_url())


class BestSettings(WorkerSettings):
    max_jobs = 32


class ArqDriver(Driver):
    name = "arq"
    dist = "arq"
    modes = ("async",)
    profiles = {
        "default": Profile(1, "run_worker(WorkerSettings) (max_jobs=10)"),
        "best": Profile(2, "2 processes x run_worker, max_jobs=32"),
    }
    notes = ("enqueue = await pool.enqueue_job('incr', ts)",)

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

    def run_worker(self, profile: str, burst: bool) -> None:
        run_worker(BestSettings if profile == "best" else WorkerSettings)  # type: ignore[arg-type]


DRIVER = ArqDriver()
