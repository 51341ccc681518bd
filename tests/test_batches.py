"""Batch tasks with a real worker: items settled alone or together, ``max``/``min``/``wait``,
tenants kept apart, limits and fairness per item. Each task notes every call in a ledger
(a Redis list), so a test counts what ran and how often."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from typing import Any

import pytest

import conveyor
from conveyor import Batch, BatchItem, ConfigurationError, JobState, testing
from helpers import running_worker, wait_until


class Ledger:
    """A Redis list of the calls a batch task made: one JSON entry per call."""

    def __init__(self, app: conveyor.Conveyor, name: str = "ledger") -> None:
        self.app, self.key = app, f"{app.namespace}:{name}"

    def note(self, **entry: Any) -> None:
        self.app.redis.rpush(self.key, json.dumps(entry))

    def calls(self) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in self.app.redis.lrange(self.key, 0, -1)]

    def items(self) -> list[Any]:
        return [x for call in self.calls() for x in call["xs"]]


def _states(jobs: list[conveyor.Job[Any]]) -> Counter[str]:
    return Counter(str(job.info().state) for job in jobs)


def _all_end(jobs: list[conveyor.Job[Any]], state: JobState, timeout: float = 15) -> None:
    wait_until(lambda: all(j.info().state == state for j in jobs), timeout,
               message=f"every job {state}: {_states(jobs)}")


def test_a_failed_item_is_retried_alone_and_the_others_succeed_once(
        app: conveyor.Conveyor) -> None:
    ledger = Ledger(app)

    @app.task(batch=Batch(max=10, wait=0.2), retries=2, backoff=0.01)
    def index(items: list[BatchItem]) -> None:
        ledger.note(xs=[i.args[0] for i in items], attempts=[i.attempt for i in items])
        for item in items:
            if item.args[0] == 3 and item.attempt == 1:
                item.retry("not yet")
            elif item.args[0] == 7:
                item.fail("never")

    jobs = index.enqueue_many(range(10))
    with running_worker(app, concurrency=2):
        wait_until(lambda: all(j.info().state in (JobState.SUCCEEDED, JobState.DEAD)
                               for j in jobs), 15, message="all settled")
    assert Counter(ledger.items()) == Counter({**dict.fromkeys(range(10), 1), 3: 2})
    assert [c for c in ledger.calls() if c["xs"] == [3]] == [{"xs": [3], "attempts": [2]}]
    infos = {j.info().id: j.info() for j in jobs}
    assert infos[jobs[7].id].state == JobState.DEAD and infos[jobs[7].id].error == "never"
    assert infos[jobs[7].id].attempts == 1
    assert all(infos[j.id].state == JobState.SUCCEEDED for i, j in enumerate(jobs) if i != 7)


def test_item_results_are_recorded(app: conveyor.Conveyor) -> None:
    @app.task(batch=Batch(max=50, wait=0.2))
    async def square(items: list[BatchItem]) -> None:
        for item in items:
            item.result = {"n": item.args[0] ** 2, "k": item.kwargs.get("k")}

    jobs = [square.enqueue(n, k="x") for n in range(5)]
    with running_worker(app, concurrency=2):
        assert [j.result(timeout=10) for j in jobs] == [{"n": n * n, "k": "x"}
                                                        for n in range(5)]


def test_an_exception_retries_only_the_unmarked_items(app: conveyor.Conveyor) -> None:
    ledger = Ledger(app)

    @app.task(batch=Batch(max=10, wait=0.2), retries=1, backoff=0.01)
    def flaky(items: list[BatchItem]) -> None:
        ledger.note(xs=[i.args[0] for i in items], attempts=[i.attempt for i in items])
        if items[0].attempt == 1:
            items[0].result = "kept"
            items[1].fail("bad item")
            raise ConnectionError("search cluster down")

    jobs = flaky.enqueue_many(["a", "b", "c", "d"])
    with running_worker(app, concurrency=1):
        wait_until(lambda: all(j.info().state in (JobState.SUCCEEDED, JobState.DEAD)
                               for j in jobs), 15, message="all settled")
    first = ledger.calls()[0]["xs"]
    assert sorted(first) == ["a", "b", "c", "d"]
    by_x = {x: job for x, job in zip(["a", "b", "c", "d"], jobs, strict=True)}
    marked_ok, marked_dead = by_x[first[0]], by_x[first[1]]
    assert marked_ok.result(timeout=1) == "kept" and marked_ok.info().attempts == 1
    assert marked_dead.info().state == JobState.DEAD
    assert marked_dead.info().error == "bad item"
    for x in first[2:]:
        info = by_x[x].info()
        assert info.state == JobState.SUCCEEDED and info.attempts == 2
    assert sorted(ledger.items()) == sorted(["a", "b", "c", "d", *first[2:]])


def test_fail_ends_every_unmarked_item_dead_and_attempts_run_out(
        app: conveyor.Conveyor) -> None:
    @app.task(batch=Batch(max=10, wait=0.2), retries=0)
    def doomed(items: list[BatchItem]) -> None:
        items[0].retry("one more go")  # marked: retried, but it has no attempt left
        if len(items) > 1:
            raise conveyor.Fail("index is gone")

    jobs = doomed.enqueue_many([1, 2, 3])
    with running_worker(app, concurrency=1):
        _all_end(jobs, JobState.DEAD)
    errors = sorted(j.info().error or "" for j in jobs)
    assert errors.count("index is gone") >= 2


def test_max_bounds_each_call(app: conveyor.Conveyor) -> None:
    ledger = Ledger(app)

    @app.task(batch=Batch(max=3, wait=5))
    def small(items: list[BatchItem]) -> None:
        ledger.note(xs=[i.args[0] for i in items])

    jobs = small.enqueue_many(range(10))
    with running_worker(app, concurrency=1):
        _all_end(jobs, JobState.SUCCEEDED)
    sizes = [len(c["xs"]) for c in ledger.calls()]
    assert max(sizes) == 3 and sum(sizes) == 10
    assert sorted(ledger.items()) == list(range(10))


def test_a_lone_job_is_called_at_once_under_low_load(app: conveyor.Conveyor) -> None:
    @app.task(batch=Batch(max=100, min=1, wait=30))
    def lone(items: list[BatchItem]) -> None:
        for item in items:
            item.result = len(items)

    with running_worker(app, concurrency=2):
        started = time.monotonic()
        assert lone.enqueue("x").result(timeout=10) == 1
        assert time.monotonic() - started < 5  # far sooner than wait=30


def test_below_min_the_call_waits_for_more_items_or_for_wait(
        app: conveyor.Conveyor) -> None:
    ledger = Ledger(app)

    @app.task(batch=Batch(max=100, min=3, wait=30))
    def needs_three(items: list[BatchItem]) -> None:
        ledger.note(xs=[i.args[0] for i in items])

    @app.task(batch=Batch(max=100, min=5, wait=0.5))
    def times_out(items: list[BatchItem]) -> None:
        ledger.note(xs=[i.args[0] for i in items], at=time.time())

    with running_worker(app, concurrency=2):
        needs_three.enqueue("a")
        needs_three.enqueue("b")
        deadline = time.monotonic() + 1.0  # two items, min three: no call meanwhile
        while time.monotonic() < deadline:
            assert ledger.calls() == []
            time.sleep(0.05)
        needs_three.enqueue("c")
        wait_until(ledger.calls, 5, message="the call once min items are gathered")
        assert sorted(ledger.calls()[0]["xs"]) == ["a", "b", "c"]

        enqueued = time.time()
        times_out.enqueue_many(["p", "q"])
        wait_until(lambda: len(ledger.calls()) == 2, 10, message="the call after wait")
    late = ledger.calls()[1]
    assert sorted(late["xs"]) == ["p", "q"]
    assert 0.4 <= late["at"] - enqueued < 5


def test_by_tenant_never_mixes_tenants_in_one_call(app: conveyor.Conveyor) -> None:
    ledger = Ledger(app)

    @app.task(batch=Batch(max=50, wait=0.3, by="tenant"))
    def per_tenant(items: list[BatchItem]) -> None:
        ledger.note(xs=[i.args[0] for i in items], tenants=[i.tenant for i in items])

    jobs = []
    for n in range(30):
        for tenant in ("a", "b", "c"):
            jobs += per_tenant.options(tenant=tenant).enqueue_many([f"{tenant}{n}"])
    with running_worker(app, concurrency=2):
        _all_end(jobs, JobState.SUCCEEDED)
    for call in ledger.calls():
        assert len(set(call["tenants"])) == 1, call
        assert all(x.startswith(call["tenants"][0]) for x in call["xs"])
    assert len(ledger.items()) == 90 and len(set(ledger.items())) == 90
    assert max(len(c["xs"]) for c in ledger.calls()) > 1


def test_a_queue_concurrency_cap_bounds_the_items_in_flight(app: conveyor.Conveyor) -> None:
    key = f"{app.namespace}:in-flight"
    peaks: list[int] = []

    @app.task(queue="capped", batch=Batch(max=100, wait=0.2))
    async def capped(items: list[BatchItem]) -> None:
        peaks.append(int(app.redis.incrby(key, len(items))))
        await asyncio.sleep(0.05)
        app.redis.decrby(key, len(items))

    app.queue("capped").set_limits(concurrency=4)
    jobs = capped.enqueue_many(range(40))
    with running_worker(app, queues=["capped"], concurrency=8), \
            running_worker(app, queues=["capped"], concurrency=8):
        _all_end(jobs, JobState.SUCCEEDED, timeout=30)
    assert max(peaks) <= 4
    assert max(peaks) == 4  # the cap, not something else, was the bound


def test_tenants_take_turns_with_batches(app: conveyor.Conveyor) -> None:
    ledger = Ledger(app)

    @app.task(batch=Batch(max=10, wait=0.2))
    def fair(items: list[BatchItem]) -> None:
        ledger.note(xs=[i.tenant for i in items])

    big = fair.options(tenant="big").enqueue_many(range(200))
    small = fair.options(tenant="small").enqueue_many(range(20))
    with running_worker(app, concurrency=1):
        _all_end(big + small, JobState.SUCCEEDED, timeout=30)
    order = ledger.items()
    last_small = max(i for i, tenant in enumerate(order) if tenant == "small")
    assert last_small < 80, f"small's last job ran at {last_small} of {len(order)}"


def test_a_cancelled_item_is_not_passed_and_its_result_is_dropped(
        app: conveyor.Conveyor) -> None:
    ledger = Ledger(app)

    @app.task(batch=Batch(max=100, min=3, wait=30))
    async def slow(items: list[BatchItem]) -> None:
        ledger.note(xs=[i.args[0] for i in items])
        deadline = time.monotonic() + 10
        while not any(i.cancelled for i in items) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for item in items:
            item.result = "done"

    with running_worker(app, concurrency=2):
        gathered = slow.enqueue("gathered")
        wait_until(lambda: gathered.info().state == JobState.ACTIVE, 5, message="leased")
        assert gathered.cancel()
        wait_until(lambda: gathered.info().state == JobState.CANCELLED, 5,
                   message="cancelled while gathered")
        jobs = slow.enqueue_many(["x", "y", "z"])
        wait_until(ledger.calls, 5, message="the call")
        assert sorted(ledger.calls()[0]["xs"]) == ["x", "y", "z"]
        assert jobs[0].cancel()
        _all_end(jobs[1:], JobState.SUCCEEDED)
    assert jobs[0].info().state == JobState.CANCELLED
    assert [j.result(timeout=1) for j in jobs[1:]] == ["done", "done"]
    assert gathered.info().state == JobState.CANCELLED


def test_batch_settings_are_checked() -> None:
    for bad, words in [(dict(max=0), "max must be an integer >= 1"),
                       (dict(min=0), "min must be an integer >= 1"),
                       (dict(max=5, min=6), "min must be at most max"),
                       (dict(wait=0), "wait must be a number of seconds > 0"),
                       (dict(wait=float("inf")), "wait must be"),
                       (dict(by="queue"), "by must be None or 'tenant'")]:
        with pytest.raises(ConfigurationError, match=words):
            Batch(**bad)


def test_a_batch_function_must_take_the_list_of_items(app: conveyor.Conveyor) -> None:
    with pytest.raises(ConfigurationError, match="takes one argument, the list of items"):
        @app.task(batch=Batch())
        def two(a: int, b: int) -> None: ...

    with pytest.raises(ConfigurationError, match=r"annotate it list\[conveyor.BatchItem\]"):
        @app.task(batch=Batch())
        def wrong(n: int) -> None: ...

    with pytest.raises(ConfigurationError, match=r"batch= takes a conveyor\.Batch"):
        app.task(batch={"max": 3})(lambda items: None)  # type: ignore[call-overload]

    @app.task(batch=Batch())
    def unannotated(items):  # type: ignore[no-untyped-def]
        return None

    assert unannotated.batch == Batch()


def test_inline_calls_a_batch_task_with_the_items_of_one_enqueue() -> None:
    app = conveyor.Conveyor("redis://127.0.0.1:1/0", namespace="inline-batch")
    calls: list[list[Any]] = []

    @app.task(batch=Batch(max=10), retries=1)
    def index(items: list[BatchItem]) -> None:
        calls.append([(i.args, i.kwargs, i.tenant, i.attempt) for i in items])
        for item in items:
            if item.args == ["bad"]:
                item.fail("bad document")
            elif item.args == ["flaky"] and item.attempt == 1:
                item.retry("try again")
            else:
                item.result = item.args[0]

    with testing.inline(app):
        one = index.options(tenant="acme").enqueue("solo")
        many = index.enqueue_many(["a", "bad", "flaky"])
        assert one.result() == "solo"
        assert many[0].result() == "a" and many[2].result() == "flaky"
        with pytest.raises(conveyor.JobFailed, match="bad document"):
            many[1].result()
    assert calls == [[(["solo"], {}, "acme", 1)],
                     [(["a"], {}, None, 1), (["bad"], {}, None, 1), (["flaky"], {}, None, 1)],
                     [(["flaky"], {}, None, 2)]]


def test_a_calls_outcomes_are_recorded_together(app: conveyor.Conveyor) -> None:
    @app.task(batch=Batch(max=20, wait=5), retries=0)
    def together(items: list[BatchItem]) -> None:
        items[0].retry("again")  # no attempt left: dead, in the same finish
        items[1].fail("no")

    jobs = together.enqueue_many(range(20))
    with running_worker(app, concurrency=1):
        wait_until(lambda: all(j.info().finished_at for j in jobs), 10,
                   message="the call's outcomes")
    # One finish call reads the server's clock once: every job it records shares the time.
    infos = [j.info() for j in jobs]
    assert len({i.finished_at for i in infos}) == 1
    assert Counter(str(i.state) for i in infos) == Counter(
        {str(JobState.SUCCEEDED): 18, str(JobState.DEAD): 2})


def test_gathered_items_keep_their_leases(app: conveyor.Conveyor) -> None:
    ledger = Ledger(app)

    @app.task(visibility_timeout=0.6, batch=Batch(max=10, min=5, wait=2.5))
    def patient(items: list[BatchItem]) -> None:
        ledger.note(xs=[i.args[0] for i in items])

    jobs = patient.enqueue_many(["a", "b"])
    with running_worker(app, concurrency=2):
        _all_end(jobs, JobState.SUCCEEDED)
    # Gathered four leases long: the heartbeat kept them, so nothing ran twice.
    assert [sorted(c["xs"]) for c in ledger.calls()] == [["a", "b"]]
    assert [j.info().attempts for j in jobs] == [1, 1]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_call_past_the_timeout_fails_its_items(app: conveyor.Conveyor, kind: str) -> None:
    if kind == "sync":
        @app.task(name="slow", timeout=0.3, retries=0, batch=Batch(max=10, wait=0.2))
        def slow(items: list[BatchItem]) -> None:
            time.sleep(1.0)
            for item in items:
                item.result = "too late"
    else:
        @app.task(name="slow", timeout=0.3, retries=0, batch=Batch(max=10, wait=0.2))
        async def slow(items: list[BatchItem]) -> None:
            await asyncio.sleep(1.0)
            for item in items:
                item.result = "too late"

    jobs = slow.enqueue_many(["a", "b"])
    with running_worker(app, concurrency=2):
        _all_end(jobs, JobState.DEAD)
        time.sleep(1.0)  # the sync call returns meanwhile: its results must be dropped
    for job in jobs:
        info = job.info()
        assert info.state == JobState.DEAD and "ran longer than 0.3 s" in (info.error or "")


def test_plain_and_batch_tasks_share_a_queue(app: conveyor.Conveyor) -> None:
    ledger = Ledger(app)

    @app.task(batch=Batch(max=25, wait=0.2))
    def bulk(items: list[BatchItem]) -> None:
        ledger.note(xs=[i.args[0] for i in items])

    @app.task
    def plain(n: int) -> int:
        return n * 2

    jobs = bulk.enqueue_many(range(100))
    singles = plain.enqueue_many(range(30))
    with running_worker(app, concurrency=2):
        _all_end(jobs + singles, JobState.SUCCEEDED, timeout=30)
        assert [j.result(timeout=1) for j in singles] == [n * 2 for n in range(30)]
    assert sorted(ledger.items()) == list(range(100))
    assert max(len(c["xs"]) for c in ledger.calls()) > 1
