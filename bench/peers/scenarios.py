"""The measurements, identical for every peer.

Each step records its own failure in the affected rows and the next step
goes on, so a peer that, say, cannot start a worker still gets its enqueue
and memory figures.  Completion is always read from Redis
(:data:`COUNTER_KEY`), never from the peer.

A :class:`PeerBench` lives for the whole run and measures one sample of each
figure per round (:meth:`PeerBench.run_round`); cli.py runs the peers in turn
within each round, so a slow spell of a shared machine hits them alike.
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
from .options import Options
from .procs import WorkerGroup, start_workers
from .redis_server import RedisServer
from .results import MODE_METRIC, PeerResult
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
class DrainRun:
    """One drain run; CPU figures are microseconds per job drained."""

    rate: float
    partial: bool
    """The run hit ``drain_cap_s``: the rate is what was reached until then."""
    server_cpu_us: float
    worker_cpu_us: float


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
        self.deadline = 0.0
        self.info: dict[str, Any] = {}
        self.snap: snapshot.Snapshot | None = None
        """The filled queue, taken once and restored before every drain of every round."""
        self.capped: set[str] = set()
        """Drain configurations that hit the cap: they would again, so they run no more."""
        self.this_round: dict[str, float] = {}
        self.delayed_sent = 0
        self.early = 0
        self.earliest = math.inf
        self.info_overhead = self._calibrate_info()
        self.poll_cpu_s = server.poll_cpu_seconds(COUNTER_KEY)
        self.polls = 0
        """GETs of the counter by :meth:`_wait_for`, whose server CPU a drain subtracts."""

    # ------------------------------------------------------------------ orchestration
    def describe(self) -> bool:
        """Ask the driver what the peer offers; ``False`` (column n/a) if it cannot say."""
        try:
            self.info = self.h.call("describe", timeout=120)
        except DriverError as exc:
            self.result.status = f"n/a: {exc}"
            return False
        self.result.version = str(self.info["version"])
        profiles = self.info["profiles"]
        self.result.config = [f"{k}: {v['description']}" for k, v in profiles.items()]
        self.result.config += list(self.info.get("notes", []))
        delayed = self.info.get("delayed") or {}
        prefix = "delayed jobs: " if delayed.get("mode") else "delayed jobs: n/a -- "
        self.result.config.append(prefix + str(delayed.get("api", "no delayed jobs")))
        return True

    def run_round(self, first: bool) -> None:
        """One sample of every figure; memory is measured in the *first* round only
        (it hardly moves, and the large fill is the slowest step)."""
        self.deadline = time.monotonic() + self.opts.peer_budget_s
        self.this_round = {}
        self._step(list(MODE_METRIC.values()), self.enqueue_rates)
        if self.snap is None:
            self.snap = self._step(["mem_per_job"], self.fill_and_snapshot)
        profiles = self.info["profiles"]
        for profile, body in [("default", "incr"), ("best", "incr"), ("best", "free")]:
            keys = self._drain_keys(profile, body)
            if self.snap is None:
                for k in keys:
                    self.result.fail(k, "no filled queue")
            elif profile in profiles:
                self._step(keys, functools.partial(self.drain, profile, self.snap, body))
        if first:
            self._step(["mem_per_job_large"], self.memory_large)
        self._step(["lat_p50", "lat_p99", "ret_p50", "ret_p99", "idle_cmds", "idle_cpu"],
                   self.latency_and_idle)
        self._step(list(DELAYED_KEYS), self.delayed_lateness)
        self._sum_cpu()

    def finish(self) -> PeerResult:
        """The column, with what the rounds add to its notes."""
        if self.early:
            self.result.config.append(
                f"delayed: {self.early} of {self.delayed_sent} jobs "
                f"started before due, the earliest {-self.earliest:.0f} ms before"
            )
        return self.result

    def _drain_keys(self, profile: str, body: str) -> list[str]:
        suffix = BODIES[body]
        keys = [f"drain_{profile}{suffix}", f"wcpu_{profile}{suffix}"]
        if profile == self._cpu_profile():
            keys.append(f"cpu_drain{suffix}")
        return keys

    def _cpu_profile(self) -> str:
        return "best" if "best" in self.info["profiles"] else "default"

    def _record(self, key: str, sample: float, partial: bool = False) -> None:
        self.result.record(key, sample, partial)
        self.this_round[key] = sample

    def _sum_cpu(self) -> None:
        """Single enqueue plus drain: what one job costs the Redis server end to end
        (both from this round)."""
        enq, drain = self.this_round.get("cpu_enq"), self.this_round.get("cpu_drain")
        if enq is None or drain is None:
            self.result.fail("cpu_total", f"no {'enqueue' if enq is None else 'drain'} figure")
        else:
            self._record("cpu_total", enq + drain)

    def _step(self, keys: list[str], fn: Callable[[], Any]) -> Any:
        """Run *fn*; on failure mark *keys* with the reason and carry on."""
        if time.monotonic() > self.deadline:
            for k in keys:
                self.result.fail(k, "skipped: time budget")
            return None
        try:
            return fn()
        except (StepError, DriverError) as exc:
            self.log(f"  [{self.h.spec.name}] {keys[0]}...: {exc}")
            for k in keys:
                self.result.fail(k, str(exc))
            return None
        finally:
            self.server.flush()

    # ------------------------------------------------------------------ enqueue
    def enqueue_rates(self) -> None:
        modes = list(self.info["modes"])
        n, runs = self.opts.enqueue_jobs, 1  # once per round
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
            if not rates:
                raise StepError(f"no time measured for {mode}")
            self._record(MODE_METRIC[mode], statistics.median(rates))
            self.log(f"  [{self.h.spec.name}] enqueue {mode}: {statistics.median(rates):,.0f}/s")
        for mode, key in MODE_METRIC.items():
            if mode not in modes:
                self.result.fail(key, "no such API")
        single = "sync" if "sync" in modes else "async" if "async" in modes else None
        if single is None:
            self.result.fail("cpu_enq", "no single enqueue API")
            return
        cpu = [1e6 * c / n for c in out[single]["server_cpu"]]
        if not any(cpu):
            raise StepError("no server CPU reading (BENCH_REDIS_PID unset?)")
        self._record("cpu_enq", statistics.median(cpu))
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
        self._record("mem_per_job", per_job)
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
        self._record("mem_per_job_large", per_job)
        self.log(f"  [{self.h.spec.name}] memory at {n:,} queued: {per_job:,.0f} B/job")

    # ------------------------------------------------------------------ drain
    def drain(self, profile: str, snap: snapshot.Snapshot, body: str = "incr") -> None:
        """One run of a drain configuration, unless an earlier round hit the cap."""
        rate_key, wcpu_key, *cpu_key = self._drain_keys(profile, body)
        if rate_key in self.capped:
            self.log(f"  [{self.h.spec.name}] drain {profile}, {body} body: "
                     "not run again (hit the time cap in an earlier round)")  # fmt: skip
            return
        copies = int(self.info["profiles"][profile]["copies"])
        run = self._drain_once(profile, copies, snap, body)
        self._record(rate_key, run.rate, run.partial)
        if run.partial:
            self.capped.add(rate_key)
        # per completed job: a run cut by the cap still gives a fair figure
        self._record(wcpu_key, run.worker_cpu_us)
        for key in cpu_key:
            self._record(key, run.server_cpu_us)
        self.log(
            f"  [{self.h.spec.name}] drain {profile}, {body} body: {run.rate:,.0f}/s, "
            f"Redis CPU {run.server_cpu_us:.1f} us/job, worker CPU {run.worker_cpu_us:.1f} us/job"
            + (" (partial: time cap)" if run.partial else "")
        )

    def _drain_once(
        self, profile: str, copies: int, snap: snapshot.Snapshot, body: str
    ) -> DrainRun:
        """Rate from the first completion to the last (worker start-up excluded), and
        the server's and the workers' CPU over that same stretch (the server's less
        what the harness's own counter polls cost it)."""
        snapshot.restore(self.server.client, snap)
        target = self.opts.jobs
        group = self._start(profile, copies, burst=True, body=body)
        try:
            t_first, c_first = self._wait_for(group, 1, STARTUP_TIMEOUT_S)
            cpu_first, polls_first = self.server.cpu_seconds(), self.polls
            workers_first = group.tree_cpu_seconds()
            t_end, c_end = self._wait_for(group, target, self.opts.drain_cap_s, strict=False)
            workers = group.tree_cpu_seconds() - workers_first
            cpu = self.server.cpu_seconds() - cpu_first
            cpu -= (self.polls - polls_first) * self.poll_cpu_s
        finally:
            group.stop()
        if c_end <= c_first or t_end <= t_first:
            raise StepError(f"no progress after the first job ({c_end}/{target})")
        jobs = c_end - c_first
        return DrainRun(
            rate=jobs / (t_end - t_first),
            partial=c_end < target,
            server_cpu_us=1e6 * max(cpu, 0.0) / jobs,
            worker_cpu_us=1e6 * max(workers, 0.0) / jobs,
        )

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
        n = self.opts.latency_samples
        self.server.client.delete(LATENCY_KEY, CALLS_KEY)
        self.h.call(
            "latency",
            "--n",
            str(n),
            "--interval",
            str(self.opts.latency_interval),
            timeout=60 + n * self.opts.latency_interval * 2,
        )
        self._wait_for(group, 1 + n, 30.0)
        starts = _probes(self.server.client.lrange(LATENCY_KEY, 0, -1))
        samples = list(starts.values())
        self._record("lat_p50", percentile(samples, 0.50))
        self._record("lat_p99", percentile(samples, 0.99))
        # The same probes timed from when the enqueue call returned.
        calls = _probes(self.server.client.lrange(CALLS_KEY, 0, -1))
        after = [starts[ts] - calls[ts] for ts in starts if ts in calls]
        if after:
            self._record("ret_p50", percentile(after, 0.50))
            self._record("ret_p99", percentile(after, 0.99))
        self.log(
            f"  [{self.h.spec.name}] latency p50 {percentile(samples, 0.50):.2f} ms, "
            f"p99 {percentile(samples, 0.99):.2f} ms"
        )

    def _idle(self, group: WorkerGroup) -> None:
        """One window per round; the rounds' windows together last ``idle_seconds``."""
        time.sleep(2.0)  # let post-job housekeeping settle
        window = self.opts.idle_seconds / self.opts.runs
        c0, cpu0, t0 = self.server.commands_processed(), group.cpu_seconds(), time.monotonic()
        time.sleep(window)
        c1, cpu1, t1 = self.server.commands_processed(), group.cpu_seconds(), time.monotonic()
        if not group.alive():
            raise StepError(f"worker died while idle: {group.log_tail()}")
        cmds = max(0.0, c1 - c0 - self.info_overhead) / (t1 - t0)
        cpu = 100.0 * (cpu1 - cpu0) / (t1 - t0)
        self._record("idle_cmds", cmds)
        self._record("idle_cpu", cpu)
        self.log(f"  [{self.h.spec.name}] idle: {cmds:.1f} cmd/s, {cpu:.2f}% CPU")

    # ------------------------------------------------------------------ delayed jobs
    def delayed_lateness(self) -> None:
        """Lateness of delayed jobs on one idle worker (default profile).

        Each probe carries its due time (enqueue time + delay) and the task
        records ``started - due``; a negative sample is a job that started early.
        """
        spec = self.info.get("delayed") or {}
        if not spec.get("mode"):
            for k in DELAYED_KEYS:
                self.result.fail(k, str(spec.get("api") or "no delayed jobs"))
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
        n = o.delayed_jobs
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
        _, count = self._wait_for(group, 1 + n, wait, strict=False)
        if count < 1 + n:
            raise StepError(
                f"{1 + n - count} of {n} delayed jobs had not started "
                f"{o.delayed_cap_s:.0f}s after the last was due"
            )
        samples = list(_probes(self.server.client.lrange(LATENCY_KEY, 0, -1)).values())
        early = sum(1 for x in samples if x < 0)
        self.delayed_sent += n
        self._record("late_p50", percentile(samples, 0.50))
        self._record("late_p99", percentile(samples, 0.99))
        self._record("late_early", float(early))
        self.early += early
        self.earliest = min(self.earliest, *samples)
        self.log(
            f"  [{self.h.spec.name}] delayed lateness p50 {percentile(samples, 0.50):.2f} ms, "
            f"p99 {percentile(samples, 0.99):.2f} ms, {early}/{n} early "
            f"(earliest {min(samples):.1f} ms)"
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
