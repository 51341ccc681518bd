"""conveyor through Redis Sentinel: URLs, and a failover while jobs flow."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

import conveyor
from conveyor import clients
from conveyor.clients import parse_sentinel_url
from helpers import running_worker, wait_until
from sentinel_helpers import SentinelSet


@pytest.fixture
def sentinels() -> Iterator[SentinelSet]:
    group = SentinelSet().start()
    yield group
    group.cleanup()


def test_sentinel_urls_are_read_or_refused_by_name() -> None:
    target = parse_sentinel_url("rediss+sentinel://u:p%40ss@a:1,b:26380/svc/3")
    assert target.sentinels == (("a", 1), ("b", 26380))
    assert (target.service, target.db, target.tls) == ("svc", 3, True)
    assert (target.username, target.password) == ("u", "p@ss")
    assert parse_sentinel_url("redis+sentinel://a:1/svc").db == 0
    named = parse_sentinel_url("redis+sentinel://a:1/svc/2?client_name=me%20too")
    assert (named.service, named.db, named.client_name) == ("svc", 2, "me too")
    for bad, says in [("redis+sentinel://a/svc/0", "host:port"),
                      ("redis+sentinel://a:1/", "service"),
                      ("redis+sentinel://a:1/svc/x", "not a number"),
                      ("redis+sentinel://a:1/svc/0?db=3", "only client_name, not db"),
                      ("redis+sentinel://a:1/svc/0?client_name", "unreadable query")]:
        with pytest.raises(conveyor.ConfigurationError, match=says):
            parse_sentinel_url(bad)


def test_jobs_run_through_sentinel(sentinels: SentinelSet) -> None:
    app = conveyor.Conveyor(sentinels.url + "?client_name=through-sentinel",
                            namespace=f"s{uuid.uuid4().hex[:8]}")

    @app.task(name="add")
    def add(x: int, y: int) -> int:
        return x + y

    try:
        with running_worker(app, concurrency=2):
            assert add.enqueue(1, 2).result(timeout=10) == 3
        names = [c.get("name") for c in app.redis.client_list()]
        assert "through-sentinel" in names  # the connections to the primary carry the name
    finally:
        app.close()


def test_a_failover_while_jobs_flow(sentinels: SentinelSet) -> None:
    """Workers follow the new primary within seconds; every job whose enqueue returned
    after the failover completed runs; and a coordinated failover (writes paused until the
    replica caught up, the old primary demoted before they resume) loses no job whose
    enqueue returned."""
    app = conveyor.Conveyor(sentinels.url, namespace=f"s{uuid.uuid4().hex[:8]}")
    ran: set[int] = set()

    @app.task(name="mark")
    def mark(n: int) -> int:
        ran.add(n)
        return n

    before: list[conveyor.Job] = []
    refused = 0
    stop = threading.Event()

    def produce() -> None:
        nonlocal refused
        n = 0
        while not stop.is_set():
            try:
                before.append(mark.enqueue(n))
            except Exception:
                refused += 1
                time.sleep(0.05)
            n += 1
            time.sleep(0.005)

    try:
        with running_worker(app, concurrency=4):
            producer = threading.Thread(target=produce, daemon=True)
            producer.start()
            wait_until(lambda: len(ran) >= 50, 15, message="jobs flowing")
            began = time.monotonic()
            sentinels.failover()
            stop.set()
            producer.join(10)
            after = [mark.enqueue(100_000 + i) for i in range(50)]
            assert [j.result(timeout=30) for j in after] == list(range(100_000, 100_050))
            followed = time.monotonic() - began
            at_risk = [j for j in before if _missing(j)]
        print(f"failover: followed in {followed:.1f} s; {len(before)} enqueues acknowledged"
              f" around it, {len(at_risk)} lost, {refused} refused")
        assert followed < 30
        assert at_risk == []
    finally:
        app.close()


def _missing(job: conveyor.Job) -> bool:
    try:
        job.info()
    except conveyor.JobNotFound:
        return True
    return False


def test_clients_leave_a_primary_the_sentinels_replaced(sentinels: SentinelSet) -> None:
    """After a failover as Sentinel alone runs it (no write pause), the old primary keeps
    taking writes until the sentinels demote it seconds later, and those writes are lost.
    conveyor's clients ask the sentinels for the primary about once a second, so writes
    acknowledged a few seconds after the sentinels named the new primary are never lost,
    from the sync and the asyncio client alike."""
    sync = clients.sync_client(sentinels.url)
    acked: dict[str, list[tuple[float, str]]] = {"sync": [], "async": []}
    stop = threading.Event()

    def write_sync() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            with contextlib.suppress(Exception):
                sync.set(f"sync:{n}", 1)
                acked["sync"].append((time.monotonic(), f"sync:{n}"))

    async def write_async() -> None:
        client = clients.async_client(sentinels.url)
        n = 0
        while not stop.is_set():
            n += 1
            try:
                await client.set(f"async:{n}", 1)
                acked["async"].append((time.monotonic(), f"async:{n}"))
            except Exception:
                await asyncio.sleep(0.01)
        await client.aclose()

    threads = [threading.Thread(target=write_sync, daemon=True),
               threading.Thread(target=lambda: asyncio.run(write_async()), daemon=True)]
    try:
        for t in threads:
            t.start()
        wait_until(lambda: len(acked["sync"]) > 100 and len(acked["async"]) > 100, 15,
                   message="writes flowing")
        old = sentinels.primary()
        sentinels.failover(pause_writes=False)
        switched = time.monotonic()
        wait_until(lambda: old.client().info("replication")["role"] == "slave", 40, 0.2,
                   "the sentinels to demote the old primary")
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(15)
        fresh = clients.sync_client(sentinels.url)
        for name, writes in acked.items():
            late = [key for at, key in writes if at > switched + 3.0]
            lost = [key for key in late if not fresh.exists(key)]
            print(f"{name}: {len(late)} writes acknowledged 3 s after the switch, {len(lost)}"
                  " lost")
            assert late and not lost, f"{name}: {len(lost)} of {len(late)} lost"
        fresh.close()
    finally:
        stop.set()
        sync.close()


def test_a_primary_killed_past_down_after_stays_primary_and_keeps_its_jobs(
        sentinels: SentinelSet) -> None:
    """The chaos run's Redis kill on a Sentinel set: the sentinels are held from failing
    over (an unplanned failover could lose acknowledged writes), the primary comes back
    from its append-only file in its role, and every job whose enqueue returned is there."""
    app = conveyor.Conveyor(sentinels.url, namespace=f"s{uuid.uuid4().hex[:8]}")

    @app.task(name="noop")
    def noop() -> None:
        return None

    try:
        jobs = [noop.enqueue() for _ in range(200)]
        primary = sentinels.primary()
        detail = sentinels.crash(lambda: (time.sleep(2.5), 2.5)[1])  # past down-after (1 s)
        assert detail == f"primary :{primary.port} down 2.5 s"
        assert sentinels.primary().port == primary.port
        assert primary.client().info("replication")["role"] == "master"
        wait_until(lambda: all(_present(j) for j in jobs), 20, 0.2, "the jobs back")
        states = {job.info().state for job in jobs}
        assert states == {conveyor.JobState.READY}, states
    finally:
        app.close()


def _present(job: conveyor.Job) -> bool:
    try:
        return not _missing(job)
    except Exception:  # the client reconnecting after the restart
        return False
