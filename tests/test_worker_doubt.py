"""A worker call whose reply is lost is sent again as it was (``worker/doubt.py``).

Redis applies the call, then the reply is lost on the way back (a loopback proxy drops it
and resets the connection, ``conveyor.faults.proxy``), twice: the script runner sends a
call once more on a fresh connection by itself, so the second loss reaches the worker's
loop. The loop sends the same call again, and the script answers with the reply it kept:
the jobs a lost fetch leased run at once on their first attempt, and an outcome that was
recorded counts as recorded, its dead-letter hook called once.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from collections.abc import Iterator

import pytest

import conveyor
from conveyor.faults.proxy import LostReplies, Proxy
from conveyor.scripts import source
from helpers import RedisServer, running_worker, wait_until

Q = "q"


def _lose_replies(app: conveyor.Conveyor, proxy: Proxy, script: str) -> LostReplies:
    """Lose the replies of the next two calls of ``script`` (loaded first: a NOSCRIPT
    reply is not what is meant to be lost)."""
    app.redis.script_load(source(script))
    sha = hashlib.sha1(source(script).encode()).hexdigest().encode()
    return proxy.lose_replies(sha, count=2)


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[Proxy]:
    with Proxy(("127.0.0.1", redis_server.port)) as made:
        yield made


@pytest.fixture
def papp(proxy: Proxy, namespace: str) -> Iterator[conveyor.Conveyor]:
    """An app whose every connection goes through the proxy."""
    application = conveyor.Conveyor(proxy.url, namespace=namespace)
    yield application
    application.close()


def test_the_jobs_of_a_fetch_whose_reply_was_lost_run_on_their_first_attempt(
    papp: conveyor.Conveyor, proxy: Proxy,
) -> None:
    runs: Counter[str] = Counter()

    @papp.task(name="once", queue=Q, retries=0, visibility_timeout=1.0)
    def once(n: int) -> int:
        runs[conveyor.current_job().id] += 1
        return n

    jobs = once.enqueue_many([(1,), (2,)])
    lost = _lose_replies(papp, proxy, "fetch")
    with running_worker(papp, queues=[Q], concurrency=4, burst=True):
        assert [job.result(timeout=10) for job in jobs] == [1, 2]
    assert lost.lost == 2
    assert [job.info().attempts for job in jobs] == [1, 1]
    assert list(runs.values()) == [1, 1]


def test_an_outcome_whose_reply_was_lost_counts_once(
    papp: conveyor.Conveyor, proxy: Proxy,
) -> None:
    dead: list[str] = []
    lock = threading.Lock()

    @papp.on_dead
    def note(info: conveyor.JobInfo) -> None:
        with lock:
            dead.append(info.id)

    @papp.task(name="fails", queue=Q, retries=0)
    def fails() -> None:
        raise ValueError("no")

    job = fails.enqueue()
    lost = _lose_replies(papp, proxy, "finish")
    with running_worker(papp, queues=[Q], concurrency=2) as worker:
        wait_until(lambda: dead, 10, message="the dead-letter hook")
        assert job.info().state == conveyor.JobState.DEAD
        assert lost.lost == 2
        assert worker.outbox.refused == 0  # recorded the first time, not refused the second
    assert dead == [job.id]
