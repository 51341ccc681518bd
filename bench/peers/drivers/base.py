"""The driver side of the harness protocol: the :class:`Driver` base class.

A driver subclasses :class:`Driver` and overrides the enqueue primitives the
peer actually has; the timing loops live here so that every peer is measured
by the same code.  Runs inside each peer's venv: stdlib + redis-py only.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from ..procs import process_cpu_seconds
from . import common

BULK_BATCH = 100
"""Jobs per bulk call when *measuring* bulk enqueue (same for every peer)."""
FILL_BATCH = 1000
"""Jobs per bulk call when merely filling a queue for the drain test."""

SYNC_MODES = ("sync", "bulk")

SERVER_PID_ENV = "BENCH_REDIS_PID"
"""The private redis-server's pid, so a timed run can read the server's CPU time."""

GOLDEN = 0.6180339887498949
"""Spreads the delayed-job delays evenly over their range without a pattern that
would make several jobs fall due at the same moment."""


def server_cpu_seconds() -> float:
    """CPU time the private redis-server has used so far (0 when its pid is unknown)."""
    pid = os.environ.get(SERVER_PID_ENV)
    return process_cpu_seconds(int(pid)) if pid else 0.0


def delay_for(i: int, low: float, high: float) -> float:
    """The *i*-th probe's delay in seconds, whole milliseconds (every peer takes ms)."""
    return round(low + (high - low) * ((i * GOLDEN) % 1.0), 3)


@dataclass(frozen=True)
class Profile:
    """How the harness should run workers for one drain configuration."""

    copies: int
    """How many worker commands the harness starts (each in its own session)."""
    description: str


class Driver:
    """Base class: override the primitives the peer supports.

    Sync primitives: :meth:`enqueue_one`, :meth:`enqueue_batch`.
    Async primitives: :meth:`aenqueue_one`, :meth:`aenqueue_batch`, run between
    :meth:`asetup` and :meth:`ateardown` in one event loop.
    """

    name: ClassVar[str]
    dist: ClassVar[str]
    modes: ClassVar[tuple[str, ...]]
    """Subset of ``sync``, ``bulk``, ``async``, ``abulk`` that the peer has."""
    profiles: ClassVar[dict[str, Profile]]
    """``default`` (1 process, defaults) and ``best`` (tuned for 2 cores)."""
    notes: ClassVar[tuple[str, ...]] = ()
    delayed: ClassVar[str] = ""
    """``sync`` or ``async``: which delayed-job primitive the driver implements;
    empty when the peer has no delayed jobs in its public API."""
    delayed_api: ClassVar[str] = "no delayed jobs in its public API"
    """The call used for delayed jobs, or why there is none (shown in the report)."""
    delayed_profile: ClassVar[str] = "default"
    """Worker profile for the delayed-job scenario (RQ needs its scheduler on)."""

    # ---- primitives (override) ---------------------------------------------------
    def setup(self) -> None:
        """Connect (sync API).  Called once before any sync primitive."""

    def enqueue_one(self, ts: float) -> None:
        raise NotImplementedError

    def enqueue_batch(self, tss: Sequence[float]) -> None:
        raise NotImplementedError

    async def asetup(self) -> None:
        """Connect (async API) inside the running loop."""

    async def ateardown(self) -> None:
        """Close async resources so the loop exits cleanly."""

    async def aenqueue_one(self, ts: float) -> None:
        raise NotImplementedError

    async def aenqueue_batch(self, tss: Sequence[float]) -> None:
        raise NotImplementedError

    def enqueue_delayed(self, due_ts: float, delay_s: float) -> float | None:
        """Enqueue a job that runs ``delay_s`` from now; its argument is ``due_ts``.

        Returns the due time actually requested when the peer's API cannot
        express ``due_ts`` exactly (the task must then carry that one), else None.
        """
        raise NotImplementedError

    async def aenqueue_delayed(self, due_ts: float, delay_s: float) -> float | None:
        """Async twin of :meth:`enqueue_delayed`."""
        raise NotImplementedError

    def run_worker(self, profile: str, burst: bool) -> None:
        """Run (or ``exec``) a worker in the foreground until signalled."""
        raise NotImplementedError

    def version(self) -> str:
        from importlib.metadata import version

        return version(self.dist)

    # ---- protocol commands (shared) ---------------------------------------------
    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version(),
            "modes": list(self.modes),
            "profiles": {k: asdict(v) for k, v in self.profiles.items()},
            "notes": list(self.notes),
            "delayed": {
                "mode": self.delayed,
                "api": self.delayed_api,
                "profile": self.delayed_profile,
            },
        }

    def time_enqueue(self, mode: str, n: int, runs: int) -> dict[str, list[float]]:
        """Per run: seconds to enqueue *n* jobs in *mode* (``secs``) and the Redis
        server's CPU seconds meanwhile (``server_cpu``), after one warm-up call."""
        if mode in SYNC_MODES:
            self._setup_once()
            self._sync_send(mode, 1)  # warm-up: connect, load scripts
            runs_out = [self._timed(lambda: self._sync_send(mode, n)) for _ in range(runs)]
        else:
            runs_out = asyncio.run(self._atime_enqueue(mode, n, runs))
        return {"secs": [s for s, _ in runs_out], "server_cpu": [c for _, c in runs_out]}

    def fill(self, n: int) -> str:
        """Enqueue *n* jobs by the fastest available API; returns the mode used."""
        mode = next(m for m in ("bulk", "abulk", "sync", "async") if m in self.modes)
        if mode in SYNC_MODES:
            self._setup_once()
            self._sync_send(mode, n, FILL_BATCH)
        else:
            asyncio.run(self._arun(lambda: self._async_send(mode, n, FILL_BATCH)))
        return mode

    def latency(self, n: int, interval: float) -> None:
        """Enqueue *n* probes carrying their enqueue time, *interval* s apart."""
        calls: list[str] = []  # "<ts> <seconds the enqueue call took>" per probe
        if "sync" in self.modes:
            self._setup_once()
            for _ in range(n):
                ts = time.time()
                self.enqueue_one(ts)
                calls.append(f"{ts!r} {time.time() - ts!r}")
                time.sleep(interval)
        else:
            async def probes() -> None:
                for _ in range(n):
                    ts = time.time()
                    await self.aenqueue_one(ts)
                    calls.append(f"{ts!r} {time.time() - ts!r}")
                    await asyncio.sleep(interval)

            asyncio.run(self._arun(probes))
        if calls:  # after the probes, so that recording them delays none
            common.note_calls(calls)

    def send_delayed(self, n: int, interval: float, low: float, high: float) -> float:
        """Enqueue *n* delayed probes *interval* s apart; returns the last due time.

        Each probe's argument is its due time (enqueue time + delay), so the task
        body records lateness (``started - due``; negative = started early).
        """
        last_due = 0.0

        def one(i: int) -> tuple[float, float]:
            delay = delay_for(i, low, high)
            return time.time() + delay, delay

        if self.delayed == "sync":
            self._setup_once()
            for i in range(n):
                due, delay = one(i)
                last_due = max(last_due, self.enqueue_delayed(due, delay) or due)
                time.sleep(interval)
            return last_due

        async def probes() -> float:
            nonlocal last_due
            for i in range(n):
                due, delay = one(i)
                last_due = max(last_due, await self.aenqueue_delayed(due, delay) or due)
                await asyncio.sleep(interval)
            return last_due

        return float(asyncio.run(self._arun(probes)))

    # ---- helpers -------------------------------------------------------------------
    _is_setup = False

    def _setup_once(self) -> None:
        if not self._is_setup:
            self.setup()
            self._is_setup = True

    @staticmethod
    def _timed(fn: Any) -> tuple[float, float]:
        """(wall seconds, server CPU seconds) of ``fn()``; /proc is read outside the timing."""
        c0 = server_cpu_seconds()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        return t1 - t0, server_cpu_seconds() - c0

    def _sync_send(self, mode: str, n: int, batch: int = BULK_BATCH) -> None:
        if mode == "sync":
            for _ in range(n):
                self.enqueue_one(0.0)
            return
        for start in range(0, n, batch):
            self.enqueue_batch([0.0] * min(batch, n - start))

    async def _async_send(self, mode: str, n: int, batch: int = BULK_BATCH) -> None:
        if mode == "async":
            for _ in range(n):
                await self.aenqueue_one(0.0)
            return
        for start in range(0, n, batch):
            await self.aenqueue_batch([0.0] * min(batch, n - start))

    async def _arun(self, body: Any) -> Any:
        await self.asetup()
        try:
            return await body()
        finally:
            await self.ateardown()

    async def _atime_enqueue(self, mode: str, n: int, runs: int) -> list[tuple[float, float]]:
        async def body() -> list[tuple[float, float]]:
            await self._async_send(mode, 1)
            out = []
            for _ in range(runs):
                c0 = server_cpu_seconds()
                t0 = time.perf_counter()
                await self._async_send(mode, n)
                t1 = time.perf_counter()
                out.append((t1 - t0, server_cpu_seconds() - c0))
            return out

        out: list[tuple[float, float]] = await self._arun(body)
        return out
