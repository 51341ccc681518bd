"""The peer benchmark's nearly free task body: counts reach Redis, once each, from
threads, forked children and burst workers that exit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import redis

from helpers import RedisServer, wait_until

ROOT = Path(__file__).resolve().parent.parent
COUNTER = "bench:done"


def _body(url: str, code: str) -> subprocess.Popen[str]:
    """Run *code* in a fresh interpreter whose task body is the nearly free one."""
    env = os.environ | {"BENCH_REDIS_URL": url, "BENCH_BODY": "free", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        stdin=subprocess.PIPE,
        text=True,
    )


def _count(client: redis.Redis) -> int:
    raw = client.get(COUNTER)
    return int(raw) if raw else 0


def test_free_body_flushes_from_a_live_process_without_an_incr_per_job(
    make_server: type[RedisServer],
) -> None:
    server = make_server().start()
    client = server.client()
    client.config_resetstat()
    proc = _body(
        server.url,
        """
        import sys, threading
        from bench.peers.drivers.common import record
        threads = [threading.Thread(target=lambda: [record() for _ in range(500)])
                   for _ in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        sys.stdin.read()  # stay alive: only the flusher thread can deliver the count
        """,
    )
    try:
        wait_until(lambda: _count(client) == 2000, timeout=10, message="2000 counted")
        stats = client.info("commandstats")
        assert "cmdstat_incr" not in stats
        assert int(stats["cmdstat_incrby"]["calls"]) < 2000
    finally:
        proc.communicate("", timeout=10)
    assert proc.returncode == 0
    assert _count(client) == 2000


def test_free_body_counts_a_forked_child_once_and_flushes_at_exit(
    make_server: type[RedisServer],
) -> None:
    server = make_server().start()
    proc = _body(
        server.url,
        """
        import os, sys
        from bench.peers.drivers import common
        for _ in range(5):
            common.record()
        pid = os.fork()
        if pid == 0:  # the parent's pending 5 must not be counted again here
            for _ in range(3):
                common.record()
            sys.exit(0)
        os.waitpid(pid, 0)
        """,
    )
    proc.communicate("", timeout=30)
    assert proc.returncode == 0
    assert _count(server.client()) == 8


def test_latency_probes_keep_the_full_body(make_server: type[RedisServer]) -> None:
    server = make_server().start()
    proc = _body(
        server.url,
        """
        import time, os
        from bench.peers.drivers.common import record
        record(time.time())
        os._exit(0)  # no atexit flush: the probe must already be in Redis
        """,
    )
    proc.communicate("", timeout=30)
    assert _count(server.client()) == 1
    assert server.client().llen("bench:latency") == 1
