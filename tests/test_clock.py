"""The server's clock, read through its one reader (``conveyor.clock``)."""

from __future__ import annotations

import time

import conveyor
from conveyor import clock
from conveyor.clock import ServerClock
from helpers import run_async


def _raw_time(app: conveyor.Conveyor) -> float:
    sec, usec = app.redis.execute_command("TIME")
    return int(sec) + int(usec) / 1e6


def test_every_reader_agrees_with_the_server(app: conveyor.Conveyor) -> None:
    before = _raw_time(app)
    direct = clock.server_now(app.redis)
    with app.redis.pipeline(transaction=False) as pipe:
        clock.ask(pipe)
        pipe.ping()
        piped = clock.from_reply(pipe.execute()[0])

    async def read() -> float:
        return await clock.aserver_now(app.aredis())

    awaited = run_async(app, read())
    after = _raw_time(app)
    assert before <= direct <= piped <= awaited <= after
    assert after - before < 1.0


def test_a_synced_clock_follows_the_server_not_the_local_wall_clock(
        app: conveyor.Conveyor) -> None:
    c = ServerClock()
    assert abs(c.now() - time.time()) < 0.5  # nothing observed yet: the local clock
    read = c.refresh(app.redis)
    assert abs(c.now() - read) < 0.5
    assert abs(c.now() - _raw_time(app)) < 0.5
    c.observe((time.time() + 3600) * 1000)  # a server an hour ahead of this machine
    assert 3599 < c.now() - time.time() < 3601
    assert abs(c.seconds_until((c.now() + 10) * 1000) - 10) < 0.5

    async def refresh() -> float:
        return await c.arefresh(app.aredis())

    run_async(app, refresh())
    assert abs(c.now() - _raw_time(app)) < 0.5


def test_a_zero_reply_falls_back_to_the_local_clock() -> None:
    assert abs(clock.from_reply((0, 0)) - time.time()) < 0.5
    assert clock.from_reply((b"1700000000", b"250000")) == 1_700_000_000.25
