"""A chaos run from start to end: private servers (one server for the jobs, or a Sentinel
set), worker processes, the producer and the fault schedule in their threads, a progress
display, then the settle, the checks and the report."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..sink import stream_events
from . import gather
from .faults import Fault, Injector, JobsRedis
from .fleet import Fleet, Slot
from .invariants import FINAL, Check, Evidence, check
from .producer import Producer
from .profiles import Profile
from .proxy import ProxyLink, open_proxy
from .report import print_report, write_failures, write_fault_log
from .sentinel import SentinelSet
from .servers import CLIENT_NAME, RedisProcess, SingleRedis, redis_server_binary
from .tasks import QUEUE, QUEUES, ChaosTasks

__all__ = ["ChaosRun"]

POLL = 0.5  # seconds between two looks at the jobs' states (progress, settle)
RETRY_GRACE = 15.0  # seconds a kind that found nothing to hit is tried again after the early round
ERRORS = (redis.exceptions.RedisError, OSError)
TOPOLOGY_NAMES = {"plain": "one server", "sentinel": "primary, replica, 3 sentinels"}
PROXY_KINDS = ("proxy-blackhole", "proxy-reset", "lost-reply")
NO_FAILOVER = "one server has no replica to promote (the sentinel topology injects it)"


class ChaosRun:
    """One run.

    :param profile: its shape
    :param seed: seeds the fault schedule and the jobs
    :param console: where the progress and the report go
    :param keep: keep the folder of logs even when every invariant held
    """

    def __init__(self, profile: Profile, seed: int, console: Console, keep: bool = False
                 ) -> None:
        self.profile = profile
        self.seed = seed
        self.console = console
        self.keep = keep
        self.stop = threading.Event()
        self.faults: list[Fault] = []
        self.errors: list[str] = []  # the run's own failures (a server that did not restart)
        self.skipped: dict[str, str] = {}
        self.folder = Path(tempfile.mkdtemp(prefix=f"conveyor-chaos-{seed}-"))
        self._finished = 0
        self.restarts = 0
        self._state_counts: dict[str, int] = {}

    def run(self) -> int:
        """Run, check and report; 0 when every invariant held, 1 otherwise."""
        binary = redis_server_binary()
        if binary is None:
            if os.environ.get("CONVEYOR_REDIS_SERVER"):
                raise RuntimeError("CONVEYOR_REDIS_SERVER names no file: "
                                   + os.environ["CONVEYOR_REDIS_SERVER"])
            raise RuntimeError("redis-server is not installed (Debian/Ubuntu: apt-get install"
                               " redis-server; macOS: brew install redis)")
        topology = self.profile.topology
        self.console.print(f"conveyor chaos: profile [bold]{self.profile.name}[/bold], topology"
                           f" [bold]{topology}[/bold] ({TOPOLOGY_NAMES[topology]}), seed"
                           f" [bold]{self.seed}[/bold] (logs in {self.folder})")
        servers: list[RedisProcess | JobsRedis] = []
        proxy: ProxyLink | None = None
        fleet: Fleet | None = None
        tasks: ChaosTasks | None = None
        routed: ChaosTasks | None = None
        try:
            target = self._jobs_redis(binary)
            servers.append(target)
            target.start()
            ledger = RedisProcess(binary, self.folder / "ledger", durable=False).start()
            servers.append(ledger)
            proxy = self._proxy(target)
            tasks = ChaosTasks(f"{target.url}?client_name={CLIENT_NAME}",
                               f"chaos-{self.seed}", ledger.url)
            if proxy is not None:  # the producer's batches that meet lost replies
                routed = ChaosTasks(f"{proxy.producer_url}?client_name={CLIENT_NAME}",
                                    f"chaos-{self.seed}", ledger.url)
            tasks.app.queue(QUEUE).set_limits(concurrency=self.profile.queue_cap,
                                              tenant_concurrency=self.profile.tenant_cap)
            for queue in QUEUES:  # the invariants count successes in the streams
                stream_events(tasks.app, queue)
            fleet = self._fleet(target.url, ledger, proxy)
            began = time.monotonic()
            producer = self._drive(target, fleet, tasks, proxy, routed)
            fleet.stop()
            self.restarts = fleet.restarts
            return self._verdict(tasks, producer, time.monotonic() - began, proxy)
        finally:
            self.stop.set()
            if fleet is not None:
                fleet.kill()
            for made in (tasks, routed):
                if made is not None:
                    made.close()
            if proxy is not None:
                proxy.close()
            for s in servers:
                s.stop()

    # -- set-up ----------------------------------------------------------------------------

    def _jobs_redis(self, binary: str) -> SingleRedis | SentinelSet:
        if self.profile.topology == "sentinel":
            return SentinelSet(binary, self.folder / "sentinel")
        return SingleRedis(binary, self.folder)

    def _proxy(self, target: SingleRedis | SentinelSet) -> ProxyLink | None:
        """The proxies in front of one worker and of half the producer's batches, to the
        server that is primary when a connection opens; records what is skipped."""
        if not isinstance(target, SentinelSet):
            self.skipped["failover"] = NO_FAILOVER
        proxy, reason = open_proxy(lambda: ("127.0.0.1", target.primary().port))
        if proxy is None:
            self.skipped.update(dict.fromkeys(PROXY_KINDS, reason))
        return proxy

    def _env(self, url: str, ledger: RedisProcess) -> dict[str, str]:
        env = dict(os.environ)
        env.update(CONVEYOR_REDIS_URL=url, CONVEYOR_CHAOS_LEDGER=ledger.url,
                   CONVEYOR_CHAOS_NAMESPACE=f"chaos-{self.seed}", PYTHONUNBUFFERED="1")
        return env

    def _fleet(self, server_url: str, ledger: RedisProcess, proxy: ProxyLink | None
               ) -> Fleet:
        p = self.profile
        slots = []
        for i in range(p.plain_workers):
            # The first worker reaches Redis through the proxy, when there is one.
            url = proxy.url if proxy is not None and i == 0 else server_url
            slots.append(Slot(f"worker{i}", self.folder, self._env(url, ledger),
                              p.concurrency, None))
        if p.supervised:
            slots.append(Slot("supervisor", self.folder, self._env(server_url, ledger),
                              p.concurrency, p.supervised))
        fleet = Fleet(slots)
        if proxy is not None:
            proxy.reach = p.concurrency
        fleet.start()
        return fleet

    # -- the run ---------------------------------------------------------------------------

    def _drive(self, target: JobsRedis, fleet: Fleet, tasks: ChaosTasks,
               proxy: ProxyLink | None, routed: ChaosTasks | None) -> Producer:
        producer = Producer(tasks, self.profile, random.Random(self.seed), self.stop, routed)
        injector = Injector(target, fleet, random.Random(self.seed + 1), producer.poison,
                            producer.cancel, self.stop, proxy,
                            cancel_running=producer.cancel_running,
                            limits=producer.change_limits, shards=producer.change_shards,
                            overwritten=producer.overwritten_keys)
        threads = [threading.Thread(target=producer.run, name="producer", daemon=True),
                   threading.Thread(target=self._schedule, args=(injector,), name="faults",
                                    daemon=True)]
        for t in threads:
            t.start()
        with Progress(TextColumn("{task.description:<8}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
                      console=self.console, transient=False) as progress:
            bar = progress.add_task("faults", total=self.profile.jobs, detail="")
            # Faults run for at most twice their time (kinds that found nothing to hit are
            # tried again); past that, the run's own machinery is stuck: say so, stop.
            p = self.profile
            give_up = time.monotonic() + 2 * p.fault_seconds + p.enqueue_seconds + 120
            while any(t.is_alive() for t in threads):
                if time.monotonic() > give_up:
                    stuck = ", ".join(t.name for t in threads if t.is_alive())
                    self.errors.append(f"the {stuck} thread(s) did not end in time;"
                                       f" {producer.enqueued} of {p.jobs} jobs enqueued")
                    self.stop.set()
                    break
                self._tick(fleet, tasks, producer, progress, bar)
            progress.update(bar, description="settle")
            deadline = time.monotonic() + self.profile.settle_seconds
            while not self.stop.is_set() and time.monotonic() < deadline:
                if self._tick(fleet, tasks, producer, progress, bar):
                    break
        for t in threads:
            t.join(30)
        return producer

    def _tick(self, fleet: Fleet, tasks: ChaosTasks, producer: Producer, progress: Progress,
              bar: Any) -> bool:
        """Restart dead workers, show progress; True once every job is final."""
        self.stop.wait(POLL)
        fleet.revive()
        jobs = producer.snapshot()
        try:
            found = gather.states(tasks.app.redis, tasks.app.keys,
                                  [job for _, job in jobs.values()])
        except ERRORS:
            found = None  # Redis is down or out of memory right now: show the last figures
        if found is not None:
            self._finished = sum(s in FINAL for s in found)
            self._state_counts = {s or "missing": found.count(s) for s in set(found)}
        last = self.faults[-1].kind if self.faults else "-"
        states = " ".join(f"{k} {v}" for k, v in sorted(self._state_counts.items())
                          if k not in FINAL)
        progress.update(bar, completed=self._finished, total=max(len(jobs), self.profile.jobs),
                        detail=f"faults {len(self.faults)} (last {last}) · {states or 'idle'}")
        return (found is not None and producer.enqueued >= self.profile.jobs
                and self._finished == len(jobs))

    def _schedule(self, injector: Injector) -> None:
        """Fault episodes one after another: each kind once early (in a random order), then
        at random by weight, until the profile's time is up. A kind that found nothing to
        hit (every worker restarting) is tried again, for at most twice the time, and at
        least :data:`RETRY_GRACE` seconds after the early round."""
        p, rng = self.profile, injector.rng
        kinds = injector.available(p.weights)
        last = [k for k in ("limits", "shards") if k in kinds]
        untried = sorted(k for k in kinds if k not in last)
        rng.shuffle(untried)
        # Last of the early round (popped from the end), so that the others keep the order
        # a seed gave them before these kinds came.
        untried[:0] = reversed(last)
        retry: list[str] = []
        began = time.monotonic()
        retry_until = 2 * p.fault_seconds  # pushed back if the early round itself runs late
        while not self.stop.is_set():
            elapsed = time.monotonic() - began
            if untried:
                retry_until = max(retry_until, elapsed + RETRY_GRACE)
            elif elapsed >= p.fault_seconds and (not retry or elapsed >= retry_until):
                return
            self.stop.wait(rng.uniform(*p.gap))
            if untried or retry:
                kind = (untried or retry).pop()
            else:
                kind = rng.choices(list(kinds), list(kinds.values()))[0]
            try:
                fault = injector.inject(kind)
            except Exception as exc:  # the run's own machinery failed: reported, not hidden
                self.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
                continue
            if fault is not None:
                self.faults.append(fault)
            elif kind not in {f.kind for f in self.faults}:
                retry.insert(0, kind)

    # -- the verdict -----------------------------------------------------------------------

    def _evidence(self, tasks: ChaosTasks, producer: Producer) -> Evidence:
        # A fresh client: on a Sentinel set it asks the sentinels again, so the evidence is
        # read from the primary, never from a connection left on a demoted one.
        tasks.app.close()
        client = tasks.app.redis
        jobs = producer.snapshot()
        records = gather.job_records(client, tasks.app.keys, jobs)
        known = {job.short_id for _, job in jobs.values()}
        stray, counters, children = [], {}, Counter[str]()
        for queue in (s for q in QUEUES for s in tasks.app.queue(q).served()):
            keys = tasks.app.keys(queue)
            strays, dead = gather.stray_records(client, keys, known, children)
            stray += strays
            counters[queue] = gather.counters(client, keys, dead)
        return Evidence(jobs=records, ledger=gather.ledger_entries(tasks.ledger),
                        counters=counters, faults=list(self.faults),
                        cancelled=set(producer.cancelled),
                        cancel_unknown=set(producer.cancel_unknown), stray=stray,
                        edges=list(producer.edges), children=dict(children))

    def _verdict(self, tasks: ChaosTasks, producer: Producer, seconds: float,
                 proxy: ProxyLink | None) -> int:
        evidence = self._evidence(tasks, producer)
        checks, summary = check(evidence)
        checks.append(Check("the run's own machinery worked", not self.errors,
                            "; ".join(self.errors) or "no errors"))
        fault_log = self.folder / "faults.log"
        write_fault_log(fault_log, self.seed, self.faults)
        lost = ", ".join(f"{what} {n}" for what, n in proxy.lost.most_common()) if proxy else ""
        extra = {"replies lost": lost or "none",
                 "enqueue calls that raised": f"{producer.resent} sent again;"
                 f" {producer.failed_calls} given up (their jobs are not counted; any they"
                 " stored is checked as a stray record)",
                 "worker restarts": f"{self.restarts} by the run (supervised children are"
                                    " replaced by their supervisor)",
                 "hand-offs": f"{sum(c.handed for c in evidence.counters.values())} jobs"
                              " leased by an enqueue straight to an idle worker",
                 "durable waits": f"{sum(j.kind == 'wait' for j in evidence.jobs)} jobs waited"
                                  f" for a signal and a child; {producer.signalled} signals"
                                  f" taken, {len(producer.signals)} never sent"}
        print_report(self.console, self.faults, self.skipped, checks, summary, self.seed,
                     seconds, extra)
        failed = [c for c in checks if not c.held]
        if failed:
            write_failures(self.folder / "failures.log", checks)
        if failed or self.keep:
            self.console.print(f"fault log, worker and Redis logs kept in {self.folder}")
        else:
            shutil.rmtree(self.folder, ignore_errors=True)
        if failed:
            self.console.print(f"[bold red]{len(failed)} invariant(s) FAILED[/bold red]"
                               f" (repeat with --seed {self.seed})")
            return 1
        self.console.print("[bold green]every invariant held[/bold green]")
        return 0
