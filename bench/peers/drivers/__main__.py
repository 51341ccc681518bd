"""Command-line entry of a driver, executed in the peer's venv by the harness.

Usage: ``python -m bench.peers.drivers PEER COMMAND [options]``.

Results go to stdout as one line ``BENCH-RESULT <json>`` so that whatever a
peer logs on stdout cannot be mistaken for a result.  Failures exit non-zero
with the traceback on stderr; the harness reports its last line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

RESULT_PREFIX = "BENCH-RESULT "


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.peers.drivers")
    p.add_argument("peer")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("describe")
    enq = sub.add_parser("enqueue", help="time N single/bulk enqueues per mode")
    enq.add_argument("--modes", required=True, help="comma list of sync,bulk,async,abulk")
    enq.add_argument("--n", type=int, required=True)
    enq.add_argument("--runs", type=int, default=3)
    fill = sub.add_parser("fill", help="enqueue N jobs as fast as possible")
    fill.add_argument("--n", type=int, required=True)
    lat = sub.add_parser("latency", help="enqueue N timestamped probes")
    lat.add_argument("--n", type=int, required=True)
    lat.add_argument("--interval", type=float, default=0.02)
    dly = sub.add_parser("delayed", help="enqueue N delayed probes carrying their due time")
    dly.add_argument("--n", type=int, required=True)
    dly.add_argument("--interval", type=float, default=0.05)
    dly.add_argument("--min-delay", type=float, default=0.2)
    dly.add_argument("--max-delay", type=float, default=1.0)
    wrk = sub.add_parser("worker", help="run a worker in the foreground")
    wrk.add_argument("--profile", default="default")
    wrk.add_argument("--burst", action="store_true")
    return p


def _emit(payload: dict[str, Any]) -> None:
    sys.stdout.write(RESULT_PREFIX + json.dumps(payload) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    driver = importlib.import_module(f"bench.peers.drivers.{args.peer}").DRIVER
    if args.command == "describe":
        _emit(driver.describe())
    elif args.command == "enqueue":
        modes = [m for m in args.modes.split(",") if m]
        _emit({m: driver.time_enqueue(m, args.n, args.runs) for m in modes})
    elif args.command == "fill":
        _emit({"mode": driver.fill(args.n)})
    elif args.command == "latency":
        driver.latency(args.n, args.interval)
        _emit({"sent": args.n})
    elif args.command == "delayed":
        last_due = driver.send_delayed(args.n, args.interval, args.min_delay, args.max_delay)
        _emit({"sent": args.n, "last_due": last_due})
    elif args.command == "worker":
        driver.run_worker(args.profile, args.burst)


if __name__ == "__main__":
    main()
