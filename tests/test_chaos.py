"""``conveyor chaos``: short runs through the real command (one server; a Sentinel set
with failovers), and the invariant checker failing on a ledger that shows a lost job or a
double success."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

import conveyor
from conveyor.chaos.faults import Fault
from conveyor.chaos.invariants import Check, Counters, Evidence, JobRecord, check
from conveyor.chaos.proxy import LOST_REPLY_TARGETS, LostReplySpell, open_proxy
from conveyor.chaos.tasks import LedgerEntry, parse_entry
from helpers import RedisServer, env_with_src


def conveyor_command() -> list[str]:
    script = Path(sys.executable).with_name("conveyor")
    return [str(script)] if script.exists() else [sys.executable, "-m", "conveyor"]


def chaos(tmp_path: Path, *args: str) -> tuple[int, str]:
    out = tmp_path / "chaos.out"
    env = env_with_src()
    env["COLUMNS"] = "250"
    with open(out, "wb") as sink:
        code = subprocess.run([*conveyor_command(), "chaos", "--profile", "ci", *args], env=env,
                              stdout=sink, stderr=subprocess.STDOUT, timeout=100).returncode
    return code, out.read_text()


@pytest.mark.timeout(110)
def test_short_run_through_the_command_holds_every_invariant(tmp_path: Path) -> None:
    code, text = chaos(tmp_path, "--topology", "plain", "--seed", "4242", "--jobs", "150",
                       "--fault-seconds", "8")
    assert code == 0, text
    assert "seed 4242" in text and "every invariant held" in text
    assert re.search(r"│ failover +│ +- │ not injected: one server", text), text
    for kind in ("worker-kill", "worker-pause", "redis-kill", "client-kill", "oom",
                 "poison-raise", "poison-kill", "poison-exit", "poison-hang", "cancel",
                 "overwrite"):
        assert f"│ {kind} " in text, f"{kind} was not injected:\n{text}"
    # lost-reply comes last in the schedule: the ci profile's run reaches it, a run of
    # 8 s of faults may not.
    for kind in ("proxy-blackhole", "proxy-reset"):
        assert re.search(rf"│ {kind} +│ +\d+ │", text), text
    assert re.search(r"│\s+attempts charged without a run │ \d+\s", text), text
    assert "FAILED" not in text
    assert re.search(r"│\s+lost │ 0\s", text), text


@pytest.mark.timeout(110)
def test_short_run_on_a_sentinel_set_fails_over_and_holds_every_invariant(
        tmp_path: Path) -> None:
    """Workers and the run reach Redis through the sentinels, one worker and half the
    producer's batches through proxies that follow the primary; failovers (coordinated: no
    acknowledged write at risk) come among the other faults, which hit the current
    primary; no job is lost or succeeds twice."""
    code, text = chaos(tmp_path, "--topology", "sentinel", "--seed", "4243", "--jobs", "120",
                       "--fault-seconds", "10")
    assert code == 0, text
    assert "topology sentinel" in text and "every invariant held" in text
    failovers = re.search(r"│ failover +│ +(\d+) │", text)
    assert failovers is not None and int(failovers.group(1)) >= 1, text
    for kind in ("redis-kill", "client-kill", "oom", "worker-kill", "proxy-blackhole",
                 "proxy-reset", "lost-reply"):
        assert re.search(rf"│ {kind} +│ +\d+ │", text), f"{kind} was not injected:\n{text}"
    assert "FAILED" not in text
    assert re.search(r"│\s+lost │ 0\s", text), text


# -- the checker on hand-made evidence ---------------------------------------------------

def _run(label: str, run: str, pid: int = 100, ok: bool = True, job: str = ""
         ) -> list[LedgerEntry]:
    return [LedgerEntry(label, run, pid, "start", job)] + (
        [LedgerEntry(label, run, pid, "ok", job)] if ok else [])


def healthy() -> Evidence:
    jobs = [JobRecord("work:1", "work", "chaos~a", "succeeded", 1, None, 1),
            JobRecord("work:2", "work", "chaos~b", "succeeded", 2, "lease expired", 1),
            JobRecord("kill:1", "kill", "chaos~c", "dead", 2, "lease expired", 0)]
    ledger = (_run("work:1", "r1") + _run("work:2", "r2", ok=False)
              + _run("work:2", "r3", pid=101) + _run("kill:1", "r4", ok=False)
              + _run("kill:1", "r5", pid=101, ok=False))
    counters = Counters(ready_counter=0, ready_listed=0, active={"chaos.work": 0},
                        leased={}, dead_letters=1, dead_records=1)
    side = Counters(ready_counter=0, ready_listed=0, active={"chaos.side": 0}, leased={},
                    dead_letters=0, dead_records=0)
    return Evidence(jobs=jobs, ledger=ledger, counters={"chaos": counters, "chaos-side": side},
                    faults=[Fault("worker-kill", 1.0, "pid 100", 4)])


def failed(checks: list[Check]) -> set[str]:
    return {c.name for c in checks if not c.held}


def test_checker_holds_on_a_healthy_run() -> None:
    checks, summary = check(healthy())
    assert failed(checks) == set()
    assert (summary.jobs, summary.runs, summary.reexecutions, summary.lost_leases,
            summary.lost_jobs) == (3, 5, 1, 1, 0)


def test_checker_fails_on_a_lost_job() -> None:
    ev = healthy()
    ev.jobs[0] = dataclasses.replace(ev.jobs[0], state="ready")
    checks, summary = check(ev)
    assert "every job ends succeeded, dead or cancelled" in failed(checks)
    assert summary.lost_jobs == 1


def test_checker_fails_on_a_double_success() -> None:
    ev = healthy()
    ev.jobs[1] = dataclasses.replace(ev.jobs[1], successes=2)
    assert failed(check(ev)[0]) == {"at most one success recorded per job"}


def test_checker_fails_on_a_run_without_a_lease_and_on_unbounded_reexecutions() -> None:
    ev = healthy()
    ev.ledger += _run("work:1", "r9", pid=102)  # a second run, but only one attempt leased
    assert "every run had a lease of its own (runs <= leases granted)" in failed(check(ev)[0])
    # ... unless a second lease was granted and given back, its run not known to begin
    ev.jobs[0] = dataclasses.replace(ev.jobs[0], lost=1, unstarted=1)
    assert "every run had a lease of its own (runs <= leases granted)" not in failed(
        check(ev)[0])
    ev = healthy()
    ev.faults = []  # a lease was lost, yet nothing could have cost it
    assert failed(check(ev)[0]) == {"re-executions <= lost leases <= faults' reach"}


def test_checker_fails_on_dead_work_overlap_and_counters() -> None:
    ev = healthy()
    ev.jobs[0] = dataclasses.replace(ev.jobs[0], state="dead", error="boom")
    ev.ledger += [LedgerEntry("work:2", "r7", 101, "start"), LedgerEntry("work:2", "r8", 101,
                                                                          "start")]
    ev.counters["chaos"] = dataclasses.replace(ev.counters["chaos"], ready_counter=1,
                                               active={"chaos.work": 1})
    assert {"only poison jobs end dead", "no job ran twice at once in one process",
            "ready counter equals the ready lists",
            "active counters equal the leases, per task"} <= failed(check(ev)[0])


def test_checker_checks_the_counters_of_every_queue() -> None:
    ev = healthy()
    ev.counters["chaos-side"] = dataclasses.replace(ev.counters["chaos-side"], dead_letters=2)
    assert failed(check(ev)[0]) == {"dead-letter set equals the dead records (chaos-side)"}


def test_checker_fails_on_a_workflow_job_started_before_its_parent() -> None:
    ev = healthy()
    ev.edges = [("work:1", "work:2")]  # work:1's run completed before work:2 started
    assert failed(check(ev)[0]) == set()
    ev.edges = [("work:2", "work:1")]  # work:1 started before work:2 completed a run
    assert failed(check(ev)[0]) == {"workflow jobs start only after their parents completed"}


def test_checker_counts_workflow_jobs_below_a_cancelled_one_as_cancelled() -> None:
    ev = healthy()
    ev.jobs[1] = dataclasses.replace(ev.jobs[1], state="cancelled", error="parent cancelled")
    ev.edges = [("work:1", "work:2")]
    name = "cancelled exactly the jobs whose cancel returned True"
    assert name in failed(check(ev)[0])  # nothing above work:2 was cancelled
    ev.jobs[0] = dataclasses.replace(ev.jobs[0], state="cancelled")
    ev.cancelled = {"work:1"}
    assert name not in failed(check(ev)[0])  # cancelled with its parent
    ev.jobs[1] = dataclasses.replace(ev.jobs[1], state="succeeded")
    assert name in failed(check(ev)[0])  # its parent was cancelled, yet it ran


def test_checker_fails_on_a_leaked_running_count() -> None:
    ev = healthy()
    ev.counters["chaos"] = dataclasses.replace(ev.counters["chaos"], running=1,
                                               running_tenants={"t1": 1})
    assert failed(check(ev)[0]) == {"limits' running counts equal the leases"}


CHARGED = "no attempt charged without a run (attempts + refunded <= runs)"


def test_checker_fails_on_an_attempt_charged_without_a_run() -> None:
    """A job leased twice and run once (a fetch whose reply was lost leased it to nobody,
    or a worker died before the run began) was charged an attempt it did not run: DESIGN 5
    allows none, whatever else the record says."""
    ev = healthy()
    ev.jobs[0] = dataclasses.replace(ev.jobs[0], attempts=2)
    checks, summary = check(ev)
    assert CHARGED in failed(checks)
    assert summary.charged_without_run == 1
    # A lost lease is no excuse: the attempt of a lease lost before its run was told to
    # begin is given back ('lu'); one told was a run (the ledger shows it).
    ev.jobs[0] = dataclasses.replace(ev.jobs[0], attempts=2, lost=1)
    assert CHARGED in failed(check(ev)[0])
    ev.jobs[0] = dataclasses.replace(ev.jobs[0], attempts=1, lost=1, unstarted=1)
    checks, summary = check(ev)
    assert CHARGED not in failed(checks) and summary.charged_without_run == 0


def test_checker_counts_attempts_given_back_for_runs_that_started() -> None:
    """A run handed back by a stopping worker gave its attempt back (the record counts an
    interruption): two runs, one attempt, one refund hold; without the refund the second
    run had no lease, with a refund too many an attempt was charged without a run."""
    ev = healthy()
    ev.ledger += _run("work:1", "r9", pid=102, ok=False)
    ev.jobs[0] = dataclasses.replace(ev.jobs[0], refunds=1)
    checks, summary = check(ev)
    assert failed(checks) == set() and summary.charged_without_run == 0
    ev.jobs[0] = dataclasses.replace(ev.jobs[0], refunds=2)
    assert failed(check(ev)[0]) == {CHARGED}


def test_checker_fails_on_a_job_stored_twice() -> None:
    """An enqueue sent again after its reply was lost stored a second copy: the label
    runs under a job id other than the one the enqueue returned."""
    ev = healthy()
    ev.ledger = [dataclasses.replace(e, job="chaos~a") if e.label == "work:1" else e
                 for e in ev.ledger]
    assert failed(check(ev)[0]) == set()
    ev.ledger += _run("work:1", "r9", pid=102, job="chaos~z")
    assert failed(check(ev)[0]) == {"every job stored once (each label runs as one job)"}


def test_ledger_entries_carry_the_job_id() -> None:
    assert parse_entry(b"work:1 ab12 77 start chaos~x1") == LedgerEntry(
        "work:1", "ab12", 77, "start", "chaos~x1")
    assert parse_entry("work:1 ab12 77 ok -").job == ""
    assert parse_entry("work:1 ab12 77 ok").job == ""


def test_the_lost_reply_targets_find_conveyor_s_requests(
        redis_server: RedisServer, namespace: str) -> None:
    """The chaos proxies know conveyor's script calls by their SHA: a spell aimed at
    enqueues loses the reply of a script enqueue and of a plain one (its EXEC)."""
    link, reason = open_proxy(lambda: ("127.0.0.1", redis_server.port))
    assert link is not None, reason
    app = conveyor.Conveyor(f"{link.producer_url}?client_name=x", namespace=namespace)
    task = app.task(name="chaos.t")(lambda n: n)
    try:
        target = LOST_REPLY_TARGETS["enqueue"][0]
        for _ in range(2):  # registers the queue, reads the server's clock: the next plain
            task.enqueue(0)  # enqueue is a MULTI ... EXEC
        for options in ({"tenant": "acme"}, {}):  # a script, then a MULTI ... EXEC
            with ThreadPoolExecutor(1) as pool:
                spell = pool.submit(link.lose, target, 1, 5.0, threading.Event())
                time.sleep(0.2)
                with contextlib.suppress(redis.exceptions.ConnectionError):
                    task.options(**options).enqueue(1)  # type: ignore[arg-type]
                done: LostReplySpell = spell.result(10)
            assert done.chosen == {"producer": 1}, done
            assert done.lost == [("producer", "enqueue" if options else "exec")], done
    finally:
        app.close()
        link.close()


def _waited(ok: str = "ok", left: bool = False, taken: bool = True) -> Evidence:
    """A healthy run plus a wait job: one run suspended, the resumed one ended ``ok``."""
    ev = healthy()
    ev.jobs.append(JobRecord("wait:1", "wait", "chaos~w1", "succeeded", 1, None, 1,
                             refunds=1, suspends=1, signal_left=left, signal_taken=taken))
    ev.ledger += [LedgerEntry("wait:1", "r6", 100, "start", "chaos~w1"),
                  LedgerEntry("wait:1", "r6", 100, "suspend", "chaos~w1"),
                  LedgerEntry("wait:1", "r7", 100, "start", "chaos~w1"),
                  LedgerEntry("wait:1", "r7", 100, ok, "chaos~w1")]
    ev.children = {"chaos~w1": 1}
    return ev


def test_checker_counts_a_suspended_run_as_no_re_execution() -> None:
    checks, summary = check(_waited())
    assert failed(checks) == set()
    assert (summary.reexecutions, summary.lost_leases) == (1, 1)  # those of work:2 alone


def test_checker_fails_on_a_wait_resumed_wrongly_or_a_signal_left_or_two_children() -> None:
    assert "every wait resumed with its own signal and child" in failed(
        check(_waited(ok="wrong"))[0])
    assert "no signal consumed twice or left unconsumed" in failed(check(_waited(left=True))[0])
    assert "no signal consumed twice or left unconsumed" in failed(
        check(_waited(taken=False))[0])
    ev = _waited()
    ev.children = {"chaos~w1": 2}
    assert "no child stored twice for one wait" in failed(check(ev)[0])


def test_checker_allows_a_late_start_only_to_a_run_whose_lease_was_lost() -> None:
    ev = healthy()
    ev.jobs.append(JobRecord("expiring:1", "expiring", "chaos~e1", "expired", 1, None, 0))
    ev.ledger.append(LedgerEntry("expiring:1", "r8", 100, "late", "chaos~e1"))
    assert "no job started after its expiry" in failed(check(ev)[0])
    ev.jobs[-1] = dataclasses.replace(ev.jobs[-1], lost=1)  # a stopped worker went on late
    assert "no job started after its expiry" not in failed(check(ev)[0])
