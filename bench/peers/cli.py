"""Argument parsing and the top-level loop: rounds, and the peers in turn within each.

Every round runs every selected peer once, in table order, so that a slow
spell of a shared machine falls on all of them alike rather than on whichever
peer happened to be running; each figure is then the median over the rounds.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

from . import dashboard, targets
from .driver_handle import DriverHandle
from .options import Options
from .redis_server import RedisServer, private_redis
from .report import print_table, print_targets, write_markdown
from .results import PeerResult
from .scenarios import PeerBench
from .specs import PeerSpec, select
from .venvs import BENCH_DIR, VenvError, ensure_venv


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    p.add_argument("--peers", help="comma list, e.g. rq,celery,conveyor (default: all)")
    p.add_argument("--quick", action="store_true", help="small workloads, 1 round: a smoke test")
    p.add_argument("--jobs", type=int, help="jobs per drain run (default 20000)")
    p.add_argument(
        "--runs",
        type=int,
        help="rounds, each running every peer once in turn; median and min-max (default 3)",
    )
    p.add_argument("--enqueue-jobs", type=int, help="jobs per enqueue run (default 3000)")
    p.add_argument("--drain-cap", type=float, help="seconds before a drain run is cut off")
    p.add_argument(
        "--mem-jobs",
        type=int,
        help="queued jobs for the large memory figure (default 1000000; conveyor always, "
        "a peer only if its enqueue rate fills them within --mem-budget)",
    )
    p.add_argument("--mem-budget", type=float, help="seconds a peer's large fill may take (30)")
    p.add_argument("--no-dashboard", action="store_true", help="skip the dashboard cost table")
    p.add_argument(
        "--cpu-reference-us",
        type=float,
        help="reference worker CPU per job (µs); target: conveyor's nearly free drain at half",
    )
    p.add_argument(
        "--output",
        type=Path,
        default=BENCH_DIR / "RESULTS.md",
        help="markdown report path (default bench/RESULTS.md)",
    )
    p.add_argument("--no-write", action="store_true", help="print the table only")
    return p


def _options(args: argparse.Namespace) -> Options:
    overrides = {
        k: v
        for k, v in {
            "jobs": args.jobs,
            "runs": args.runs,
            "enqueue_jobs": args.enqueue_jobs,
            "drain_cap_s": args.drain_cap,
            "mem_jobs_large": args.mem_jobs,
            "mem_large_budget_s": args.mem_budget,
        }.items()
        if v is not None
    }
    if args.jobs is not None:
        overrides.setdefault("mem_jobs", min(10_000, args.jobs))
    return Options.quick(**overrides) if args.quick else Options(**overrides)


def _prepare(
    spec: PeerSpec, server: RedisServer, opts: Options, log_dir: Path
) -> PeerBench | PeerResult:
    """The peer's venv and driver, ready for rounds; or its n/a column and why."""
    try:
        python = ensure_venv(spec, log=print)
    except VenvError as exc:
        return PeerResult(spec.name, spec.title, status=f"n/a: venv: {exc}")
    handle = DriverHandle(spec, python, server.url, log_dir, server.pid)
    bench = PeerBench(handle, server, opts, log=print)
    return bench if bench.describe() else bench.result


def _load_average() -> str:
    """Recorded per peer: anything else busy on a 2-core box skews its figures."""
    return Path("/proc/loadavg").read_text().split()[0]


def _rounds(
    specs: list[PeerSpec], server: RedisServer, opts: Options, log_dir: Path
) -> list[PeerResult]:
    """Every round runs each peer that could start once, in *specs* order."""
    columns: dict[str, PeerBench | PeerResult] = {}
    loads: dict[str, list[str]] = {s.name: [] for s in specs}
    for rnd in range(1, opts.runs + 1):
        for spec in specs:
            t0 = time.monotonic()
            print(f"== {spec.title} (round {rnd}/{opts.runs})")
            try:
                if spec.name not in columns:
                    columns[spec.name] = _prepare(spec, server, opts, log_dir)
                column = columns[spec.name]
                if isinstance(column, PeerResult):
                    print(f"  {column.status}")
                    continue
                column.run_round(first=rnd == 1)
            except Exception as exc:  # never let one peer sink the run
                _harness_error(columns, spec, rnd, exc)
            finally:
                server.flush()
            loads[spec.name].append(_load_average())
            print(f"  ({time.monotonic() - t0:.0f}s, load average {loads[spec.name][-1]})")
    results = []
    for spec in specs:
        column = columns[spec.name]
        result = column.finish() if isinstance(column, PeerBench) else column
        if loads[spec.name]:
            after = ", ".join(loads[spec.name])
            result.config.append(f"1-min load average after each round: {after}")
        results.append(result)
    return results


def _harness_error(
    columns: dict[str, PeerBench | PeerResult], spec: PeerSpec, rnd: int, exc: Exception
) -> None:
    """A peer that could not start is an n/a column; one that fails later keeps the
    figures of its other rounds, with a note."""
    print(f"  harness error: {exc!r}")
    column = columns.get(spec.name)
    if isinstance(column, PeerBench):
        column.result.config.append(f"round {rnd}: harness error: {exc!r}")
    else:
        columns[spec.name] = PeerResult(
            spec.name, spec.title, status=f"n/a: harness error: {exc!r}"
        )


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    opts = _options(args)
    specs = select(args.peers)
    started = time.monotonic()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-peers-logs-"))
    print(f"options: {opts}\nworker/driver logs: {log_dir}")
    with private_redis() as server:
        redis_version = server.version()
        print(f"redis-server {redis_version} on {server.url}")
        results = _rounds(specs, server, opts, log_dir)
    sections = []
    if not args.no_dashboard and any(s.name == "conveyor" for s in specs):
        print("== dashboard cost (bench.dashboard_cost)")
        text = dashboard.measure()
        print(text)
        sections.append(dashboard.section(text))
    elapsed = time.monotonic() - started
    sizes = {"mem_jobs": min(opts.mem_jobs, opts.jobs), "mem_jobs_large": opts.mem_jobs_large}
    goals = targets.evaluate(results, args.cpu_reference_us)
    print_table(results, sizes)
    print_targets(goals)
    if not args.no_write:
        flags = " ".join(sys.argv[1:]) or "(defaults)"
        options_text = f"with `{flags}`: {opts}"
        write_markdown(
            args.output,
            results,
            redis_version,
            platform.python_version(),
            options_text,
            elapsed,
            sizes,
            sections,
            goals,
        )
        print(f"wrote {args.output}")
    print(f"total {elapsed / 60:.1f} min")
