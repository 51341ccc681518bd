"""The peer benchmark's own parts that its figures rest on: the nearly free task body
(counts reach Redis, once each, from threads, forked children and burst workers that
exit), the Redis server's CPU reading, and the rows the report prints."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import redis

from helpers import RedisServer, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.peers.procs import start_workers
from bench.peers.redis_server import private_redis
from bench.peers.report import table_rows
from bench.peers.results import PeerResult, Value
from bench.peers.targets import evaluate
from bench.peers.targets import rows as target_rows

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


def test_server_cpu_grows_with_work_and_a_poll_costs_microseconds() -> None:
    with private_redis() as server:
        before = server.cpu_seconds()
        per_get = server.poll_cpu_seconds(COUNTER, calls=2000)
        assert server.cpu_seconds() > before
        assert 0 < per_get < 0.001


def test_report_rows_name_sizes_and_compare_cpu_lower_is_better() -> None:
    def result(name: str, cpu: float) -> PeerResult:
        r = PeerResult(name, name)
        r.values = {"cpu_total": Value.of(cpu), "mem_per_job_large": Value.of(150.0)}
        return r

    rows = table_rows(
        [result("huey", 30.0), result("rq", 60.0), result("conveyor", 24.0)],
        sizes={"mem_jobs": 10_000, "mem_jobs_large": 1_000_000},
    )
    by_label = {row[0]: row for row in rows[1:]}
    cpu = by_label["Redis CPU per job: single enqueue plus drain (µs, lower is better)"]
    assert cpu[-2] == "0.80x (huey)"
    assert "Redis memory per queued job, 1,000,000 queued (bytes, lower is better)" in by_label
    assert "Redis memory per queued job, 10,000 queued (bytes, lower is better)" in by_label


def _column(name: str, **samples: list[float]) -> PeerResult:
    r = PeerResult(name, name)
    for key, values in samples.items():
        for v in values:
            r.record(key, v)
    return r


def test_a_cell_is_the_median_over_rounds_with_its_range_and_ratios_use_medians() -> None:
    rows = table_rows(
        [
            _column("huey", drain_best=[900.0, 1000.0, 1100.0], wcpu_best=[40.0]),
            _column("conveyor", drain_best=[2000.0, 2600.0, 2500.0], wcpu_best=[30.0, 20.0]),
        ]
    )
    by_label = {row[0]: row for row in rows[1:]}
    drain = by_label["drain, best for 2 cores (jobs/s, higher is better)"]
    assert drain[1:] == [
        "1,000 (900\u20131,100)",
        "2,500 (2,000\u20132,600)",
        "2.50x (huey)",
        "n/a",
    ]
    wcpu = by_label["worker CPU per job: drain, best for 2 cores (µs, lower is better)"]
    assert wcpu[1:4] == ["40.00", "25.00 (20.00\u201330.00)", "0.62x (huey)"]


def test_a_failed_round_keeps_the_other_rounds_samples() -> None:
    r = _column("huey", drain_best=[900.0])
    r.fail("drain_best", "worker exited")
    r.fail("lat_p50", "worker exited")
    assert r.value("drain_best").number == 900.0
    assert r.value("lat_p50").number is None
    by_label = {row[0]: row for row in table_rows([r])[1:]}
    assert by_label["enqueue-to-start latency p50 (ms, lower is better)"][1] == "n/a"


def test_targets_use_this_run_and_name_the_best_peer() -> None:
    results = [
        _column("ceiling", drain_best_free=[100_000.0], cpu_enq=[20.0]),
        _column("huey", drain_best_free=[8_000.0], drain_best=[7_000.0], cpu_drain=[60.0]),
        _column("rq", drain_best_free=[900.0], drain_best=[800.0], cpu_drain=[400.0]),
        _column(
            "conveyor",
            drain_best_free=[45_000.0],
            drain_best=[19_000.0],
            cpu_drain=[25.0],
            cpu_enq=[23.0],
            wcpu_best_free=[30.0],
        ),
    ]
    without = {row[0]: row for row in target_rows(evaluate(results, None))[1:]}
    assert not any("reference" in label for label in without)
    table = {row[0]: row[1:] for row in target_rows(evaluate(results, 50.0))[1:]}
    assert table["nearly free drain ≥ 0.5x the ceiling's"][2:] == ["0.45x", "not met"]
    assert table["nearly free drain ≥ 5x the best peer's"][1:] == ["8,000 (huey)", "5.62x", "met"]
    assert table["drain, best for 2 cores ≥ 2.5x the best peer's"][3] == "met"
    assert table["worker CPU per job, nearly free drain ≤ 0.5x the reference"][2:] == [
        "0.60x",
        "not met",
    ]
    assert table["Redis CPU per job, drain (best for 2 cores) ≤ 0.5x the best peer's"][3] == "met"
    assert table["Redis CPU per job, single enqueue ≤ 1.1x the ceiling's"][2:] == [
        "1.15x",
        "not met",
    ]
    alone = {row[0]: row[1:] for row in target_rows(evaluate(results[3:], None))[1:]}
    assert alone["nearly free drain ≥ 5x the best peer's"][1:] == [
        "no peer measured it",
        "n/a",
        "n/a",
    ]


def test_worker_cpu_keeps_what_forked_children_and_ended_workers_spent(tmp_path: Path) -> None:
    burn = textwrap.dedent(
        """
        import os, time
        def spin(seconds):
            end = time.process_time() + seconds
            while time.process_time() < end:
                pass
        pid = os.fork()
        if pid == 0:  # a child per job: its time reaches the parent only once reaped
            spin(0.3)
            os._exit(0)
        os.waitpid(pid, 0)
        spin(0.2)
        """
    )
    group = start_workers([[sys.executable, "-c", burn]], dict(os.environ), ROOT, tmp_path / "log")
    before = group.tree_cpu_seconds()
    wait_until(lambda: not group.alive(), timeout=30, message="worker ended")
    assert group.tree_cpu_seconds() - before >= 0.45
