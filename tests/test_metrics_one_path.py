"""One read path for metrics: every consumer of the metric buckets agrees to the digit.

A worker process runs real jobs (quick, slower, failing) so the Lua scripts write real
buckets into the test's redis-server; then the monitor, the CLI (a separate process), the
dashboard's API and charts, the Prometheus exporter and the autoscaler's signal reader all
read those same buckets and must report the same counts, percentiles and throughput.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from starlette.testclient import TestClient

import conveyor
from conveyor.clock import server_now
from conveyor.fleet.autoscale import SignalReader
from conveyor.monitor.prometheus import RedisCollector
from conveyor.web import create_app
from helpers import RedisServer, env_with_src, scrape, wait_until, within_one_bucket
from monitor_app import make_app

CONVEYOR = str(Path(sys.executable).with_name("conveyor"))
WINDOW = 300


def prometheus(app: conveyor.Conveyor) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(RedisCollector(app, advice=False))
    return scrape(registry)


def cli_stats(app: conveyor.Conveyor) -> dict[str, Any]:
    done = subprocess.run([CONVEYOR, "stats", "--json", "-q", "default", "-w", str(WINDOW),
                           "--url", app.url, "--namespace", app.namespace],
                          env=env_with_src(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    total: dict[str, Any] = json.loads(done.stdout)["total"]
    return total


def test_every_consumer_reads_the_same_figures(redis_server: RedisServer,
                                               namespace: str, tmp_path: Path) -> None:
    app = make_app(redis_server.url, namespace)
    naps = [(0.001 * (n % 17),) for n in range(60)] + [(0.05,)] * 4
    jobs = app.tasks["nap"].enqueue_many(naps) + app.tasks["doomed"].enqueue_many([(1,), (2,)])
    env = env_with_src() | {"CONVEYOR_REDIS_URL": app.url, "MONITOR_APP_NAMESPACE": namespace}
    with (tmp_path / "worker.log").open("wb") as log:
        proc = subprocess.Popen([CONVEYOR, "worker", "monitor_app:app", "-c", "8"], env=env,
                                cwd=Path(__file__).parent, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: all(j.info().state.finished for j in jobs), 30,
                       message="jobs done by the worker process")
        finally:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(30)
    web = TestClient(create_app(app, cache_seconds=0))

    def read() -> dict[str, Any]:
        now = server_now(app.redis)
        return {
            "monitor": app.monitor.stats(queue="default", window=WINDOW),
            "recent": app.monitor.stats(queue="default", window=20),
            "minute": app.monitor.stats(queue="default", window=60),
            "nap": app.monitor.stats(task="nap", window=WINDOW),
            "cli": cli_stats(app),
            "web": web.get("/api/queues/default", params={"window": WINDOW}).json()["stats"],
            "tasks": {t["name"]: t for t in
                      web.get("/api/tasks", params={"window": WINDOW}).json()["tasks"]},
            "chart": app.monitor.series("default", WINDOW, points=1),
            "web_chart": web.get("/api/queues/default/series",
                                 params={"window": WINDOW}).json(),
            "overview": app.monitor.overview(window=60),
            "web_overview": web.get("/api/overview").json(),
            "prometheus": prometheus(app),
            "autoscaler": SignalReader(app, ["default"], 10).backlog(now)[1],
        }

    got = within_one_bucket(app, read)
    m = got["monitor"]
    assert (m.succeeded, m.dead, m.failed, m.enqueued) == (64, 2, 2, 66)
    assert m.wait.p95 is not None and m.run.p50 is not None and m.run.p99 is not None
    for figures in (got["cli"], got["web"]):
        for name in ("enqueued", "started", "succeeded", "failed", "retried", "dead"):
            assert figures[name] == getattr(m, name), name
        for kind in ("wait", "run"):
            for p in ("mean", "p50", "p95", "p99"):
                assert figures[kind][p] == getattr(getattr(m, kind), p), (kind, p)
        assert figures["throughput"] == (m.succeeded + m.dead) / figures["span"]
    nap, row = got["nap"], got["tasks"]["nap"]
    assert (row["succeeded"], row["run"]["p95"], row["wait"]["p99"]) == \
        (nap.succeeded, nap.run.p95, nap.wait.p99) == (64, nap.run.p95, nap.wait.p99)
    chart = got["chart"]
    assert chart.wait["p95"] == [m.wait.p95] and chart.run["p99"] == [m.run.p99]
    assert chart.run["p50"] == [m.run.p50]
    web_chart = got["web_chart"]
    assert round(sum(web_chart["processed"]) * web_chart["step"]) == 66
    ov = next(q for q in got["overview"].queues if q.name == "default")
    minute = got["minute"]
    assert (ov.stats.succeeded, ov.stats.dead, ov.stats.wait.p95, ov.stats.run.p99) == \
        (minute.succeeded, minute.dead, minute.wait.p95, minute.run.p99)
    assert ov.stats.throughput == (minute.succeeded + minute.dead) / ov.stats.span
    web_row = next(q for q in got["web_overview"]["queues"] if q["name"] == "default")
    assert web_row["wait_p95"] == minute.wait.p95
    prom = got["prometheus"]
    labels = '{queue="default",task="nap"}'
    assert prom[f"conveyor_jobs_succeeded_total{labels}"] == nap.succeeded
    assert prom[f"conveyor_job_run_seconds_count{labels}"] == nap.run.count
    assert prom['conveyor_jobs_dead_total{queue="default",task="doomed"}'] == m.dead
    wait_sum = prom[f"conveyor_job_wait_seconds_sum{labels}"]
    assert nap.wait.mean is not None
    assert abs(wait_sum - nap.wait.mean * nap.wait.count) <= 1e-9 * max(1.0, wait_sum)
    assert got["autoscaler"] is not None and got["autoscaler"] == got["recent"].wait.p95
