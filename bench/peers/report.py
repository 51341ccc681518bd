"""The comparison table (terminal and ``bench/RESULTS.md``).

Rows are metrics, columns are the ceiling, the peers, conveyor, then
"conveyor / best peer": conveyor's figure divided by the best *peer*'s (the
ceiling is not a peer), and "conveyor / ceiling": conveyor's figure divided by
the plain redis-py pattern's, where the ceiling has that metric.  For rows
where lower is better a ratio below 1 is good; the row label says which way
is better.  A cell is the median over the rounds with their min-max beside it
(under it in the terminal); the ratios are of medians.  The Targets table
(targets.py) follows the main one.
"""

from __future__ import annotations

import platform
import subprocess
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

from . import targets
from .results import METRICS, Metric, PeerResult, Value, best_peer, column

RATIO_HEADER = "conveyor / best peer"
CEILING_RATIO_HEADER = "conveyor / ceiling"
DASH = "\u2013"
"""Between min and max: an en dash, since a hyphen would read as a minus before a
negative figure (a lateness)."""


def _number(n: float, integer: bool) -> str:
    return f"{n:,.0f}" if integer or abs(n) >= 100 else f"{n:,.2f}" if abs(n) >= 1 else f"{n:.3f}"


def fmt(value: Value, integer: bool = False, sep: str = " ") -> str:
    """The median, ``*`` if a round hit the drain cap, then ``(min-max)`` after *sep*."""
    n = value.number
    if n is None:
        return f"n/a ({value.reason})" if value.reason else "n/a"
    text = _number(n, integer) + ("*" if value.partial else "")
    if value.spread:
        low, high = value.spread
        text += f"{sep}({_number(low, integer)}{DASH}{_number(high, integer)})"
    return text


def ratio(metric: Metric, results: Sequence[PeerResult]) -> str:
    conveyor = next((r for r in results if r.name == "conveyor"), None)
    best = best_peer(metric, results)
    if conveyor is None or best is None:
        return "n/a"
    return _ratio_text(conveyor.value(metric.key).number, best[0], f" ({best[1]})")


def ceiling_ratio(metric: Metric, results: Sequence[PeerResult]) -> str:
    """conveyor against the plain redis-py pattern, where both have the figure."""
    conveyor = next((r for r in results if r.name == "conveyor"), None)
    ceiling = column(results, "ceiling")
    if conveyor is None or ceiling is None:
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


def _cell(result: PeerResult, metric: Metric, short: bool, sep: str) -> str:
    if result.status != "ok":
        return "n/a"
    text = fmt(result.value(metric.key), metric.integer, sep)
    return "n/a" if short and text.startswith("n/a") else text


class _Sizes(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "N"


def metric_label(metric: Metric, sizes: Mapping[str, int]) -> str:
    """The row label with workload sizes filled in (``{mem_jobs}`` -> ``10,000``)."""
    return metric.label.format_map(_Sizes({k: f"{v:,}" for k, v in sizes.items()}))


def table_rows(
    results: Sequence[PeerResult],
    short: bool = True,
    sizes: Mapping[str, int] | None = None,
    sep: str = " ",
) -> list[list[str]]:
    """Header row then one row per metric; *short* drops n/a reasons; *sep* goes between
    a median and its min-max (a newline stacks them)."""
    header = ["metric", *(r.title for r in results), RATIO_HEADER, CEILING_RATIO_HEADER]
    rows = [header]
    for m in METRICS:
        arrow = "higher" if m.higher_is_better else "lower"
        label = f"{metric_label(m, sizes or {})} ({m.unit}, {arrow} is better)"
        cells = [_cell(r, m, short, sep) for r in results]
        rows.append([label, *cells, ratio(m, results), ceiling_ratio(m, results)])
    return rows


def print_table(results: Sequence[PeerResult], sizes: Mapping[str, int] | None = None) -> None:
    _print_rows("conveyor vs peers", table_rows(results, sizes=sizes, sep="\n"))


def print_targets(outcomes: Sequence[targets.Outcome]) -> None:
    _print_rows("Targets (medians of this run)", targets.rows(outcomes))


def _print_rows(title: str, rows: list[list[str]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        rows = [[c.replace("\n", " ") for c in row] for row in rows]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        print(title)
        for row in rows:
            print(
                "  ".join(
                    c.rjust(w) if i else c.ljust(w)
                    for i, (c, w) in enumerate(zip(row, widths, strict=True))
                )
            )
        return
    table = Table(title=title)
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
    goals: Sequence[targets.Outcome] = (),
) -> None:
    """Write RESULTS.md: machine, versions and configs, the table, the targets, *sections*,
    and notes."""
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
        f"Each cell: the median over the rounds, then (min{DASH}max). `*` = a drain hit its time "
        "cap; the figure is the rate reached until then.",
        "",
        *_targets_section(goals),
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


def _targets_section(goals: Sequence[targets.Outcome]) -> list[str]:
    if not goals:
        return []
    return ["## Targets", "", _markdown_table(targets.rows(goals)), ""]


KEPT_MARK = "<!-- kept: the sections below survive a regeneration by bench.peers -->"


METHOD_NOTES = """## Method

- Rounds: `--runs` rounds, each running every peer once, in table order, so that a slow
  spell of the shared machine falls on every peer alike. Every step below runs once per
  round; each cell is the median over the rounds, then (min-max) over them; the ratio
  columns and the targets divide medians. Memory is measured in the first round only.
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
  bulk API), timed inside the driver after one warm-up call; one run per round.
- Drain: N jobs are enqueued through the peer's API once, the keyspace is snapshotted
  (`DUMP`) and restored (`RESTORE`) before each run; the rate is counted from the first
  completed job to the last, so worker start-up is excluded. One run per configuration
  per round; a run is cut at the drain cap (`*`, excluded from "best peer"), and a
  configuration cut once is not run in later rounds.
- Worker CPU per job: the CPU time (user + system) of the worker processes' whole trees
  (each started in a session of its own) over the same stretch as the drain rate, first
  completion to last, divided by the jobs drained in it. Every process in those
  sessions, zombies included, counts `utime + stime + cutime + cstime` from
  `/proc/PID/stat`, and workers that ended and were reaped by the harness count through
  its `RUSAGE_CHILDREN`, so a fork per job and burst workers that exit are counted.
  Clock ticks: 10 ms per process per reading.
- Latency: an idle worker, ~20 ms between probes; each probe carries `time.time()` at
  enqueue and the task records `time.time()` at start (same machine). p50/p99 of a
  round's probes. "Start after enqueue returns" takes the same probes from when the
  enqueue call returned (the driver times each call and records it after the probes), so
  it leaves out the enqueue call itself.
- Delayed jobs: a fresh idle worker (default profile; RQ's with `--with-scheduler`),
  then 100 delayed probes 50 ms apart per round, delays 0.2-1.0 s in whole ms spread
  evenly (golden-ratio steps, so they do not fall due together). Each probe's argument
  is its due time, computed by the enqueuer as `time.time()` + delay just before the
  call; the task records `time.time()` - due at start. Lateness p50/p99 of a round's
  probes; "started before due" counts a round's negative samples. SAQ's
  `scheduled=` takes whole epoch seconds, so its due times are rounded up to the next
  second (and the task carries that rounded time). A probe not started 10 s after the
  last was due fails the step.
- Idle: after the latency probes and a 2 s pause, over one window per round (10 s
  shared among the rounds), `INFO stats` `total_commands_processed`
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
  has one, else async), read by the driver just outside its timing.
  Drain: over the same stretch as the drain rate (first completion to
  last, so worker start-up is left out), minus the harness's own counter polls (each
  costed by timing 1,000 `GET`s when the peer is first run); the "best for 2 cores"
  configuration. The standard body's `INCR` is part of the
  drain figure (the same for every peer); the nearly free row shows the queue alone
  (plus one `INCRBY` per process every 5 ms). "single enqueue plus drain" is the sum of
  the first two, taken from the same round. With no other client, the server's idle
  timer adds well under 1 µs per job.
- Targets: conveyor's medians against factors of the ceiling's, of the best peer's (only
  peers in this run, named in the table; the lowest for CPU rows) or of
  `--cpu-reference-us`.
"""
