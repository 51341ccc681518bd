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
CALLS_KEY = "bench:latency:calls"


def _probes(raw: list[bytes]) -> dict[str, float]:
    """``"<enqueued> <seconds>"`` entries as {enqueued: ms}."""
    out: dict[str, float] = {}
    for entry in raw:
        ts, seconds = entry.decode().split(" ")
        out[ts] = float(seconds) * 1000
    return out
BODY_ENV = "BENCH_BODY"  # must match drivers/common.py
BODIES = {"incr": "", "free": "_free"}
"""Task bodies and their result-key suffix: one INCR per job, or nearly free."""
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
    mem_jobs_large: int = 1_000_000
    """Queued jobs for the second memory figure: conveyor always, a peer only when
    its fastest enqueue rate fills them within ``mem_large_budget_s``."""
    mem_large_budget_s: float = 30.0
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
    peer_budget_s: float = 480.0

    @classmethod
    def quick(cls, **overrides: Any) -> Options:
        base: dict[str, Any] = {
            "jobs": 2_000,
            "runs": 1,
            "enqueue_jobs": 500,
            "mem_jobs": 2_000,
            "mem_jobs_large": 20_000,
            "latency_samples": 50,
            "idle_seconds": 3.0,
            "delayed_jobs": 30,
            "drain_cap_s": 15.0,
            "peer_budget_s": 180.0,
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
        self.poll_cpu_s = server.poll_cpu_seconds(COUNTER_KEY)
        self.polls = 0
        """GETs of the counter by :meth:`_wait_for`, whose server CPU a drain subtracts."""

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
        cpu_profile = "best" if "best" in profiles else "default"
        drains = [("default", "incr"), ("best", "incr"), ("best", "free")]
        for profile, body in drains:
            key = f"drain_{profile}{BODIES[body]}"
            keys = [key] + ([f"cpu_drain{BODIES[body]}"] if profile == cpu_profile else [])
            if snap is None:
                for k in keys:
                    self.result.values[k] = Value(reason="no filled queue")
            elif profile in profiles:
                self._step(keys, functools.partial(self.drain, profile, snap, body))
        del snap  # the large fill below reuses the server
        self._step(["mem_per_job_large"], self.memory_large)
        self._step(["lat_p50", "lat_p99", "ret_p50", "ret_p99", "idle_cmds", "idle_cpu"],
                   self.latency_and_idle)
        self._step(list(DELAYED_KEYS), self.delayed_lateness)
        self._sum_cpu()
        return self.result

    def _sum_cpu(self) -> None:
        """Single enqueue plus drain: what one job costs the Redis server end to end."""
        enq, drain = self.result.value("cpu_enq"), self.result.value("cpu_drain")
        if enq.number is None or drain.number is None:
            missing = "enqueue" if enq.number is None else "drain"
            self.result.values["cpu_total"] = Value(reason=f"no {missing} figure")
        else:
            self.result.values["cpu_total"] = Value(enq.number + drain.number)

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
        out = self.h.call(
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
            rates = [n / s for s in out[mode]["secs"] if s > 0]
            self.result.values[MODE_METRIC[mode]] = Value.median(rates)
            self.log(f"  [{self.h.spec.name}] enqueue {mode}: {statistics.median(rates):,.0f}/s")
        for mode, key in MODE_METRIC.items():
            if mode not in modes:
                self.result.values[key] = Value(reason="no such API")
        single = "sync" if "sync" in modes else "async" if "async" in modes else None
        if single is None:
            self.result.values["cpu_enq"] = Value(reason="no single enqueue API")
            return
        cpu = [1e6 * c / n for c in out[single]["server_cpu"]]
        if not any(cpu):
            raise StepError("no server CPU reading (BENCH_REDIS_PID unset?)")
        self.result.values["cpu_enq"] = Value.median(cpu)
        self.log(f"  [{self.h.spec.name}] Redis CPU, enqueue {single}: "
                 f"{statistics.median(cpu):.1f} us/job")  # fmt: skip

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

    def _fill(self, n: int, timeout: float | None = None) -> None:
        self.h.call("fill", "--n", str(n), timeout=timeout or 60 + n * 0.01)

    def memory_large(self) -> None:
        """Memory per job at ``mem_jobs_large`` queued: conveyor always, peers if quick to fill.

        The fill rate is predicted from the fastest enqueue figure measured above
        (fill sends batches of 1000, so it is if anything faster than that).
        """
        n, budget = self.opts.mem_jobs_large, self.opts.mem_large_budget_s
        rates = [v.number for k in MODE_METRIC.values() if (v := self.result.value(k)).number]
        if self.h.spec.name != "conveyor":
            if not rates:
                raise StepError("no enqueue rate to predict the fill time")
            predicted = n / max(rates)
            if predicted > budget:
                raise StepError(f"skipped: filling {n:,} would take ~{predicted:.0f} s")
        self.server.flush()
        before = self.server.used_memory()
        self._fill(n, timeout=60 + 10 * budget)
        per_job = (self.server.used_memory() - before) / n
        self.result.values["mem_per_job_large"] = Value(per_job)
        self.log(f"  [{self.h.spec.name}] memory at {n:,} queued: {per_job:,.0f} B/job")

    # ------------------------------------------------------------------ drain
    def drain(self, profile: str, snap: snapshot.Snapshot, body: str = "incr") -> None:
        copies = int(self.info["profiles"][profile]["copies"])
        rates: list[float] = []
        cpus: list[float] = []
        partial = False
        t0 = time.monotonic()
        for _ in range(self.opts.runs):
            rate, partial, cpu = self._drain_once(profile, copies, snap, body)
            rates.append(rate)
            cpus.append(cpu)
            # A peer that hit the cap won't finish on the next run either; and a
            # slow peer gets fewer runs rather than stalling the whole benchmark.
            if partial or time.monotonic() - t0 > self.opts.drain_budget_s:
                break
        suffix = BODIES[body]
        value = Value.median(rates, partial=partial)
        self.result.values[f"drain_{profile}{suffix}"] = value
        if profile == ("best" if "best" in self.info["profiles"] else "default"):
            # per completed job: a run cut by the cap still gives a fair figure
            self.result.values[f"cpu_drain{suffix}"] = Value.median(cpus)
        self.log(
            f"  [{self.h.spec.name}] drain {profile}, {body} body: {value.number:,.0f}/s, "
            f"Redis CPU {statistics.median(cpus):.1f} us/job, {len(rates)} run(s)"
            + (" (partial: time cap)" if partial else "")
        )

    def _drain_once(
        self, profile: str, copies: int, snap: snapshot.Snapshot, body: str
    ) -> tuple[float, bool, float]:
        """Rate from the first completion to the last (worker start-up excluded), whether
        the cap cut the run, and the server's CPU per job over that same stretch, in
        microseconds, less what the harness's own counter polls cost it.
        """
        snapshot.restore(self.server.client, snap)
        target = self.opts.jobs
        group = self._start(profile, copies, burst=True, body=body)
        try:
            t_first, c_first = self._wait_for(group, 1, STARTUP_TIMEOUT_S)
            cpu_first, polls_first = self.server.cpu_seconds(), self.polls
            t_end, c_end = self._wait_for(group, target, self.opts.drain_cap_s, strict=False)
            cpu = self.server.cpu_seconds() - cpu_first
            cpu -= (self.polls - polls_first) * self.poll_cpu_s
        finally:
            group.stop()
        if c_end <= c_first or t_end <= t_first:
            raise StepError(f"no progress after the first job ({c_end}/{target})")
        per_job_us = 1e6 * max(cpu, 0.0) / (c_end - c_first)
        return (c_end - c_first) / (t_end - t_first), c_end < target, per_job_us

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
        ret50s: list[float] = []
        ret99s: list[float] = []
        for run in range(self.opts.runs):
            self.server.client.delete(LATENCY_KEY, CALLS_KEY)
            self.h.call(
                "latency",
                "--n",
                str(n),
                "--interval",
                str(self.opts.latency_interval),
                timeout=60 + n * self.opts.latency_interval * 2,
            )
            self._wait_for(group, 1 + n * (run + 1), 30.0)
            starts = _probes(self.server.client.lrange(LATENCY_KEY, 0, -1))
            samples = list(starts.values())
            p50s.append(percentile(samples, 0.50))
            p99s.append(percentile(samples, 0.99))
            # The same probes timed from when the enqueue call returned.
            calls = _probes(self.server.client.lrange(CALLS_KEY, 0, -1))
            after = [starts[ts] - calls[ts] for ts in starts if ts in calls]
            if after:
                ret50s.append(percentile(after, 0.50))
                ret99s.append(percentile(after, 0.99))
        self.result.values["lat_p50"] = Value.median(p50s)
        self.result.values["lat_p99"] = Value.median(p99s)
        if ret50s:
            self.result.values["ret_p50"] = Value.median(ret50s)
            self.result.values["ret_p99"] = Value.median(ret99s)
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
            samples = list(_probes(self.server.client.lrange(LATENCY_KEY, 0, -1)).values())
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

    def _start(self, profile: str, copies: int, burst: bool, body: str = "incr") -> WorkerGroup:
        argv = self.h.worker_argv(profile, burst)
        env = {**self.h.env, BODY_ENV: body}
        return start_workers([argv] * copies, env, REPO_ROOT, self.h.worker_log)

    def _wait_for(
        self, group: WorkerGroup, target: int, timeout: float, strict: bool = True
    ) -> tuple[float, int]:
        """Poll the counter until it reaches *target*; returns (time, count)."""
        deadline = time.monotonic() + timeout
        while True:
            count = self.server.counter(COUNTER_KEY)
            self.polls += 1
            now = time.monotonic()
            if count >= target:
                return now, count
            if not group.alive():
                # The last worker may have added its final count on its way out, after
                # the read above: read once more now that nothing can add to it.
                count = self.server.counter(COUNTER_KEY)
                if count >= target:
                    return time.monotonic(), count
                raise StepError(f"worker exited at {count}/{target}: {group.log_tail()}")
            if now > deadline:
                if strict:
                    raise StepError(f"timed out at {count}/{target}: {group.log_tail()}")
                return now, count
            time.sleep(POLL_S)
