"""The plain single enqueue (``scripts/plain.py``): one MULTI onto the queue's inbox.

A job with no delay, tenant or key is stored without a script. These tests hold it to the
script's results: the same record, the same counts and metrics, the same place in line
(enqueue order within a priority, also mixed with jobs the script stored), and the same
behaviour when Redis refuses the write or meets a mangled key.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator

import pytest
import redis

import conveyor
from conveyor import keys, record, testing
from conveyor.faults.proxy import Proxy
from conveyor.scripts import calls, plain
from helpers import RedisServer, run_async, wait_until

Q = "plain"


@pytest.fixture
def server(make_server: type[RedisServer]) -> Iterator[RedisServer]:
    """A private server: these tests read its command statistics and set its memory."""
    yield make_server().start()


@pytest.fixture
def papp(server: RedisServer) -> Iterator[conveyor.Conveyor]:
    app = conveyor.Conveyor(server.url, namespace="p")
    yield app
    app.close()


def _task(app: conveyor.Conveyor) -> conveyor.Task[..., int]:
    existing = app.tasks.get("plain.double")
    if existing is not None:
        return existing

    @app.task(name="plain.double", queue=Q)
    def double(x: int) -> int:
        return 2 * x

    return double


def _commands(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def _fetch(app: conveyor.Conveyor, count: int = 100) -> list[str]:
    fetched = app.scripts.run(calls.fetch(app.keys(Q), count, app.limits))
    return [job.short_id for job in fetched.jobs]


def _warm(app: conveyor.Conveyor) -> conveyor.Task[..., int]:
    """The task, with its queue known and this process's clock read: the first enqueue
    to a queue registers it, and until the clock is read an enqueue runs the script with a
    TIME behind it."""
    task = _task(app)
    task.enqueue(0)
    task.enqueue(0)
    _fetch(app)  # out of the way
    return task


def test_a_plain_enqueue_runs_no_script_and_writes_what_the_script_writes(
    papp: conveyor.Conveyor, server: RedisServer,
) -> None:
    task = _warm(papp)
    client = server.client()
    client.config_resetstat()
    job = task.enqueue(21)
    used = _commands(client)
    assert "evalsha" not in used and used["multi"] == used["exec"] == 1
    k = papp.keys(Q)
    assert client.lrange(k.inbox, 0, -1) == [job.short_id.encode()]
    assert int(client.hget(k.counts, "ready")) == 1
    # The same job stored by the script: records equal but for id-bound fields.
    spec = calls.JobSpec("plain.double")
    args = papp.codec.encode_args("plain.double", (21,), {}, None)
    papp.scripts.run(calls.enqueue(k, spec, [("byscript", args)], papp.limits))
    by_plain = client.hgetall(k.job(job.short_id))
    by_script = client.hgetall(k.job("byscript"))
    assert by_plain.keys() == by_script.keys() == {b"t", b"s", b"e", b"a"}
    assert {f: v for f, v in by_plain.items() if f != b"e"} == \
        {f: v for f, v in by_script.items() if f != b"e"}
    server_ms = float(client.time()[0]) * 1000
    assert abs(int(by_plain[b"e"]) - server_ms) < 2000
    info = job.info()
    assert info.state == conveyor.JobState.READY and info.priority == record.DEFAULT_PRIORITY
    assert conveyor.Monitor(papp).backlog(Q).ready == 2
    assert job.short_id in _fetch(papp) and client.llen(k.inbox) == 0


def test_options_other_than_the_defaults_are_stored_and_read_back(
    papp: conveyor.Conveyor,
) -> None:
    _warm(papp)

    @papp.task(name="plain.patient", queue=Q, retries=6, visibility_timeout=12)
    def patient(x: int) -> int:
        return x

    job = patient.options(priority=8).enqueue(1)
    info = job.info()
    assert (info.priority, info.max_attempts) == (8, 7)
    assert papp.redis.hget(papp.keys(Q).job(job.short_id), record.VISIBILITY_MS) == b"12000"
    assert papp.redis.lrange(papp.keys(Q).inbox, 0, -1) == [f"{job.short_id}|8".encode()]


@pytest.mark.parametrize("options", [{"tenant": "acme"}, {"delay": 5.0}, {"key": "k1"}])
def test_a_job_with_a_tenant_a_delay_or_a_key_takes_the_script(
    papp: conveyor.Conveyor, server: RedisServer, options: dict[str, object],
) -> None:
    _warm(papp)
    client = server.client()
    client.config_resetstat()
    _task(papp).options(**options).enqueue(1)  # type: ignore[arg-type]
    used = _commands(client)
    assert used.get("evalsha") == 1 and "multi" not in used


def test_jobs_start_in_enqueue_order_within_a_priority_whichever_path_stored_them(
    papp: conveyor.Conveyor,
) -> None:
    task = _warm(papp)
    order = []
    for i in range(9):
        if i % 3 == 1:  # every third one through the script (a bulk call of one job)
            order.extend(job.short_id for job in task.enqueue_many([i]))
        else:
            order.append(task.enqueue(i).short_id)
    urgent = task.options(priority=9).enqueue(99)
    assert _fetch(papp, 4) == [urgent.short_id, *order[:3]]
    assert _fetch(papp, 100) == order[3:]


def test_a_cancelled_job_in_the_inbox_never_runs(papp: conveyor.Conveyor) -> None:
    task = _warm(papp)
    doomed, kept = task.enqueue(1), task.enqueue(2)
    assert doomed.cancel()
    assert conveyor.Monitor(papp).backlog(Q).ready == 1
    assert _fetch(papp) == [kept.short_id]
    assert doomed.info().state == conveyor.JobState.CANCELLED
    assert int(papp.redis.hget(papp.keys(Q).counts, "ready")) == 0


def test_a_worker_runs_plain_jobs(papp: conveyor.Conveyor) -> None:
    task = _warm(papp)
    jobs = [task.enqueue(i) for i in range(20)]
    testing.drain(papp, queues=[Q])
    assert [job.result(timeout=5) for job in jobs] == [2 * i for i in range(20)]


def test_a_refused_write_stores_nothing_and_the_connection_stays_usable(
    papp: conveyor.Conveyor, server: RedisServer,
) -> None:
    task = _warm(papp)
    client = server.client()
    client.config_set("maxmemory", 1)  # every write is refused (OOM) from now on
    try:
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            task.enqueue(1)
    finally:
        client.config_set("maxmemory", 0)
    k = papp.keys(Q)
    assert client.llen(k.inbox) == 0 and int(client.hget(k.counts, "ready") or 0) == 0
    job = task.enqueue(2)  # the same pooled connection, in step again
    assert _fetch(papp) == [job.short_id]


def test_a_refused_multi_leaves_the_bucket_expiry_to_the_next_one(
    papp: conveyor.Conveyor, server: RedisServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(plain, "EXPIRE_EVERY_S", 3600.0)  # one EXPIRE per bucket, if it ran
    task = _task(papp)
    task.enqueue(0)  # the queue known
    task.enqueue(0)  # the clock read (the script, which sets the bucket's lifetime itself)
    client = server.client()
    k = papp.keys(Q)
    for bucket in client.scan_iter(match=f"{k.metrics_prefix}*"):
        client.delete(bucket)  # the next MULTI creates its bucket
    client.config_set("maxmemory", 1)
    try:
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            task.enqueue(1)  # its EXPIRE never ran ...
    finally:
        client.config_set("maxmemory", 0)
    task.enqueue(2)  # ... so this one sends it
    buckets = list(client.scan_iter(match=f"{k.metrics_prefix}*"))
    assert buckets and all(0 < client.ttl(b) <= papp.limits.bucket_ttl for b in buckets)


def test_a_mangled_inbox_gives_the_error_that_names_it(
    papp: conveyor.Conveyor, server: RedisServer,
) -> None:
    task = _warm(papp)
    server.client().set(papp.keys(Q).inbox, "not a list")
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        task.enqueue(1)
    server.client().delete(papp.keys(Q).inbox)
    job = task.enqueue(2)
    assert job.short_id in _fetch(papp)


def test_a_mangled_waiters_key_neither_fails_an_enqueue_nor_turns_on_hand_offs(
    papp: conveyor.Conveyor, server: RedisServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(plain, "COUNT_EVERY_S", 0.0)  # every MULTI counts
    task = _warm(papp)
    k = papp.keys(Q)
    server.client().set(k.waiters, "not a sorted set")
    jobs = [task.enqueue(i) for i in range(3)]  # each stored once, none raising
    assert not papp.scripts._plain.hand_off(k)
    assert _fetch(papp) == [job.short_id for job in jobs]


def test_mangled_inbox_entries_neither_stop_a_fetch_nor_run(papp: conveyor.Conveyor) -> None:
    task = _warm(papp)
    k = papp.keys(Q)
    first = task.enqueue(1)
    papp.redis.rpush(k.inbox, "nosuchjob|x", "|7", "nosuchjob|3", "")
    last = task.enqueue(2)
    assert _fetch(papp) == [first.short_id, last.short_id]
    assert papp.redis.llen(k.inbox) == 0


def test_a_huge_inbox_is_taken_over_several_fetches(papp: conveyor.Conveyor) -> None:
    task = _warm(papp)
    k = papp.keys(Q)
    first = task.enqueue(0)
    ids = [f"x{i}" for i in range(25_000)]  # ids without records: skipped when popped
    for i in range(0, len(ids), 5000):
        papp.redis.rpush(k.inbox, *ids[i:i + 5000])
    assert _fetch(papp, 1) == [first.short_id]
    left = papp.redis.llen(k.inbox)
    assert 0 < left < len(ids)  # a fetch moves a bounded share, not all at once
    while papp.redis.llen(k.inbox):
        _fetch(papp, 1)
    last = task.enqueue(1)
    assert _fetch(papp) == [last.short_id]


def test_the_async_api_takes_the_plain_path_too(
    papp: conveyor.Conveyor, server: RedisServer,
) -> None:
    task = _task(papp)

    async def main() -> list[str]:
        await task.aenqueue(0)  # the queue known
        await task.aenqueue(0)  # the clock read
        client = server.client()
        client.config_resetstat()
        jobs = [await task.aenqueue(i) for i in range(1, 4)]
        used = _commands(client)
        assert "evalsha" not in used and used["multi"] == 3
        return [job.short_id for job in jobs]

    ids = run_async(papp, main())
    assert _fetch(papp)[2:] == ids


def test_the_async_api_counts_waiters_and_hands_over_while_it_finds_them(
    papp: conveyor.Conveyor, server: RedisServer,
) -> None:
    task = _task(papp)
    k = papp.keys(Q)

    def register(worker: str) -> None:
        papp.scripts.run(calls.register_waiter(k, worker, 1, 60_000))

    async def main() -> tuple[list[str], list[str]]:
        await task.aenqueue(0)  # the queue known
        await task.aenqueue(0)  # the clock read
        _fetch(papp)  # out of the way
        register("w1")
        client = server.client()
        client.config_resetstat()
        seen = await task.aenqueue(1)  # plain: it counts w1 ...
        assert "evalsha" not in _commands(client)
        handed = await task.aenqueue(2)  # ... so this one takes the script, which hands over
        assert _commands(client)["evalsha"] == 1
        assert papp.redis.zcard(k.waiters) == 0  # w1's registration served it
        await task.aenqueue(3)  # the script's count found w1: the script again, handing none
        await task.aenqueue(4)  # that count found no waiter: plain again
        used = _commands(client)
        # (the last MULTI counts again only when 50 ms passed since the first one counted)
        assert used["evalsha"] == 2 and used["multi"] == 2 and used["zcount"] in (3, 4)
        return [seen.short_id, handed.short_id], [j.short_id for j in
                                                  calls.parse_handoff(papp.redis.lpop(
                                                      k.handoff("w1"))).jobs]

    (seen, handed), given = run_async(papp, main())
    # The enqueue that took the script handed the oldest ready job over, as a fetch would.
    assert given == [seen]
    assert papp.redis.hget(k.job(seen), record.STATE) == b"active"
    assert papp.redis.hget(k.job(handed), record.STATE) == b"ready"


@pytest.mark.parametrize("every", [0.0, 3600.0])
def test_a_burst_sends_the_bucket_expiry_and_the_waiters_count_only_now_and_then(
    papp: conveyor.Conveyor, server: RedisServer, monkeypatch: pytest.MonkeyPatch,
    every: float,
) -> None:
    monkeypatch.setattr(plain, "EXPIRE_EVERY_S", every)
    monkeypatch.setattr(plain, "COUNT_EVERY_S", every)
    task = _task(papp)
    task.enqueue(0)  # the queue known
    task.enqueue(0)  # the clock read
    client = server.client()
    client.config_resetstat()
    for i in range(50):
        task.enqueue(i)
    used = _commands(client)
    assert used["multi"] == 50
    if every:  # once each: the first MULTI of the burst (twice if it crossed a bucket)
        assert used["zcount"] <= 1 and used["expire"] <= 2, used
    else:
        assert used["zcount"] == 50 and used["expire"] == 50, used
    k = papp.keys(Q)
    for bucket in client.scan_iter(match=f"{k.metrics_prefix}*"):
        assert 0 < client.ttl(bucket) <= papp.limits.bucket_ttl  # never left without one


def test_the_clock_estimate_is_renewed_inside_the_multi(papp: conveyor.Conveyor) -> None:
    task = _warm(papp)
    runner = papp.scripts
    runner._plain._renewed -= plain.CLOCK_REFRESH_S + 1  # stale
    before = runner._plain._renewed
    task.enqueue(1)
    assert runner._plain._renewed > before
    assert abs(runner._plain.clock.now() - time.time()) < 5


# -- the kept connection -------------------------------------------------------------------


def test_threads_enqueueing_at_once_share_the_kept_connection_safely(
    papp: conveyor.Conveyor,
) -> None:
    task = _warm(papp)
    ids: list[list[str]] = [[] for _ in range(4)]

    def produce(mine: list[str]) -> None:
        for i in range(300):
            mine.append(task.enqueue(i).short_id)

    threads = [threading.Thread(target=produce, args=(mine,)) for mine in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    stored = {i for mine in ids for i in mine}
    assert len(stored) == 1200
    inbox = {m.decode() for m in papp.redis.lrange(papp.keys(Q).inbox, 0, -1)}
    assert inbox == stored
    assert int(papp.redis.hget(papp.keys(Q).counts, "ready")) == 1200


def test_a_killed_kept_connection_costs_nothing_but_a_reconnect(
    papp: conveyor.Conveyor, server: RedisServer,
) -> None:
    task = _warm(papp)
    client = server.client()
    for _ in range(3):
        mine = client.client_id()
        killed = client.client_kill_filter(_type="normal", skipme=True)
        assert killed >= 1 and client.client_id() == mine
        task.enqueue(1)
    assert papp.redis.llen(papp.keys(Q).inbox) == 3  # each stored once


def test_a_forked_child_enqueues_on_a_connection_of_its_own(papp: conveyor.Conveyor) -> None:
    task = _warm(papp)
    parent = task.enqueue(1)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if its enqueue was stored
        try:
            child = task.enqueue(2)
            os._exit(0 if child.info().state == conveyor.JobState.READY else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    after = task.enqueue(3)  # the parent's kept connection still in step
    assert [parent.short_id, after.short_id] == [i for i in _fetch(papp)
                                                 if i in (parent.short_id, after.short_id)]
    assert papp.redis.llen(papp.keys(Q).inbox) == 0


@pytest.mark.parametrize(("api", "tenant"), [("sync", ""), ("async", ""), ("sync", "acme")])
def test_a_reply_lost_after_the_enqueue_ran_stores_the_job_once(
    server: RedisServer, api: str, tenant: str,
) -> None:
    """The enqueue (a plain MULTI, or with a tenant the script) reaches Redis and runs,
    then the connection breaks before its reply arrives: the retry finds the record and
    does not store the job a second time (a second write would reset a record a worker
    may have leased by then)."""
    with Proxy(("127.0.0.1", server.port)) as proxy:
        app = conveyor.Conveyor(proxy.url, namespace="lost")
        task = _task(app)
        job = task.options(tenant=tenant) if tenant else task
        k = app.keys(Q)
        direct = server.client()

        def listed() -> int:
            return sum(direct.llen(key) for key in direct.scan_iter(k.ready_prefix + "*"))

        def arm() -> threading.Thread:
            direct.delete(k.inbox, k.counts, *direct.scan_iter(k.ready_prefix + "*"))
            proxy.delay(0.5)

            def break_after_it_ran() -> None:
                wait_until(lambda: direct.hget(k.counts, "ready"), 5, 0.005, "the write")
                proxy.reset()  # the reply, held by the delay, never arrives
                proxy.heal()

            breaker = threading.Thread(target=break_after_it_ran)
            breaker.start()
            return breaker

        async def aenqueue() -> None:
            await task.aenqueue(0)
            await task.aenqueue(0)
            breaker = arm()
            await job.aenqueue(1)
            breaker.join(10)

        try:
            if api == "async":
                run_async(app, aenqueue())
            else:
                task.enqueue(0)
                task.enqueue(0)
                breaker = arm()
                job.enqueue(1)
                breaker.join(10)
        finally:
            app.close()
        assert listed() == 1
        assert int(direct.hget(k.counts, "ready")) == 1


def test_an_async_plain_enqueue_keeps_its_deadline(server: RedisServer) -> None:
    """The async MULTI reads its replies under one deadline for the whole exchange (the
    connection's socket timeout) instead of a timer per reply: a slow reply within it
    arrives, a reply that never comes fails the call in bounded time, and once the
    connection is healthy again enqueues go on."""
    with Proxy(("127.0.0.1", server.port)) as proxy:
        app = conveyor.Conveyor(proxy.url + "?socket_timeout=1", namespace="deadline")
        task = _task(app)

        async def main() -> float:
            first = await task.aenqueue(0)  # the queue known
            await task.aenqueue(0)  # the clock read: the next ones are plain
            proxy.delay(0.3)
            slow = await task.aenqueue(1)
            proxy.heal()
            proxy.blackhole()
            began = time.monotonic()
            with pytest.raises(conveyor.PartialEnqueue) as caught:
                await task.aenqueue(2)  # sent, never answered: stored or not, it says so
            took = time.monotonic() - began
            assert caught.value.jobs == [] and len(caught.value.unconfirmed) == 1
            assert isinstance(caught.value.__cause__, (redis.exceptions.TimeoutError,
                                                       redis.exceptions.ConnectionError))
            proxy.heal()
            proxy.reset()  # the connections that timed out are dropped either way
            last = await task.aenqueue(3)
            assert all(await asyncio.gather(*(app.aredis().exists(app.keys(Q).job(j.short_id))
                                              for j in (first, slow, last))))
            return took

        try:
            took = run_async(app, asyncio.wait_for(main(), 60))
        finally:
            app.close()
        # the kept connection's 1 s, the pool's bounded retries, then the record looked
        # for until the resolve time ends (producer.send.RESOLVE_SECONDS)
        assert took < 40


MANGLED = ("inbox", "counts", "metric bucket", "wake", "waiters", "ready list", "ring",
           "priorities")


def _mangle(app: conveyor.Conveyor, client: redis.Redis, which: str) -> list[str]:
    """Write a string over one of the queue's keys; the keys written over."""
    k = app.keys(Q)
    if which == "metric bucket":  # this bucket and the next: the enqueue may cross over
        width = app.limits.bucket_seconds
        start = int(float(client.time()[0]) // width * width)
        keys = [f"{k.metrics_prefix}{start}", f"{k.metrics_prefix}{start + width}"]
    else:
        keys = [{"inbox": k.inbox, "counts": k.counts, "wake": k.wake, "waiters": k.waiters,
                 "ready list": f"{k.ready_prefix}{record.DEFAULT_PRIORITY}:",
                 "ring": f"{k.ring_prefix}{record.DEFAULT_PRIORITY}",
                 "priorities": k.priorities}[which]]
    for key in keys:
        client.set(key, "written over by hand")
    return keys


@pytest.mark.parametrize("path", ["plain", "async plain", "script"])
@pytest.mark.parametrize("which", MANGLED)
def test_an_enqueue_meeting_a_key_of_the_wrong_type_stores_its_job_once_or_not_at_all(
    papp: conveyor.Conveyor, server: RedisServer, path: str, which: str,
) -> None:
    """Redis runs the rest of a MULTI, and of a script, after a command that meets a key of
    the wrong type. Whatever the key, a single enqueue either returns its job, stored and
    listed once, or raises having stored nothing: a caller that retries after an error
    never gets the job twice, and no record is left that nothing lists."""
    task = _task(papp)
    k = papp.keys(Q)
    direct = server.client()
    job = task.options(key="one") if path == "script" else task  # a dedupe key: the script
    mangled: list[str] = []
    before: set[bytes] = set()

    def mangle() -> None:
        _fetch(papp)  # the warm-up's jobs out of the way
        before.update(direct.scan_iter(f"{k.job_prefix}*"))
        mangled.extend(_mangle(papp, direct, which))

    async def warm_then_enqueue() -> str:
        await task.aenqueue(0)  # the queue known
        await task.aenqueue(0)  # the clock read: the next one is plain
        mangle()
        return (await task.aenqueue(1)).short_id

    stored: str | None = None
    try:
        if path == "async plain":
            stored = run_async(papp, warm_then_enqueue())
        else:
            _warm(papp)
            mangle()
            stored = job.enqueue(1).short_id
    except redis.exceptions.ResponseError as exc:
        assert "WRONGTYPE" in str(exc)
    new = {key.decode() for key in set(direct.scan_iter(f"{k.job_prefix}*")) - before}
    for key in mangled:  # the repair (a ready list the enqueue set aside serves again)
        if direct.type(key) == b"string":
            direct.delete(key)
    leased = _fetch(papp)
    if stored is None:
        assert new == set()
        assert leased == []
    else:
        assert new == {k.job(stored)}
        assert leased == [stored]


def test_a_metric_bucket_of_the_wrong_type_fails_neither_a_fetch_nor_a_finish(
    papp: conveyor.Conveyor, server: RedisServer,
) -> None:
    """Metrics are bookkeeping: a bucket written over by hand is passed over. Were it not,
    the fetch would fail after granting its leases (no worker told of them: each would
    lapse and use up an attempt) and the finish after settling its jobs."""
    task = _warm(papp)
    k = papp.keys(Q)
    jobs = [task.enqueue(i).short_id for i in range(3)]
    now_ms = float(server.client().time()[0]) * 1000
    start = int(now_ms / 1000 // papp.limits.bucket_seconds * papp.limits.bucket_seconds)
    server.client().set(f"{k.metrics_prefix}{start}", "written over by hand")
    fetched = papp.scripts.run(calls.fetch(k, 10, papp.limits, now=now_ms))
    assert [j.short_id for j in fetched.jobs] == jobs
    done = papp.scripts.run(calls.finish(
        k, [calls.Outcome(j.short_id, j.token, "ok", now_ms / 1000) for j in fetched.jobs],
        papp.limits, now=now_ms + 5))
    assert done.codes == [calls.FINISH_SUCCEEDED] * 3
    states = {papp.job(keys.job_id(Q, j)).info().state for j in jobs}
    assert states == {conveyor.JobState.SUCCEEDED}
