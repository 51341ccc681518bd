"""What conveyor's scripts ask of an engine beyond Redis 7.0 (see docs/engines.md): each
starts with the ``#!lua`` shebang and carries Dragonfly's flag line right after it, and
every key a script touches carries the hash tag of the keys it was given, so an engine that
locks by hash tag (Dragonfly with ``--lock_on_hashtags``) sees no undeclared key."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from importlib import resources

import pytest
import redis

import conveyor
from conveyor.scripts import DRAGONFLY_FLAGS, SCRIPT_NAMES, dragonfly_source, source
from helpers import RedisServer, running_worker, wait_until

PIECE = re.compile(r'"((?:[^"\\]|\\.)*)"')
STOP = "conveyor-test-stop-monitor"


def test_every_script_starts_with_the_shebang_then_dragonflys_flag_line() -> None:
    root = resources.files("conveyor.scripts")
    for name in SCRIPT_NAMES:
        first, second = root.joinpath(f"{name}.lua").read_text().split("\n", 2)[:2]
        assert re.fullmatch(r"#!lua( flags=[a-z,-]+)?", first), name
        assert second == DRAGONFLY_FLAGS == "--!df flags=allow-undeclared-keys", name
        text = source(name)  # as sent to Redis and Valkey: the shebang first, and no other
        assert text.split("\n", 1)[0] == first and text.count("#!lua") == 1, name
        assert text.count("--!df") == 1, name


def test_the_dragonfly_form_starts_with_the_flag_line_and_compiles(
        redis_server: RedisServer) -> None:
    client = redis_server.client()
    for name in SCRIPT_NAMES:
        text = dragonfly_source(name)
        assert text.split("\n", 1)[0] == DRAGONFLY_FLAGS, name
        assert "#!lua" not in text and text.count("--!df") == 1, name
        # The same body as the shebang form: only the first line and the flag line moved.
        assert sorted(text.splitlines()) == sorted(
            line for line in source(name).splitlines() if not line.startswith("#!lua")), name
        assert client.script_load(text)  # valid Lua for this engine (Dragonfly: untested)
    client.close()


class Monitor:
    """The commands scripts send (MONITOR's ``[db lua]`` lines), read in a thread."""

    def __init__(self, port: int) -> None:
        self.conn = redis.Connection(port=port)
        self.conn.connect()
        self.conn.send_command("MONITOR")
        assert self.conn.read_response() in (b"OK", "OK")
        self.from_scripts: list[list[str]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while True:
            try:
                line = self.conn.read_response()
            except redis.ConnectionError:  # the server stopped: the test has failed already
                self.done.set()
                return
            text = line.decode(errors="replace") if isinstance(line, bytes) else str(line)
            if STOP in text:
                self.done.set()
                return
            if " lua] " in text:
                self.from_scripts.append(PIECE.findall(text.split(" lua] ", 1)[1]))

    def stop(self, client: redis.Redis) -> None:
        client.echo(STOP)
        wait_until(self.done.is_set, 10, message="the monitor's end")
        self.conn.disconnect()


@pytest.fixture
def watched(make_server: type[RedisServer]) -> Iterator[tuple[conveyor.Conveyor, Monitor]]:
    server = make_server().start()
    app = conveyor.Conveyor(server.url, namespace="tags")
    monitor = Monitor(server.port)
    yield app, monitor
    app.close()
    monitor.conn.disconnect()


def test_every_key_a_script_touches_carries_its_queues_tag(
        watched: tuple[conveyor.Conveyor, Monitor]) -> None:
    app, monitor = watched

    @app.task
    def work(x: int) -> int:
        if x < 0:
            raise conveyor.Fail("a dead job")
        return x

    @app.task(queue="other")
    def elsewhere(x: int) -> int:
        return x

    work.enqueue_many(range(20))
    work.options(delay=0.2).enqueue(1)
    dead = work.enqueue(-1)
    work.options(delay=60).enqueue(2).cancel()
    wf = app.workflow()
    first = wf.add(work, 3, name="first")
    wf.add(elsewhere, 4, name="second", after=[first])
    handle = wf.enqueue()
    with running_worker(app, queues=["default", "other"], concurrency=4):
        wait_until(lambda: handle.info().state != "running", 30, 0.1, "the workflow's end")
        wait_until(lambda: len(app.dead_letters()) == 1, 30, 0.1, "the dead job")
        assert app.dead_letters().requeue(dead.id) == 1
    monitor.stop(app.redis)
    tags = {"{tags:default}", "{tags:other}", "{tags:doctor}"}  # doctor: the start-up check
    keyed = [cmd for cmd in monitor.from_scripts if cmd[0].upper() not in ("TIME",)]
    assert len({cmd[0].upper() for cmd in keyed}) >= 15  # the scripts' commands were seen
    strays = [cmd[:3] for cmd in keyed
              if not any(cmd[1].startswith(tag) for tag in tags)
              or any(arg.startswith("{") and not any(arg.startswith(t) for t in tags)
                     for arg in cmd[2:])]
    assert strays == []
