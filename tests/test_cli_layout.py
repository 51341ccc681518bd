"""The terminal views at ordinary widths, through the real console script: ids and task
names appear whole at 80, 100 and 120 columns, and every read command offers --json."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import conveyor
from conveyor import testing
from helpers import RedisServer, env_with_src

CONVEYOR = str(Path(sys.executable).with_name("conveyor"))
LONG_TASK = "reports.build_quarterly_revenue_summary_for_every_region"
QUEUE = "quarterly-reports-eu-west"


@pytest.fixture
def worked(redis_server: RedisServer, namespace: str) -> Iterator[conveyor.Conveyor]:
    """An app whose long-named task ran: 3 succeeded and 60 went dead."""
    app = conveyor.Conveyor(redis_server.url, namespace=namespace)

    @app.task(name=LONG_TASK, queue=QUEUE, retries=0)
    def build(n: int) -> int:
        if n >= 3:
            raise LookupError(f"region {n} has no ledger " + "and a long explanation " * 8)
        return n

    build.enqueue_many([(n,) for n in range(63)])
    testing.drain(app, [QUEUE])
    yield app
    app.close()


def cli(app: conveyor.Conveyor, columns: int, *args: str, ok: bool = True
        ) -> subprocess.CompletedProcess[str]:
    env = env_with_src()
    env.update(COLUMNS=str(columns), LINES="30")
    done = subprocess.run([CONVEYOR, *args, "--url", app.url, "--namespace", app.namespace],
                          env=env, capture_output=True, text=True, timeout=60)
    if ok:
        assert done.returncode == 0, done.stderr
    return done


def widest(text: str) -> int:
    return max(len(line.rstrip()) for line in text.splitlines())


@pytest.mark.parametrize("columns", [80, 100, 120])
def test_stats_shows_whole_task_names(worked: conveyor.Conveyor, columns: int) -> None:
    out = cli(worked, columns, "stats").stdout
    assert LONG_TASK in out and QUEUE in out and "…" not in out
    assert "wait p95 (s)" in out.replace("\n", " ") or "(s)" in out
    assert widest(out) <= columns


@pytest.mark.parametrize("columns", [80, 100, 120])
def test_dead_list_shows_whole_ids_and_counts(worked: conveyor.Conveyor, columns: int) -> None:
    ids = [info.id for info in worked.dead_letters(QUEUE).list(limit=50)]
    out = cli(worked, columns, "dead", "list", QUEUE).stdout
    assert f"dead in {QUEUE}: 50 of 60" in out
    for job_id in ids:
        assert job_id in out  # whole, on one line, to copy into `dead requeue --id`
    assert LONG_TASK in out and "LookupError: region 3 has no ledger" in out
    assert widest(out) <= columns and "…" not in out


@pytest.mark.parametrize("columns", [80, 100, 120])
def test_top_and_info_fit(worked: conveyor.Conveyor, columns: int) -> None:
    top = cli(worked, columns, "top", "-n", "1").stdout
    info = cli(worked, columns, "info").stdout
    for out in (top, info):
        assert QUEUE in out and widest(out) <= columns and "…" not in out
    assert LONG_TASK in top


def test_wide_terminals_get_one_table(worked: conveyor.Conveyor) -> None:
    out = cli(worked, 200, "dead", "list", QUEUE, "-n", "2").stdout
    header = next(line for line in out.splitlines() if " id " in f" {line} ")
    for name in ("id", "task", "attempts", "died (UTC)", "error"):
        assert name in header


@pytest.mark.parametrize("args", [("stats",), ("info",), ("top",), ("dead", "list", QUEUE),
                                  ("advice", QUEUE), ("limits", QUEUE)], ids=" ".join)
def test_every_read_command_has_json(worked: conveyor.Conveyor, args: tuple[str, ...]) -> None:
    json.loads(cli(worked, 80, *args, "--json").stdout)


def test_an_unknown_queue_is_an_error(worked: conveyor.Conveyor) -> None:
    for args in (("dead", "list", QUEUE + "x"), ("dead", "purge", QUEUE + "x", "--yes"),
                 ("dead", "requeue", QUEUE + "x", "--yes"), ("stats", "-q", QUEUE + "x"),
                 ("advice", QUEUE + "x")):
        done = cli(worked, 80, *args, ok=False)
        assert done.returncode == 1
        assert f"unknown queue '{QUEUE}x'" in done.stderr and QUEUE in done.stderr


def test_q_quits_top_on_a_terminal(worked: conveyor.Conveyor) -> None:
    import os
    import pty
    import threading

    from helpers import wait_until

    master, slave = pty.openpty()
    env = {**env_with_src(), "COLUMNS": "80", "LINES": "30", "TERM": "xterm"}
    proc = subprocess.Popen([CONVEYOR, "top", "-i", "0.2", "--url", worked.url,
                             "--namespace", worked.namespace],
                            stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    seen = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                return
            if not chunk:
                return
            seen.extend(chunk)

    threading.Thread(target=read, daemon=True).start()
    try:
        wait_until(lambda: b"q quits" in seen, 20, message="the first frame")
        assert proc.poll() is None  # it keeps redrawing until told
        os.write(master, b"q")
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        os.close(master)
    assert LONG_TASK.encode() in seen
