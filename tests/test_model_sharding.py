"""Model-based test of sharded queues: hypothesis changes a queue's shard count and cap,
enqueues through the public API, fetches from chosen shards, ends runs and runs rounds of
the cap's sharing out, on a real redis-server; a plain model says after every step what
the contract (DESIGN §1.11, §6) promises:

* every job stored is on exactly one shard, in the state the model gives it, and a fetch
  leases only jobs ready on the shard it was sent to;
* while the layout is unchanged, a tenant's jobs are all on one shard, and the jobs of one
  enqueue without a tenant are spread evenly (no shard takes two more than another);
* a fetch never leases a job that takes the queue's running jobs, all shards together,
  past its cap (a cap of 0 starts nothing);
* the running counts of each shard equal its jobs held;
* with a cap above 0, rounds of sharing out and fetches from every shard in turn run every
  ready job: no shard is left without a share while jobs wait on it.
"""

from __future__ import annotations

import os
import uuid
from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import conveyor
from conveyor import sharding
from conveyor.scripts import calls
from helpers import ModuleServer, run_async

EXAMPLES = int(os.environ.get("CONVEYOR_MODEL_EXAMPLES", "75")) // 3 + 5
SERVER = ModuleServer()
_server = SERVER.fixture()


class ShardedQueue(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.app = conveyor.Conveyor(SERVER.url, namespace=f"s{uuid.uuid4().hex[:10]}")

        @self.app.task(name="m.job", queue="m")
        def job(n: int) -> int:
            return n

        self.task = job
        self.limits = calls.Limits()
        self.state: dict[str, str] = {}  # job id -> ready | active | succeeded
        self.tokens: dict[str, str] = {}
        self.cap: int | None = None
        self.homes: dict[str, str] = {}  # tenant -> its shard, while the layout holds
        self.serial = 0

    def teardown(self) -> None:
        self.app.redis.flushdb()
        self.app.close()

    def _served(self) -> list[str]:
        return self.app.queue("m").served()

    def _running(self) -> int:
        return sum(state == "active" for state in self.state.values())

    # -- steps -----------------------------------------------------------------------------

    @initialize(count=st.integers(1, 3), cap=st.sampled_from([None, 0, 1, 2, 4]))
    def start(self, count: int, cap: int | None) -> None:
        self.set_cap(cap)
        self.set_shards(count)

    @rule(count=st.integers(1, 3))
    def set_shards(self, count: int) -> None:
        assert self.app.queue("m").set_shards(count) == count
        self.homes.clear()  # a new layout may give a tenant another shard

    @rule(cap=st.sampled_from([None, 0, 1, 2, 3, 5]))
    def set_cap(self, cap: int | None) -> None:
        self.app.queue("m").set_limits(concurrency=cap)
        self.cap = cap

    @rule(tenant=st.sampled_from([None, "a", "b", "c", "d", "e"]), n=st.integers(1, 4))
    def enqueue(self, tenant: str | None, n: int) -> None:
        jobs = self.task.options(tenant=tenant).enqueue_many(
            [(self.serial + i,) for i in range(n)])
        self.serial += n
        shards = Counter(j.id.rpartition("~")[0] for j in jobs)
        for j in jobs:
            self.state[j.id] = "ready"
        if tenant is not None:
            assert len(shards) == 1, ("a tenant's jobs on several shards", shards)
            [shard] = shards
            assert self.homes.setdefault(tenant, shard) == shard, "a tenant moved"
        else:
            active = len(sharding.read_layout(self.app, "m").active)
            assert len(shards) == min(n, active), shards
            assert max(shards.values()) - min(shards.values()) <= 1, shards

    @rule(which=st.integers(0, 5), count=st.integers(1, 3))
    def fetch(self, which: int, count: int) -> None:
        # (an index, not a name: job ids, so which shards the index of queues names, are
        # random; what hypothesis draws must not depend on them)
        served = self._served()
        shard = served[which % len(served)]
        before = self._running()
        fetched = self.app.scripts.run(calls.fetch(self.app.keys(shard), count, self.limits))
        for leased in fetched.jobs:
            job_id = f"{shard}~{leased.short_id}"
            assert self.state.get(job_id) == "ready", (job_id, self.state.get(job_id))
            self.state[job_id] = "active"
            self.tokens[job_id] = leased.token
        if fetched.jobs and self.cap is not None:
            assert self._running() <= self.cap, (
                f"{len(fetched.jobs)} leased with {before} running: the cap is {self.cap}")

    @precondition(lambda self: any(s == "active" for s in self.state.values()))
    @rule(which=st.integers(0, 20))
    def finish(self, which: int) -> None:
        active = [i for i, s in self.state.items() if s == "active"]  # in the order leased
        job_id = active[which % len(active)]
        shard, _, short = job_id.rpartition("~")
        result = self.app.scripts.run(calls.finish(self.app.keys(shard), [calls.Outcome(
            short, self.tokens[job_id], "ok", 0.0, b"1", 0)], self.limits))
        assert result.codes == [calls.FINISH_SUCCEEDED]
        self.state[job_id] = "succeeded"

    @rule()
    def share_out(self) -> None:
        assert self._round() is not None
        if self.cap is not None:
            shares = [int(self.app.redis.hget(self.app.keys(s).limits, "concurrency") or 0)
                      for s in self._served()]
            assert sum(shares) <= max(self.cap, self._running()), (shares, self.cap)

    def _round(self) -> int | None:
        async def main() -> int | None:
            return await sharding.rebalance(self.app, self.app.aredis(), self.app.ascripts(),
                                            "m", self._served())

        return run_async(self.app, main())

    @precondition(lambda self: self.cap != 0)
    @rule()
    def drain(self) -> None:
        """Rounds and fetches from every shard until nothing is ready: every job runs."""
        for _ in range(40):
            if not any(s == "ready" for s in self.state.values()):
                return
            for job_id in [i for i, s in self.state.items() if s == "active"]:
                shard, _, short = job_id.rpartition("~")
                self.app.scripts.run(calls.finish(self.app.keys(shard), [calls.Outcome(
                    short, self.tokens[job_id], "ok", 0.0, b"1", 0)], self.limits))
                self.state[job_id] = "succeeded"
            self._round()
            for shard in self._served():
                self.fetch_from(shard)
        waiting = sorted(i for i, s in self.state.items() if s == "ready")
        raise AssertionError(f"jobs never ran with a cap of {self.cap}: {waiting}")

    def fetch_from(self, shard: str) -> None:
        fetched = self.app.scripts.run(calls.fetch(self.app.keys(shard), 10, self.limits))
        for leased in fetched.jobs:
            job_id = f"{shard}~{leased.short_id}"
            assert self.state.get(job_id) == "ready"
            self.state[job_id] = "active"
            self.tokens[job_id] = leased.token
        if fetched.jobs and self.cap is not None:
            assert self._running() <= self.cap

    # -- what must hold after every step ---------------------------------------------------

    @invariant()
    def redis_matches_the_model(self) -> None:
        redis = self.app.redis
        held: Counter[str] = Counter()
        ready: Counter[str] = Counter()
        # A single job's enqueue may leave it in the shard's inbox, its record written by
        # the next call that takes the inbox in (scripts/plain.py): ready all the same.
        inboxes = {shard: {e.split(b"|", 1)[0].decode()
                           for e in redis.lrange(self.app.keys(shard).inbox, 0, -1)}
                   for shard in self._served()}
        for job_id, state in self.state.items():
            shard, _, short = job_id.rpartition("~")
            stored = redis.hget(self.app.keys(shard).job(short), "s")  # the state
            if stored is None and short in inboxes[shard]:
                stored = b"ready"
            assert stored is not None and stored.decode() == state, (job_id, stored, state)
            held[shard] += state == "active"
            ready[shard] += state == "ready"
        for shard in self._served():
            counts = self.app.keys(shard).counts
            assert int(redis.hget(counts, "running") or 0) == held[shard], shard
            assert int(redis.hget(counts, "ready") or 0) == ready[shard], shard


ShardedQueue.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_sharded_queue_matches_its_model = ShardedQueue.TestCase
