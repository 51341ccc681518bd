"""``python -m bench.sharding``: see the package's docstring."""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import time

import bench.sharding
from bench.sharding import figures, runs
from bench.sharding.runs import Claim, Drain, Idle, Primaries

SHARDS = (1, 3)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.sharding",
                                     description=bench.sharding.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5,
                        help="alternated runs of each measurement (default 5)")
    parser.add_argument("--jobs", type=int, default=20_000,
                        help="nearly free jobs per drain (default 20,000)")
    parser.add_argument("--tenants", type=int, default=1000,
                        help="tenants of the hashed-spread drain (default 1,000)")
    parser.add_argument("--priority-jobs", type=int, default=3000,
                        help="jobs of the priority mix per run (default 3,000)")
    parser.add_argument("--idle", type=float, default=5.0,
                        help="seconds of each idle measurement (default 5)")
    return parser.parse_args()


def machine(primaries: Primaries) -> str:
    version = primaries.clients[next(iter(primaries.clients))].info("server")["redis_version"]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=runs.ROOT).stdout.strip()
    return (f"{os.cpu_count()} cores, Redis {version} (3-primary Cluster, no persistence),"
            f" Python {platform.python_version()}, conveyor at {commit},"
            f" 1-min load {os.getloadavg()[0]:.2f}")


def main() -> None:
    args = arguments()
    began = time.monotonic()
    plain: dict[int, list[Drain]] = {n: [] for n in SHARDS}
    tenants: dict[int, list[Drain]] = {n: [] for n in SHARDS}
    mixes: dict[int, list[list[Claim]]] = {n: [] for n in SHARDS}
    alone: dict[int, list[Drain]] = {n: [] for n in SHARDS}
    handed_back: dict[int, int] = dict.fromkeys(SHARDS, 0)
    problems: list[str] = []
    primaries, server = Primaries(), Primaries(cluster=False)
    try:
        idle, server_idle = primaries.idle_rate(args.idle), server.idle_rate(args.idle)
        for run in range(args.runs):
            for shards in SHARDS:  # alternated, so drift hits both alike
                print(f"run {run + 1} of {args.runs}, {shards} shard(s)", flush=True)
                for drains, count in ((plain, 0), (tenants, args.tenants)):
                    drain = runs.drain(primaries, shards, args.jobs, count, idle)
                    drains[shards].append(drain)
                    problems += drain.problems
                drain = runs.drain(server, shards, args.jobs, 0, server_idle)
                alone[shards].append(drain)
                problems += drain.problems
                mix = runs.priority_mix(primaries, shards, args.priority_jobs, seed=run)
                mixes[shards].append(mix.claims)
                handed_back[shards] += mix.handed_back
                problems += mix.problems
        idle_worker: dict[int, Idle] = {
            n: runs.idle_worker(primaries, n, args.idle, idle) for n in SHARDS}
        idle_after = primaries.idle_rate(args.idle)
        about = machine(primaries)
    finally:
        primaries.close()
        server.close()
    report(args, plain, tenants, alone, mixes, idle_worker, handed_back, problems)
    burn = [1e3 * sum(rate.values()) for rate in (idle, idle_after)]
    print(f"\n{about}; the primaries' idle burn {burn[0]:.2f} ms/s at the start,"
          f" {burn[1]:.2f} at the end (taken off); took {(time.monotonic() - began) / 60:.1f}"
          " min")


def report(args: argparse.Namespace, plain: dict[int, list[Drain]],
           tenants: dict[int, list[Drain]], alone: dict[int, list[Drain]],
           mixes: dict[int, list[list[Claim]]],
           idle_worker: dict[int, Idle], handed_back: dict[int, int], problems: list[str]
           ) -> None:
    ran = sum(d.jobs for drains in (plain, tenants, alone) for n in SHARDS for d in drains[n])
    print(f"\n{args.runs} alternated runs; {args.jobs:,} nearly free jobs per drain;"
          " medians with min-max\n")
    print("\n".join(figures.cost_table(plain, tenants, alone, args.tenants)))
    print()
    print("\n".join(figures.spread_table(plain[3], tenants[3], args.tenants)))
    print()
    print("\n".join(figures.ceiling_table(plain, tenants, args.tenants)))
    print()
    print(f"Priority mix: {args.priority_jobs:,} jobs per run, {figures.BOUNDS_MS} ms bounds;"
          f" leases handed back at once (all runs): 1 shard {handed_back[1]},"
          f" 3 shards {handed_back[3]}")
    print("\n".join(figures.priority_table(mixes)))
    print()
    print("\n".join(figures.idle_table(idle_worker, args.idle)))
    print()
    claims = sum(len(c) for n in SHARDS for c in mixes[n])
    if problems:
        print(f"PROBLEMS ({len(problems)}):")
        print("\n".join(f"- {p}" for p in problems[:20]))
    else:
        print(f"Every job ran once: {ran:,} drained (succeeded = placed on every shard,"
              f" nothing left), {claims:,} of the priority mix (one attempt each).")


if __name__ == "__main__":
    main()
