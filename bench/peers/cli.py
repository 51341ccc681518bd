"""Argument parsing and the top-level loop over peers."""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

from . import dashboard
from .driver_handle import DriverHandle
from .redis_server import RedisServer, private_redis
from .report import print_table, write_markdown
from .results import PeerResult
from .scenarios import Options, PeerBench
from .specs import PeerSpec, select
from .venvs import BENCH_DIR, VenvError, ensure_venv


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    p.add_argument("--peers", help="comma list, e.g. rq,celery,conveyor (default: all)")
    p.add_argument("--quick", action="store_true", help="small workloads, 1 run: a smoke test")
    p.add_argument("--jobs", type=int, help="jobs per drain run (default 20000)")
    p.add_argument("--runs", type=int, help="runs per figure, median reported (default 3)")
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


def _bench_one(spec: PeerSpec, server: RedisServer, opts: Options, log_dir: Path) -> PeerResult:
    """Prepare the peer's venv and run every scenario; venv failure = n/a column."""
    try:
        python = ensure_venv(spec, log=print)
    except VenvError as exc:
        return PeerResult(spec.name, spec.title, status=f"n/a: venv: {exc}")
    handle = DriverHandle(spec, python, server.url, log_dir, server.pid)
    return PeerBench(handle, server, opts, log=print).run()


def _load_average() -> str:
    """Recorded per peer: anything else busy on a 2-core box skews its figures."""
    return Path("/proc/loadavg").read_text().split()[0]


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    opts = _options(args)
    specs = select(args.peers)
    started = time.monotonic()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-peers-logs-"))
    print(f"options: {opts}\nworker/driver logs: {log_dir}")
    results: list[PeerResult] = []
    with private_redis() as server:
        redis_version = server.version()
        print(f"redis-server {redis_version} on {server.url}")
        for spec in specs:
            t0 = time.monotonic()
            print(f"== {spec.title}")
            try:
                result = _bench_one(spec, server, opts, log_dir)
            except Exception as exc:  # never let one peer sink the run
                result = PeerResult(spec.name, spec.title, status=f"n/a: harness error: {exc!r}")
            if result.status != "ok":
                print(f"  {result.status}")
            load = _load_average()
            result.config.append(f"1-min load average after its run: {load}")
            print(f"  ({time.monotonic() - t0:.0f}s, load average {load})")
            results.append(result)
            server.flush()
    sections = []
    if not args.no_dashboard and any(s.name == "conveyor" for s in specs):
        print("== dashboard cost (bench.dashboard_cost)")
        text = dashboard.measure()
        print(text)
        sections.append(dashboard.section(text))
    elapsed = time.monotonic() - started
    sizes = {"mem_jobs": min(opts.mem_jobs, opts.jobs), "mem_jobs_large": opts.mem_jobs_large}
    print_table(results, sizes)
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
        )
        print(f"wrote {args.output}")
    print(f"total {elapsed / 60:.1f} min")
