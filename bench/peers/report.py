"""The comparison table (terminal and ``bench/RESULTS.md``).

Rows are metrics, columns are the ceiling, the peers, conveyor, then
"conveyor / best peer": conveyor's figure divided by the best *peer*'s (the
ceiling is not a peer), and "conveyor / ceiling": conveyor's figure divided by
the plain redis-py pattern's, where the ceiling has that metric.  For rows
where lower is better a ratio below 1 is good; the row label says which way
is better.
"""

from __future__ import annotations

import platform
import subprocess
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

from .results import METRICS, Metric, PeerResult, Value

RATIO_HEADER = "conveyor / best peer"
CEILING_RATIO_HEADER = "conveyor / ceiling"


def fmt(value: Value, integer: bool = False) -> str:
    if value.number is None:
        return f"n/a ({value.reason})" if value.reason else "n/a"
    n = value.number
    text = f"{n:,.0f}" if integer or abs(n) >= 100 else f"{n:,.2f}" if abs(n) >= 1 else f"{n:.3f}"
    return text + ("*" if value.partial else "")


def _best_peer(metric: Metric, peers: Sequence[PeerResult]) -> tuple[float, str] | None:
    scored = [
        (v.number, p.title)
        for p in peers
        if (v := p.value(metric.key)).number is not None and not v.partial
    ]
    if not scored:
        return None
    if metric.higher_is_better:
        best = max(n for n, _ in scored)
    else:  # closest to zero: a negative lateness (started early) is no better than late
        best = min((n for n, _ in scored), key=abs)
    tied = [title for n, title in scored if n == best]
    return best, ", ".join(tied) if len(tied) <= 2 else f"{len(tied)} peers"


def ratio(metric: Metric, results: Sequence[PeerResult]) -> str:
    conveyor = next((r for r in results if r.name == "conveyor"), None)
    peers = [r for r in results if r.name not in ("conveyor", "ceiling")]
    best = _best_peer(metric, peers)
    if conveyor is None or best is None:
        return "n/a"
    return _ratio_text(conveyor.value(metric.key).number, best[0], f" ({best[1]})")


def ceiling_ratio(metric: Metric, results: Sequence[PeerResult]) -> str:
    """conveyor against the plain redis-py pattern, where both have the figure."""
    conveyor = next((r for r in results if r.name == "conveyor"), None)
    ceiling = next((r for r in results if r.name == "ceiling"), None)
    if conveyor is None or ceiling is None or ceiling.status != "ok":
        return "n/a"
    ref = ceiling.value(metric.key)
    if ref.number is None or ref.partial:
        return "n/a"
    return _ratio_text(conveyor.value(metric.key).number, ref.number, "")


def _ratio_text(mine: float | None, ref: float, who: str) -> str:
    if mine is None:
        return "n/a"
    if ref == 0:  # a ratio to zero means nothing; say how far off instead
        return f"={who}" if mine == 0 else f"+{mine:.3g} vs 0{who}"
    return f"{mine / ref:.2f}x{who}"


def _cell(result: PeerResult, metric: Metric, short: bool) -> str:
    if result.status != "ok":
        return "n/a"
    text = fmt(result.value(metric.key), metric.integer)
    return "n/a" if short and text.startswith("n/a") else text


class _Sizes(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "N"


def metric_label(metric: Metric, sizes: Mapping[str, int]) -> str:
    """The row label with workload sizes filled in (``{mem_jobs}`` -> ``10,000``)."""
    return metric.label.format_map(_Sizes({k: f"{v:,}" for k, v in sizes.items()}))


def table_rows(
    results: Sequence[PeerResult], short: bool = True, sizes: Mapping[str, int] | None = None
) -> list[list[str]]:
    """Header row then one row per metric; *short* drops n/a reasons."""
    header = ["metric", *(r.title for r in results), RATIO_HEADER, CEILING_RATIO_HEADER]
    rows = [header]
    for m in METRICS:
        arrow = "higher" if m.higher_is_better else "lower"
        label = f"{metric_label(m, sizes or {})} ({m.unit}, {arrow} is better)"
        cells = [_cell(r, m, short) for r in results]
        rows.append([label, *cells, ratio(m, results), ceiling_ratio(m, results)])
    return rows


def print_table(results: Sequence[PeerResult], sizes: Mapping[str, int] | None = None) -> None:
    rows = table_rows(results, sizes=sizes)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            print(
                "  ".join(
                    c.rjust(w) if i else c.ljust(w)
                    for i, (c, w) in enumerate(zip(row, widths, strict=True))
                )
            )
        return
    table = Table(title="conveyor vs peers")
    for i, h in enumerate(rows[0]):
        table.add_column(h, justify="left" if i == 0 else "right")
    for row in rows[1:]:
        table.add_row(*row)
    Console(width=max(160, sum(len(h) for h in rows[0]) * 2)).print(table)


def _markdown_table(rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    out += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows[1:]]
    return "\n".join(out)


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _git_head() -> str:
    """The commit checked out (``-dirty`` when the working tree differs from it)."""
    out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"],
                         capture_output=True, text=True, check=False,
                         cwd=Path(__file__).parent)  # fmt: skip
    return out.stdout.strip() or "unknown"


STARTED_AT = _git_head()
"""The commit measured: read when the harness starts (it imports this module first), not
when the report is written, since commits made during a half-hour run change nothing that
was measured."""


def _nproc() -> str:
    return subprocess.run(["nproc"], capture_output=True, text=True, check=False).stdout.strip()


def write_markdown(
    path: Path,
    results: Sequence[PeerResult],
    redis_version: str,
    python_version: str,
    options_text: str,
    elapsed_s: float,
    sizes: Mapping[str, int] | None = None,
    sections: Sequence[str] = (),
) -> None:
    """Write RESULTS.md: machine, versions and configs, the table, *sections*, and notes."""
    lines = [
        "# conveyor vs peers",
        "",
        "Generated by `python -m bench.peers` " + options_text + ".",
        "",
        "## Machine",
        "",
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC (run took {elapsed_s / 60:.1f} min)",
        f"- nproc: {_nproc()}; CPU: {_cpu_model()}",
        f"- Redis {redis_version} (private server, `--save '' --appendonly no`, loopback)",
        f"- Python {python_version}; conveyor from the working tree at commit {STARTED_AT}",
        "",
        "## Results",
        "",
        _markdown_table(table_rows(results, sizes=sizes)),
        "",
        "`*` = drain hit its time cap; the figure is the rate reached until then.",
        "",
        *sections,
        "## Peers and configurations",
        "",
    ]
    for r in results:
        status = "" if r.status == "ok" else f" -- **{r.status}**"
        lines.append(f"- **{r.title}** {r.version}{status}")
        lines += [f"  - {c}" for c in r.config]
    missing = [
        f"- {r.title}: {metric_label(m, sizes or {})}: {r.value(m.key).reason}"
        for r in results
        if r.status == "ok"
        for m in METRICS
        if r.value(m.key).number is None and r.value(m.key).reason != "no such API"
    ]
    lines += ["", "## Why figures are missing", "", *(missing or ["- none"])]
    lines += ["", METHOD_NOTES]
    text = "\n".join(lines) + "\n"
    # Sections other benchmarks keep in the same file (below the mark) survive.
    old = path.read_text() if path.exists() else ""
    if KEPT_MARK in old:
        text += "\n" + KEPT_MARK + old.partition(KEPT_MARK)[2]
    path.write_text(text)


KEPT_MARK = "<!-- kept: the sections below survive a regeneration by bench.peers -->"


METHOD_NOTES = """## Method

- Every peer runs in its own virtualenv (`bench/.venvs/`), with `hiredis` installed;
  conveyor runs in the repository's venv. One private `redis-server` serves all of them,
  flushed between steps.
- The task body is one Redis `INCR` on a counter; completion is read from that counter
  by the harness, never from the peer. Async-first peers use an async redis-py client
  in the task; sync peers (and conveyor's sync task) a per-process `redis.Redis`.
- The nearly free body (`BENCH_BODY=free` in the workers' environment, same task, same
  queued jobs) only adds one to a process-local counter; a daemon thread per worker
  process adds what accumulated to the Redis counter every 5 ms (one `INCRBY`), so
  completions are still counted by the harness and arrive at most ~5 ms late. It is run
  with the "best for 2 cores" configuration only (the "1 process" one would add about
  as much time again to the run).
- Enqueue: N jobs one call at a time (and in bulk calls of 100 where the peer has a
  bulk API), timed inside the driver after one warm-up call; median of the runs.
- Drain: N jobs are enqueued through the peer's API once, the keyspace is snapshotted
  (`DUMP`) and restored (`RESTORE`) before each run; the rate is counted from the first
  completed job to the last, so worker start-up is excluded. Median of the runs; a
  configuration is repeated up to `--runs` times or until 30 s were spent on it, and a
  run is cut at the drain cap (`*`, excluded from "best peer").
- Latency: an idle worker, ~20 ms between probes; each probe carries `time.time()` at
  enqueue and the task records `time.time()` at start (same machine). p50/p99 per run,
  median over runs. "Start after enqueue returns" takes the same probes from when the
  enqueue call returned (the driver times each call and records it after the probes), so
  it leaves out the enqueue call itself.
- Delayed jobs: a fresh idle worker (default profile; RQ's with `--with-scheduler`),
  then 100 delayed probes 50 ms apart per run, delays 0.2-1.0 s in whole ms spread
  evenly (golden-ratio steps, so they do not fall due together). Each probe's argument
  is its due time, computed by the enqueuer as `time.time()` + delay just before the
  call; the task records `time.time()` - due at start. Lateness p50/p99 per run, median
  over runs; "started before due" counts negative samples over all runs. SAQ's
  `scheduled=` takes whole epoch seconds, so its due times are rounded up to the next
  second (and the task carries that rounded time). A probe not started 10 s after the
  last was due fails the step.
- Idle: after the latency probes and a 2 s pause, `INFO stats` `total_commands_processed`
  deltas (minus the harness's own INFO calls; Lua scripts count every inner
  `redis.call`) and the CPU time of the worker's whole process tree from `/proc`.
- Memory: `used_memory` delta after enqueueing N queued jobs (through the peer's fastest
  API, in calls of 1,000 where it has bulk), divided by N. Twice: at the drain test's
  fill (10,000 jobs), and at `--mem-jobs` (default 1,000,000) on an emptied server:
  conveyor always, a peer only if its fastest measured enqueue rate predicts the fill
  within `--mem-budget` (30 s), which keeps the run short (Celery at ~2,000 jobs/s
  would take over 8 minutes).
- Redis CPU per job: the private server's own CPU time (user + system over all its
  threads, from `/proc/<pid>/task/*/schedstat`, nanoseconds) across a phase, divided by
  its jobs. Enqueue: around each timed run of N single enqueues (sync API where the peer
  has one, else async), read by the driver just outside its timing; median of the runs.
  Drain: over the same runs and the same stretch as the drain rate (first completion to
  last, so worker start-up is left out), minus the harness's own counter polls (each
  costed by timing 1,000 `GET`s at the start of the peer's run); median of the runs;
  the "best for 2 cores" configuration. The standard body's `INCR` is part of the
  drain figure (the same for every peer); the nearly free row shows the queue alone
  (plus one `INCRBY` per process every 5 ms). "single enqueue plus drain" is the sum of
  the first two. With no other client, the server's idle timer adds well under 1 µs per
  job.
"""
