"""The faults a chaos run injects, one episode at a time, chosen by a seeded random
generator so that a run can be repeated with ``--seed``.

Each episode returns a :class:`Fault`: what was done, when, and its *reach*: how many
leases it can cost at most (the jobs the processes it hit can hold at once). The sum of
the reaches bounds the re-executions a correct queue may show.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from .fleet import Fleet
from .proxy import LOST_REPLY_TARGETS, WORKER
from .servers import CLIENT_NAME, RedisProcess
from .tasks import POISON_RETRIES, WORK_VT

__all__ = ["FAULT_KINDS", "Fault", "Injector", "JobsRedis", "PoisonHook"]

# kind -> what it does (the report's wording)
FAULT_KINDS = {
    "worker-kill": "SIGKILL of a worker process",
    "worker-pause": "SIGSTOP of a worker process past its leases, then SIGCONT",
    "redis-kill": "SIGKILL of Redis, restart on the same port and folder (AOF)",
    "failover": "SENTINEL FAILOVER, writes paused until the replica caught up",
    "client-kill": "CLIENT KILL of every worker connection",
    "oom": "maxmemory just above used memory for a few seconds (OOM replies)",
    "proxy-blackhole": "proxy between a worker and Redis swallows traffic for a while",
    "proxy-reset": "proxy between a worker and Redis resets its connections",
    "lost-reply": "proxies let chosen requests (fetch, finish, enqueue, ...) reach Redis,"
                  " then drop the reply and reset the connection",
    "poison-raise": "a job whose task raises on every attempt",
    "poison-kill": "a job whose task SIGKILLs its worker process",
    "poison-exit": "a job whose task leaves its process with os._exit",
    "poison-hang": "a job whose sync task sleeps far past its timeout",
    "cancel": "cancel of a delayed job before it is due, and of a work job while it runs",
    "limits": "the queue's cap and tenant cap changed at runtime (or removed)",
    "shards": "the queue spread over another count of shards (1 to 3) while jobs flow",
    "overwrite": "queue keys (wake key, metric buckets, delayed and dead sets) written over",
}
MIN_VICTIM_AGE = 1.5  # seconds: a worker still importing is not worth killing
PROXY_KINDS = ("proxy-blackhole", "proxy-reset", "lost-reply")
LOST_REPLIES = (1, 3)  # replies a lost-reply spell loses on each proxy, at most (uniform)
LOST_REPLY_SPELL = (1.0, 3.0)  # seconds a spell lasts, at most (uniform)

PoisonHook = Callable[[str], str | None]  # kind -> label of the job enqueued, or None
SENTINEL_SPARED = "sentinel-"  # name prefix of the sentinels' connections to a server


class JobsRedis(Protocol):
    """The jobs' Redis: one server (:class:`~.servers.SingleRedis`) or a Sentinel set
    (:class:`~.sentinel.SentinelSet`). Faults at "the server" act on its current primary;
    only a set ``fails_over``."""

    fails_over: bool

    @property
    def url(self) -> str: ...

    def stop(self) -> None: ...

    def primary(self) -> RedisProcess: ...

    def crash(self, hold: Callable[[], float]) -> str: ...

    def failover(self) -> str | None: ...


LimitsHook = Callable[[int | None, int | None], bool]  # (cap, tenant cap) -> applied


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault.

    :param kind: a key of :data:`FAULT_KINDS`
    :param at: seconds since the run began
    :param detail: what exactly was hit, for the fault log
    :param reach: most leases it can cost
    """

    kind: str
    at: float
    detail: str
    reach: int


class Injector:
    """Runs fault episodes against the run's servers and worker processes.

    :param target: the jobs' Redis
    :param fleet: the worker processes
    :param rng: the run's seeded generator
    :param poison: enqueues a poison job of a kind (``"raise"``, ...); returns its label
    :param cancel: cancels one delayed job; returns its label, or None if none was found
    :param cancel_running: cancels one running job; its label, or None if none was found
    :param stop: set when the run is aborted (episodes end early)
    :param proxy: the proxies between one slot (and the producer) and Redis, when the run
        has them (:class:`~.proxy.ProxyLink`)
    :param limits: changes the queue's limits (cap, tenant cap); None: no such faults
    """

    def __init__(self, target: JobsRedis, fleet: Fleet, rng: random.Random,
                 poison: PoisonHook, cancel: Callable[[], str | None], stop: threading.Event,
                 proxy: Any = None,
                 cancel_running: Callable[[], str | None] = lambda: None,
                 limits: LimitsHook | None = None,
                 shards: Callable[[int], bool] | None = None,
                 overwritten: Callable[[bool], list[str]] | None = None) -> None:
        self.target = target
        self.fleet = fleet
        self.rng = rng
        self.poison_hook = poison
        self.cancel_hook = cancel
        self.cancel_running_hook = cancel_running
        self.stop = stop
        self.proxy = proxy
        self.limits_hook = limits
        self.shards_hook = shards
        self.overwritten_hook = overwritten
        self.began = time.monotonic()
        self.redis_lock = threading.Lock()  # held while Redis is down (the run waits on it)

    def available(self, kinds: dict[str, float]) -> dict[str, float]:
        """The kinds that can be injected in this run (proxy faults need a proxy, failovers
        a Sentinel set)."""
        return {k: w for k, w in kinds.items()
                if w > 0 and (self.proxy is not None or k not in PROXY_KINDS)
                and (k != "failover" or self.target.fails_over)
                and (self.limits_hook is not None or k != "limits")
                and (self.shards_hook is not None or k != "shards")
                and (self.overwritten_hook is not None or k != "overwrite")}

    def inject(self, kind: str) -> Fault | None:
        """Run one episode of ``kind``; None when there was nothing to hit."""
        at = time.monotonic() - self.began
        method = getattr(self, "_" + kind.replace("-", "_"))
        result: tuple[str, int] | None = method()
        return None if result is None else Fault(kind, round(at, 2), *result)

    def _pick_worker(self) -> int | None:
        victims = self.fleet.victims(MIN_VICTIM_AGE)
        return self.rng.choice(sorted(victims)) if victims else None

    def _hold(self, low: float, high: float) -> float:
        seconds = round(self.rng.uniform(low, high), 2)
        self.stop.wait(seconds)  # the length of the fault itself, not a wait for a condition
        return seconds

    def _worker_kill(self) -> tuple[str, int] | None:
        pid = self._pick_worker()
        if pid is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return f"pid {pid}", self.fleet.largest

    def _worker_pause(self) -> tuple[str, int] | None:
        pid = self._pick_worker()
        if pid is None:
            return None
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return None
        try:
            seconds = self._hold(WORK_VT + 0.5, WORK_VT + 2.5)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        return f"pid {pid} paused {seconds:g} s", self.fleet.largest

    def _redis_kill(self) -> tuple[str, int] | None:
        with self.redis_lock:
            # Past the leases, at times. On a Sentinel set the current primary is killed.
            detail = self.target.crash(lambda: self._hold(0.2, WORK_VT + 1.5))
        return detail, self.fleet.capacity

    def _failover(self) -> tuple[str, int] | None:
        # Every worker's leases may lapse while writes are paused and clients find the new
        # primary; no acknowledged write is at risk (the replica caught up first).
        with self.redis_lock:
            detail = self.target.failover()
            if detail is not None and self.proxy is not None:
                self.proxy.follow()  # its connections to the demoted server end
        return None if detail is None else (detail, self.fleet.capacity)

    def _admin(self) -> redis.Redis:
        return self.target.primary().client()

    def _client_kill(self) -> tuple[str, int] | None:
        client = self._admin()
        try:
            me = client.client_id()
            ids = [c["id"] for c in client.client_list(_type="normal")
                   if c.get("name") != CLIENT_NAME and int(c["id"]) != me
                   and not str(c.get("name", "")).startswith(SENTINEL_SPARED)]
            killed = 0
            for i in ids:
                with contextlib.suppress(redis.exceptions.ResponseError):  # already gone
                    killed += int(client.client_kill_filter(_id=i))
        finally:
            client.close()
        return f"{killed} connections", self.fleet.capacity

    def _oom(self) -> tuple[str, int] | None:
        client = self._admin()
        try:
            used = int(client.info("memory")["used_memory"])
            client.config_set("maxmemory", used + 64 * 1024)
            try:
                seconds = self._hold(1.0, 4.0)
            finally:
                client.config_set("maxmemory", 0)
        finally:
            client.close()
        return f"maxmemory {used // 1024 + 64} KiB for {seconds:g} s", self.fleet.capacity

    def _proxy_blackhole(self) -> tuple[str, int] | None:
        proxy = self.proxy
        proxy.blackhole()
        try:
            seconds = self._hold(WORK_VT, WORK_VT + 3.0)
        finally:
            proxy.heal()
        return f"black hole for {seconds:g} s", proxy.reach

    def _proxy_reset(self) -> tuple[str, int] | None:
        self.proxy.reset()
        return "connections reset", self.proxy.reach

    def _lost_reply(self) -> tuple[str, int] | None:
        """For a short spell, the proxies let the next few requests of one kind through
        and lose their replies: Redis applied each, the client sees its connection reset.
        A lost reply of the worker's can cost the leases it holds (a fetch whose reply is
        lost leased jobs nobody holds); the producer's hold none."""
        names = list(LOST_REPLY_TARGETS)
        name = self.rng.choices(names, [LOST_REPLY_TARGETS[n][1] for n in names])[0]
        count = self.rng.randint(*LOST_REPLIES)
        seconds = round(self.rng.uniform(*LOST_REPLY_SPELL), 2)
        spell = self.proxy.lose(LOST_REPLY_TARGETS[name][0], count, seconds, self.stop)
        if not sum(spell.chosen.values()):
            return None  # no such request in the spell: tried again later
        lost = Counter(f"{client} {what}" for client, what in spell.lost)
        what = ", ".join(f"{k} x{v}" for k, v in sorted(lost.items())) or "none yet"
        return (f"{name}: {len(spell.lost)} of {sum(spell.chosen.values())} chosen lost"
                f" in {seconds:g} s ({what})", spell.chosen.get(WORKER, 0) * self.proxy.reach)

    def _poison(self, kind: str, reach: int) -> tuple[str, int] | None:
        label = self.poison_hook(kind)
        return None if label is None else (label, reach)

    def _poison_raise(self) -> tuple[str, int] | None:
        return self._poison("raise", 0)

    def _poison_kill(self) -> tuple[str, int] | None:
        # Each attempt kills the worker process running it, with every job it holds.
        return self._poison("kill", self.fleet.largest * (POISON_RETRIES + 1))

    def _poison_exit(self) -> tuple[str, int] | None:
        return self._poison("exit", self.fleet.largest * (POISON_RETRIES + 1))

    def _poison_hang(self) -> tuple[str, int] | None:
        return self._poison("hang", 0)

    def _limits(self) -> tuple[str, int] | None:
        if self.limits_hook is None:
            return None
        cap = self.rng.choice([None, 8, 10, 16])
        tenant_cap = self.rng.choice([None, 2, 4, 6])
        if not self.limits_hook(cap, tenant_cap):
            return None
        return f"concurrency {cap}, tenant concurrency {tenant_cap}", 0

    def _shards(self) -> tuple[str, int] | None:
        if self.shards_hook is None:
            return None
        count = self.rng.choice([1, 2, 3])
        if not self.shards_hook(count):
            return None
        return f"{count} shard(s)", 0

    def _overwrite(self) -> tuple[str, int] | None:
        """Keys of the queue written over by hand (a string where a list, a sorted set or
        a hash belongs) for a while, then put back as they were: enqueues pass over the
        bookkeeping they cannot write and store their jobs once or not at all; fetches and
        finishes refuse, having changed nothing, and their workers try again; idle workers'
        waits for a marker fail and are retried, and they find work by looking. Each key is
        saved and written over in one transaction, so no write falls between the two."""
        assert self.overwritten_hook is not None
        client = self._admin()
        try:
            keys = self.overwritten_hook(self.rng.random() < 0.5)  # the sets, one time in two
            with client.pipeline(transaction=True) as pipe:
                for key in keys:
                    pipe.dump(key)
                    pipe.pttl(key)
                    pipe.set(key, "written over by hand")
                replies = pipe.execute()
            saved = [(key, replies[3 * i], replies[3 * i + 1]) for i, key in enumerate(keys)]
            try:
                seconds = self._hold(1.0, 3.0)
            finally:
                with client.pipeline(transaction=True) as pipe:
                    for key, value, ttl in saved:
                        pipe.delete(key)
                        if value is not None:
                            pipe.restore(key, max(ttl, 0), value)
                    pipe.execute()
        finally:
            client.close()
        return f"{len(keys)} keys for {seconds:g} s", 0

    def _cancel(self) -> tuple[str, int] | None:
        labels = [label for label in (self.cancel_hook(), self.cancel_running_hook()) if label]
        return (", ".join(labels), 0) if labels else None
