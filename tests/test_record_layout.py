"""The job record's layout: what a queued job costs Redis, and one set of names.

Queued jobs are what a backlog is made of, so their records are kept small: one-letter
names for the fields every job has, and the options most jobs share left out when they are
the defaults. Python (``conveyor.record``) and Lua (``include/job_record.lua``) must agree
on those defaults, or a reader would take an absent field for the wrong value.
"""

from __future__ import annotations

import re
import time
from importlib import resources
from typing import Any

import conveyor
from conveyor import record
from helpers import RedisServer, running_worker

JOBS = 20_000


def test_lua_and_python_agree_on_the_defaults_left_out() -> None:
    text = (resources.files("conveyor.scripts") / "include" / "job_record.lua").read_text()
    lua = dict(re.findall(r"^local (DEFAULT_\w+) = '?(\d+)'?$", text, re.MULTILINE))
    assert lua == {"DEFAULT_PRIORITY": str(record.DEFAULT_PRIORITY),
                   "DEFAULT_MAX_ATTEMPTS": str(record.DEFAULT_MAX_ATTEMPTS),
                   "DEFAULT_VT": str(record.DEFAULT_VISIBILITY_MS)}


def _settled_memory(client: Any) -> int:
    """``used_memory`` once it holds still: while Redis resizes its keyspace, both tables
    are allocated (about 130 KB at 20,000 keys) until its cron finishes the move, and
    whether a reading falls inside that depends on timing."""
    deadline = time.monotonic() + 5
    last = int(client.info("memory")["used_memory"])
    while True:
        time.sleep(0.25)  # a few of the server's 100 ms cron ticks
        now = int(client.info("memory")["used_memory"])
        if now == last or time.monotonic() > deadline:
            return now
        last = now


def test_a_queued_job_with_default_options_costs_under_200_bytes() -> None:
    server = RedisServer().start()
    try:
        app = conveyor.Conveyor(server.url)

        @app.task(name="bench.incr", queue="bench")
        def incr(ts: float = 0.0) -> None:
            pass

        incr.enqueue(0.0)  # the queue's own keys exist before the baseline
        client = server.client()
        before = int(client.info("memory")["used_memory"])
        for _ in range(0, JOBS, 1000):
            incr.enqueue_many([(0.0,)] * 1000)  # the peer benchmark's job
        per_job = (_settled_memory(client) - before) / JOBS
        assert per_job <= 200, f"{per_job:.1f} B per queued job"
        app.close()
    finally:
        server.stop()
        server.cleanup()


def test_options_that_differ_from_the_defaults_are_stored_and_read_back(
        app: conveyor.Conveyor) -> None:
    @app.task(name="plain", queue="q")
    def plain() -> None:
        pass

    @app.task(name="careful", queue="q", retries=0, visibility_timeout=5)
    def careful() -> None:
        pass

    a = plain.enqueue()
    b = careful.options(priority=9).enqueue()
    stored_a = app.redis.hgetall(app.keys("q").job(a.short_id))
    assert set(stored_a) == {b"t", b"s", b"e", b"a"}
    stored_b = app.redis.hgetall(app.keys("q").job(b.short_id))
    assert stored_b[b"p"] == b"9" and stored_b[b"m"] == b"1" and stored_b[b"v"] == b"5000"
    ia, ib = a.info(), b.info()
    assert (ia.priority, ia.max_attempts) == (5, 4)
    assert (ib.priority, ib.max_attempts) == (9, 1)
    assert abs((ia.enqueued_at or 0) - time.time()) < 60
    with running_worker(app, concurrency=2):
        b.result(timeout=10)
        a.result(timeout=10)
    assert a.info().attempts == 1 and b.info().state == "succeeded"


def test_ids_made_in_bulk_look_like_ids_made_one_by_one() -> None:
    from conveyor.task import new_short_id, new_short_ids

    shape = re.compile(r"^[A-Za-z0-9_-]{16}$")
    one = new_short_id()
    many = new_short_ids(5000)
    assert shape.match(one) and all(shape.match(i) for i in many)
    assert len(set(many)) == 5000 and one not in many
    assert new_short_ids(0) == [] and len(new_short_ids(1)) == 1
