"""``conveyor doctor`` through its console script against private servers configured well and
badly, a Cluster, a restricted ACL user and no server at all; the worker's start-up check
through the same checks; the engine and persistence verdicts on other engines' replies."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from conveyor.doctor import FAIL, OK, WARN, check_engine, check_persistence
from conveyor.worker.server_check import check_server
from helpers import RedisCluster, RedisServer, env_with_src, free_port

CONVEYOR = str(Path(sys.executable).with_name("conveyor"))
NAMES = ["engine", "scripting", "persistence", "memory", "topology", "arguments", "latency",
         "clock", "acl"]


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    env = env_with_src()
    env.pop("CONVEYOR_REDIS_URL", None)
    env["COLUMNS"] = "80"
    return subprocess.run([CONVEYOR, "doctor", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def checks(url: str) -> tuple[int, dict[str, dict[str, Any]]]:
    done = doctor("--url", url, "--json")
    report = json.loads(done.stdout)
    assert report["exit_code"] == done.returncode
    return done.returncode, {c["name"]: c for c in report["checks"]}


def test_a_healthy_server_passes_every_check_in_lines_of_80_columns(
        make_server: type[RedisServer]) -> None:
    server = make_server(durable=True, extra=["--maxmemory-policy", "noeviction"]).start()
    done = doctor("--url", server.url)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line.split()[1] for line in lines] == NAMES
    assert all(line.startswith("✓") for line in lines), done.stdout
    assert max(len(line) for line in lines) <= 80
    assert "AOF on" in done.stdout and "plain primary with 0 replicas" in done.stdout


def test_persistence_off_and_an_evicting_policy_are_reported_with_their_fixes(
        make_server: type[RedisServer]) -> None:
    server = make_server(extra=["--maxmemory", "100mb", "--maxmemory-policy",
                                "allkeys-lru"]).start()
    code, found = checks(server.url)
    assert code == 2  # warnings only: conveyor works there, but can lose jobs
    assert found["persistence"]["status"] == WARN
    assert found["persistence"]["fix"] == "appendonly yes"
    assert found["memory"]["status"] == WARN
    assert "allkeys-lru" in found["memory"]["detail"]
    assert found["memory"]["fix"] == "maxmemory-policy noeviction"
    text = doctor("--url", server.url).stdout
    assert "→ appendonly yes" in text and "→ maxmemory-policy noeviction" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_rdb_snapshots_alone_are_a_warning(make_server: type[RedisServer]) -> None:
    server = make_server().start()
    server.client().config_set("save", "3600 1")
    _, found = checks(server.url)
    assert found["persistence"]["status"] == WARN
    assert "RDB only" in found["persistence"]["detail"]


def test_an_unreachable_server_is_one_line_and_exit_1() -> None:
    done = doctor("--url", f"redis://127.0.0.1:{free_port()}/0")
    assert done.returncode == 1
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "cannot reach Redis" in done.stderr and "Traceback" not in done.stderr


def test_a_cluster_reports_its_primaries(cluster: RedisCluster) -> None:
    code, found = checks(cluster.url)
    assert found["topology"] == {"name": "topology", "status": OK,
                                 "detail": "Cluster with 3 primaries", "fix": ""}
    assert found["scripting"]["status"] == OK and found["arguments"]["status"] == OK
    assert code in (0, 2)  # the cluster's nodes run without AOF: a warning, not a failure


def test_a_sentinel_url_reports_its_primary_and_replica() -> None:
    from sentinel_helpers import SERVICE, SentinelSet

    group = SentinelSet().start()
    try:
        _, found = checks(group.url)
    finally:
        group.cleanup()
    assert found["topology"]["status"] == OK
    assert found["topology"]["detail"] == f"Sentinel primary {SERVICE!r} with 1 replica"
    assert found["scripting"]["status"] == OK


def test_a_replica_fails_topology_and_writes(make_server: type[RedisServer]) -> None:
    primary = make_server(durable=True).start()
    replica = make_server(durable=True).start()
    replica.client().replicaof("127.0.0.1", primary.port)
    code, found = checks(replica.url)
    assert code == 1
    assert found["topology"]["status"] == FAIL and "slave" in found["topology"]["detail"]
    assert found["scripting"]["status"] == FAIL
    assert found["scripting"]["fix"] == "use the primary"


def test_a_user_that_may_not_run_evalsha_is_reported(make_server: type[RedisServer]) -> None:
    server = make_server(durable=True, extra=["--maxmemory-policy", "noeviction"]).start()
    server.client().acl_setuser("limited", enabled=True, passwords=["+pw"], keys=["*"],
                                channels=["*"], commands=["+@all", "-evalsha"])
    code, found = checks(f"redis://limited:pw@127.0.0.1:{server.port}/0")
    assert code == 1
    assert found["acl"]["status"] == FAIL
    assert found["acl"]["detail"] == "'limited' may not run EVALSHA"


def test_a_user_kept_to_other_keys_is_reported(make_server: type[RedisServer]) -> None:
    server = make_server(durable=True, extra=["--maxmemory-policy", "noeviction"]).start()
    server.client().acl_setuser("other", enabled=True, passwords=["+pw"], keys=["other:*"],
                                commands=["+@all"])
    _, found = checks(f"redis://other:pw@127.0.0.1:{server.port}/0")
    assert found["scripting"]["status"] == FAIL  # its probe key is not the user's
    assert found["acl"]["status"] == FAIL
    assert found["acl"]["detail"].startswith("'other' may not run EVALSHA, EVAL, DEL")


def test_the_worker_logs_each_problem_as_a_warning(make_server: type[RedisServer],
                                                   caplog: pytest.LogCaptureFixture) -> None:
    server = make_server(extra=["--maxmemory", "100mb", "--maxmemory-policy",
                                "volatile-lru"]).start()

    async def start_up() -> list[str]:
        client = redis.asyncio.Redis(port=server.port)
        try:
            return await check_server(client, "ns")
        finally:
            await client.aclose()

    with caplog.at_level(logging.WARNING, logger="conveyor.worker"):
        found = asyncio.run(start_up())
    assert len(found) == 2
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("persistence" in m and "fix: appendonly yes" in m for m in logged)
    assert any("volatile-lru" in m and "noeviction" in m for m in logged)


@pytest.mark.parametrize(("server", "engine", "status"), [
    ({"redis_version": "7.0.15"}, "Redis 7.0.15", OK),
    ({"redis_version": "6.2.14"}, "Redis 6.2.14: scripts need 7.0", FAIL),
    ({"redis_version": "7.2.4", "server_name": "valkey", "valkey_version": "8.0.1"},
     "Valkey 8.0.1", OK),
    ({"redis_version": "7.4.0", "dragonfly_version": "df-v1.25.0"},
     "Dragonfly df-v1.25.0: not tested", WARN),
    ({"version": "1.0"}, "unknown engine ?: not tested", WARN),
])
def test_engines_are_told_apart_by_their_info(server: dict[str, Any], engine: str,
                                               status: str) -> None:
    verdict = check_engine(server)
    assert (verdict.detail, verdict.status) == (engine, status)


def test_persistence_verdicts() -> None:
    assert check_persistence(True, None).status == OK
    assert check_persistence(False, None).detail == "AOF off; RDB unknown"
    assert check_persistence(False, "").detail == "none: a restart loses every job"
    assert check_persistence(False, "900 1").fix == "appendonly yes"
