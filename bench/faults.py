"""``python -m bench.faults``: the kill -9 storm, with its figures.

Jobs that count their own runs in a ledger (``tests/apps/ledger.py``) are enqueued on a
private durable redis-server; worker processes serve them while one of them is SIGKILLed
every ``--interval`` seconds for ``--seconds`` and restarted at once. Then it waits for
every job to succeed and prints: jobs, kills, re-executions (runs beyond one per job,
against the bound kills x concurrency) and lost jobs (must be 0). Exits non-zero when a
job is lost or the bound is broken.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__)
    parser.add_argument("--jobs", type=int, default=1500)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.5, help="length of the storm")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between kills")
    parser.add_argument("--min-kills", type=int, default=20,
                        help="prolong the storm (up to twice --seconds) until this many kills")
    parser.add_argument("--task-ms", type=float, default=20.0, help="work per job")
    return parser.parse_args(argv)


def _ensure_venv() -> None:
    """Re-run under the repository's virtualenv when this interpreter lacks conveyor."""
    try:
        import conveyor  # noqa: F401
    except ImportError:
        venv_python = ROOT / ".venv" / "bin" / "python"
        if venv_python.exists() and not os.environ.get("BENCH_REEXEC"):
            os.environ["BENCH_REEXEC"] = "1"
            os.execv(str(venv_python), [str(venv_python), "-m", "bench.faults", *sys.argv[1:]])
        raise SystemExit("bench.faults needs conveyor installed (make deps)") from None


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    _ensure_venv()
    sys.path.insert(0, str(ROOT / "tests"))
    from apps.ledger import build
    from apps.ledger_fleet import Fleet, kill_storm
    from helpers import RedisServer, wait_until

    server = RedisServer(durable=True).start()
    ledger = build(server.url, "faults")
    try:
        jobs = ledger.record.enqueue_many(
            [(n, args.task_ms / 1000) for n in range(args.jobs)])
        began = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="conveyor-faults-") as logs:
            fleet = Fleet(ledger, Path(logs), args.workers, args.concurrency).start()
            try:
                storm = kill_storm(fleet, args.seconds, args.interval,
                                   work_left=lambda: not ledger.all_succeeded(jobs),
                                   min_kills=args.min_kills, max_seconds=2 * args.seconds)
                try:
                    wait_until(lambda: ledger.all_succeeded(jobs), 120, interval=0.2,
                               message="every job to succeed")
                except AssertionError as exc:
                    print(exc, file=sys.stderr)
            finally:
                fleet.stop()
        elapsed = time.monotonic() - began
        census = ledger.census(jobs)
        counts = ledger.counts()
        working = storm.kills_of_working(ledger)
    finally:
        ledger.close()
        server.cleanup()

    lost = len(jobs) - census.get("succeeded", 0)
    reexecutions = sum(counts.values()) - sum(1 for n in range(args.jobs) if str(n) in counts)
    bound = storm.kills_during_work * args.concurrency
    rows = [
        ("jobs", f"{len(jobs)}"),
        ("workers", f"{args.workers} processes x concurrency {args.concurrency}"),
        ("storm", f"{storm.seconds:.1f} s, one SIGKILL every {args.interval} s"),
        ("kills", f"{storm.kills} ({storm.kills_during_work} while jobs were unfinished,"
                  f" {working} of processes that had run jobs)"),
        ("re-executions", f"{reexecutions} (bound: kills x concurrency = {bound})"),
        ("lost", f"{lost}"),
        ("states", ", ".join(f"{k}={v}" for k, v in sorted(census.items(), key=str))),
        ("all done in", f"{elapsed:.1f} s"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0 if lost == 0 and reexecutions <= bound else 1


if __name__ == "__main__":
    raise SystemExit(main())
