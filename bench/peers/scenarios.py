"""The measurements, identical for every peer.

Each step records its own failure in the affected rows and the next step
goes on, so a peer that, say, cannot start a worker still gets its enqueue
and memory figures.  Completion is always read from Redis
(:data:`COUNTER_KEY`), never from the peer.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import snapshot
from .driver_handle import DriverError, DriverHandle
from .procs import WorkerGroup, start_workers
from .redis_server import RedisServer
from .results import MODE_METRIC, PeerResult, Value
from .venvs import REPO_ROOT

COUNTER_KEY = "bench:done"  # must match drivers/common.py
LATENCY_KEY = "bench:latency"
DELAYED_KEYS = ("late_p50", "late_p99", "late_early")
POLL_S = 0.005
STARTUP_TIMEOUT_S = 60.0


class StepError(RuntimeError):
    """A measurement step could not produce a figure."""


@dataclass(frozen=True)
class Options:
    """Workload sizes; ``--quick`` shrinks them."""

    jobs: int = 20_000
    runs: int = 3
    enqueue_jobs: int = 3_000
    mem_jobs: int = 10_000
    latency_samples: int = 200
    latency_interval: float = 0.02
    idle_seconds: float = 10.0
    drain_cap_s: float = 30.0
    drain_budget_s: float = 30.0
    """Stop repeating a drain config once its runs took this long in total."""
    delayed_jobs: int = 100
    """Delayed probes per run, ``delayed_interval`` s apart."""
    delayed_interval: float = 0.05
    delayed_min_s: float = 0.2
    delayed_max_s: float = 1.0
    delayed_cap_s: float = 10.0
    """A probe not started this long after the last one was due fails the step."""
    peer_budget_s: float = 360.0

    @classmethod
    def quick(cls, **overrides: Any) -> Options:
        base: dict[str, Any] = {
            "jobs": 2_000,
            "runs": 1,
            "enqueue_jobs": 500,
            "mem_jobs": 2_000,
            "latency_samples": 50,
            "idle_seconds": 3.0,
            "delayed_jobs": 30,
            "drain_cap_s": 15.0,
            "peer_budget_s": 120.0,
        }
        base.update(overrides)
        return cls(**base)


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation: p99 of 200 is the 198th)."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


class PeerBench:
    """Runs every scenario for one peer against the shared Redis server."""

    def __init__(
        self, handle: DriverHandle, server: RedisServer, opts: Options, log: Callable[[str], None]
    ) -> None:
        self.h = handle
        self.server = server
        self.opts = opts
        self.log = log
        self.result = PeerResult(handle.spec.name, handle.spec.title)
        self.deadline = time.monotonic() + opts.peer_budget_s
        self.info: dict[str, Any] = {}
        self.info_overhead = self._calibrate_info()

    # ------------------------------------------------------------------ orchestration
    def run(self) -> PeerResult:
        try:
            self.info = self.h.call("describe", timeout=120)
        except DriverError as exc:
            self.result.status = f"n/a: {exc}"
            return self.result
        self.result.version = str(self.info["version"])
        profiles = self.info["profiles"]
        self.result.config = [f"{k}: {v['description']}" for k, v in profiles.items()]
        self.result.config += list(self.info.get("notes", []))
        delayed = self.info.get("delayed") or {}
        prefix = "delayed jobs: " if delayed.get("mode") else "delayed jobs: n/a -- "
        self.result.config.append(prefix + str(delayed.get("api", "no delayed jobs")))
        self._step(list(MODE_METRIC.values()), self.enqueue_rates)
        snap = self._step(["mem_per_job"], self.fill_and_snapshot)
        for profile in ("default", "best"):
            key = f"drain_{profile}"
            if snap is None:
                self.result.values[key] = Value(reason="no filled queue")
            elif profile in profiles:
                self._step([key], functools.partial(self.drain, profile, snap))
        self._step(["lat_p50", "lat_p99", "idle_cmds", "idle_cpu"], self.latency_and_idle)
        self._step(list(DELAYED_KEYS), self.delayed_lateness)
        return self.result

    def _step(self, keys: list[str], fn: Callable[[], Any]) -> Any:
        """Run *fn*; on failure mark *keys* with the reason and carry on."""
        if time.monotonic() > self.deadline:
            for k in keys:
                self.result.values.setdefault(k, Value(reason="skipped: time budget"))
            return None
        try:
            return fn()
        except (StepError, DriverError) as exc:
            self.log(f"  [{self.h.spec.name}] {keys[0]}...: {exc}")
            for k in keys:
                self.result.values.setdefault(k, Value(reason=str(exc)))
            return None
        finally:
            self.server.flush()

    # ------------------------------------------------------------------ enqueue
    def enqueue_rates(self) -> None:
        modes = list(self.info["modes"])
        n, runs = self.opts.enqueue_jobs, self.opts.runs
        self.server.flush()
        timeout = 60 + 0.05 * n * runs * len(modes)
        secs = self.h.call(
            "enqueue",
            "--modes",
            ",".join(modes),
            "--n",
            str(n),
            "--runs",
            str(runs),
            timeout=timeout,
        )
        for mode in modes:
            rates = [n / s for s in secs[mode] if s > 0]
            self.result.values[MODE_METRIC[mode]] = Value.median(rates)
            self.log(f"  [{self.h.spec.name}] enqueue {mode}: {statistics.median(rates):,.0f}/s")
        for mode, key in MODE_METRIC.items():
            if mode not in modes:
                self.result.values[key] = Value(reason="no such API")

    # ------------------------------------------------------------------ memory / fill
    def fill_and_snapshot(self) -> snapshot.Snapshot:
        """Fill ``mem_jobs`` (measuring memory), top up to ``jobs``, snapshot."""
        self.server.flush()
        mem_jobs = min(self.opts.mem_jobs, self.opts.jobs)
        before = self.server.used_memory()
        self._fill(mem_jobs)
        per_job = (self.server.used_memory() - before) / mem_jobs
        self.result.values["mem_per_job"] = Value(per_job)
        self.log(f"  [{self.h.spec.name}] memory: {per_job:,.0f} B/job")
        if self.opts.jobs > mem_jobs:
            self._fill(self.opts.jobs - mem_jobs)
        if self.server.counter(COUNTER_KEY):
            raise StepError("jobs ran during fill (is a worker still alive?)")
        return snapshot.take(self.server.client)

    def _fill(self, n: int) -> None:
        self.h.call("fill", "--n", str(n), timeout=60 + n * 0.01)

    # ------------------------------------------------------------------ drain
    def drain(self, profile: str, snap: snapshot.Snapshot) -> None:
        copies = int(self.info["profiles"][profile]["copies"])
        rates: list[float] = []
        partial = False
        t0 = time.monotonic()
        for _ in range(self.opts.runs):
            rate, partial = self._drain_once(profile, copies, snap)
            rates.append(rate)
            # A peer that hit the cap won't finish on the next run either; and a
            # slow peer gets fewer runs rather than stalling the whole benchmark.
            if partial or time.monotonic() - t0 > self.opts.drain_budget_s:
                break
        value = Value.median(rates, partial=partial)
        self.result.values[f"drain_{profile}"] = value
        self.log(
            f"  [{self.h.spec.name}] drain {profile}: {value.number:,.0f}/s, {len(rates)} run(s)"
            + (" (partial: time cap)" if partial else "")
        )

    def _drain_once(self, profile: str, copies: int, snap: snapshot.Snapshot) -> tuple[float, bool]:
        """Rate from the first completion to the last (worker start-up excluded)."""
        snapshot.restore(self.server.client, snap)
        target = self.opts.jobs
        group = self._start(profile, copies, burst=True)
        try:
            t_first, c_first = self._wait_for(group, 1, STARTUP_TIMEOUT_S)
            t_end, c_end = self._wait_for(group, target, self.opts.drain_cap_s, strict=False)
        finally:
            group.stop()
        if c_end <= c_first or t_end <= t_first:
            raise StepError(f"no progress after the first job ({c_end}/{target})")
        return (c_end - c_first) / (t_end - t_first), c_end < target

    # ------------------------------------------------------------------ latency / idle
    def latency_and_idle(self) -> None:
        self.server.flush()
        group = self._start("default", 1, burst=False)
        try:
            self.h.call("latency", "--n", "1", "--interval", "0", timeout=60)
            self._wait_for(group, 1, STARTUP_TIMEOUT_S)
            self._latency(group)
            self._idle(group)
        finally:
            group.stop()

    def _latency(self, group: WorkerGroup) -> None:
        n, p50s, p99s = self.opts.latency_samples, [], []
        for run in range(self.opts.runs):
            self.server.client.delete(LATENCY_KEY)
            self.h.call(
                "latency",
                "--n",
                str(n),
                "--interval",
                str(self.opts.latency_interval),
                timeout=60 + n * self.opts.latency_interval * 2,
            )
            self._wait_for(group, 1 + n * (run + 1), 30.0)
            samples = [float(x) * 1000 for x in self.server.client.lrange(LATENCY_KEY, 0, -1)]
            p50s.append(percentile(samples, 0.50))
            p99s.append(percentile(samples, 0.99))
        self.result.values["lat_p50"] = Value.median(p50s)
        self.result.values["lat_p99"] = Value.median(p99s)
        self.log(
            f"  [{self.h.spec.name}] latency p50 {statistics.median(p50s):.2f} ms, "
            f"p99 {statistics.median(p99s):.2f} ms"
        )

    def _idle(self, group: WorkerGroup) -> None:
        """Median over ``runs`` windows that together last ``idle_seconds``."""
        time.sleep(2.0)  # let post-job housekeeping settle
        window = self.opts.idle_seconds / self.opts.runs
        cmds, cpus = [], []
        for _ in range(self.opts.runs):
            c0, cpu0, t0 = self.server.commands_processed(), group.cpu_seconds(), time.monotonic()
            time.sleep(window)
            c1, cpu1, t1 = self.server.commands_processed(), group.cpu_seconds(), time.monotonic()
            cmds.append(max(0.0, c1 - c0 - self.info_overhead) / (t1 - t0))
            cpus.append(100.0 * (cpu1 - cpu0) / (t1 - t0))
        if not group.alive():
            raise StepError(f"worker died while idle: {group.log_tail()}")
        self.result.values["idle_cmds"] = Value.median(cmds)
        self.result.values["idle_cpu"] = Value.median(cpus)
        self.log(
            f"  [{self.h.spec.name}] idle: {statistics.median(cmds):.1f} cmd/s, "
            f"{statistics.median(cpus):.2f}% CPU"
        )

    # ------------------------------------------------------------------ delayed jobs
    def delayed_lateness(self) -> None:
        """Lateness of delayed jobs on one idle worker (default profile).

        Each probe carries its due time (enqueue time + delay) and the task
        records ``started - due``; a negative sample is a job that started early.
        """
        spec = self.info.get("delayed") or {}
        if not spec.get("mode"):
            for k in DELAYED_KEYS:
                self.result.values[k] = Value(reason=str(spec.get("api") or "no delayed jobs"))
            return
        self.server.flush()
        group = self._start(str(spec.get("profile") or "default"), 1, burst=False)
        try:
            self.h.call("latency", "--n", "1", "--interval", "0", timeout=60)
            self._wait_for(group, 1, STARTUP_TIMEOUT_S)
            self._delayed_runs(group)
        finally:
            group.stop()

    def _delayed_runs(self, group: WorkerGroup) -> None:
        o = self.opts
        n, p50s, p99s, early, earliest = o.delayed_jobs, [], [], 0, math.inf
        for run in range(o.runs):
            self.server.client.delete(LATENCY_KEY)
            sent = self.h.call(
                "delayed",
                "--n", str(n),
                "--interval", str(o.delayed_interval),
                "--min-delay", str(o.delayed_min_s),
                "--max-delay", str(o.delayed_max_s),
                timeout=60 + n * o.delayed_interval * 2,
            )  # fmt: skip
            wait = max(0.0, float(sent["last_due"]) - time.time()) + o.delayed_cap_s
            target = 1 + n * (run + 1)
            _, count = self._wait_for(group, target, wait, strict=False)
            if count < target:
                raise StepError(
                    f"{target - count} of {n} delayed jobs had not started "
                    f"{o.delayed_cap_s:.0f}s after the last was due"
                )
            samples = [float(x) * 1000 for x in self.server.client.lrange(LATENCY_KEY, 0, -1)]
            p50s.append(percentile(samples, 0.50))
            p99s.append(percentile(samples, 0.99))
            early += sum(1 for x in samples if x < 0)
            earliest = min(earliest, *samples)
        self.result.values["late_p50"] = Value.median(p50s)
        self.result.values["late_p99"] = Value.median(p99s)
        self.result.values["late_early"] = Value(float(early))
        self.log(
            f"  [{self.h.spec.name}] delayed lateness p50 {statistics.median(p50s):.2f} ms, "
            f"p99 {statistics.median(p99s):.2f} ms, {early}/{n * o.runs} early "
            f"(earliest {earliest:.1f} ms)"
        )
        if early:
            self.result.config.append(
                f"delayed: {early} of {n * o.runs} jobs started before due, the earliest "
                f"{-earliest:.0f} ms before"
            )

    # ------------------------------------------------------------------ helpers
    def _calibrate_info(self) -> int:
        """Commands our own back-to-back INFO calls add (subtracted when idle)."""
        a = self.server.commands_processed()
        b = self.server.commands_processed()
        return b - a

    def _start(self, profile: str, copies: int, burst: bool) -> WorkerGroup:
        argv = self.h.worker_argv(profile, burst)
        return start_workers([argv] * copies, self.h.env, REPO_ROOT, self.h.worker_log)

    def _wait_for(
        self, group: WorkerGroup, target: int, timeout: float, strict: bool = True
    ) -> tuple[float, int]:
        """Poll the counter until it reaches *target*; returns (time, count)."""
        deadline = time.monotonic() + timeout
        while True:
            count = self.server.counter(COUNTER_KEY)
            now = time.monotonic()
            if count >= target:
                return now, count
            if not group.alive():
                raise StepError(f"worker exited at {count}/{target}: {group.log_tail()}")
            if now > deadline:
                if strict:
                    raise StepError(f"timed out at {count}/{target}: {group.log_tail()}")
                return now, count
            time.sleep(POLL_S)
