"""Figures and the Markdown report of ``python -m bench.curves`` (from its data.json)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

NOTES_MARK = "<!-- notes: kept when the report is regenerated -->"
DECADE_BUDGET = 0.90  # the bound: at most 10 % lost per decade of backlog
STYLE = {"sync": "-", "async": "--"}
COLOURS = {1: "tab:blue", 2: "tab:orange", 4: "tab:green"}
thousands = FuncFormatter(lambda v, _: f"{v:,.0f}")


def _short(n: float) -> str:
    for size, suffix in ((10**6, "M"), (10**3, "k")):
        if n >= size:
            return f"{n / size:g}{suffix}"
    return f"{n:g}"


def _backlog_axis(ax: Any, x: list[int]) -> None:
    ax.set_xscale("log")
    ax.set_xticks(x, [_short(v) for v in x])
    ax.minorticks_off()


def write(data: dict[str, Any], out: Path) -> None:
    folder = out / "curves"
    folder.mkdir(parents=True, exist_ok=True)
    plot_drain(data["drain"], folder / "drain_scaling.png")
    plot_backlog(data["backlog"], folder / "backlog_throughput.png")
    plot_memory(data["backlog"], folder / "backlog_memory.png")
    plot_fairness(data["fairness"], folder / "fairness.png")
    report = out / "CURVES.md"
    old = report.read_text() if report.exists() else ""
    # Hand-written notes below the mark survive a new run (they say which run they read).
    notes = old[old.index(NOTES_MARK):] if NOTES_MARK in old else ""
    report.write_text(markdown(data) + ("\n" + notes if notes else ""))


# -- figures -------------------------------------------------------------------------------


def plot_drain(rows: list[dict[str, Any]], path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, body in zip(axes, ("sync", "async"), strict=True):
        for procs in sorted({r["procs"] for r in rows}):
            pts = [r for r in rows if r["body"] == body and r["procs"] == procs]
            ax.plot([r["concurrency"] for r in pts], [r["rate"] for r in pts], marker="o",
                    color=COLOURS.get(procs), label=f"{procs} worker process"
                    + ("es" if procs > 1 else ""))
        ax.set_xscale("log", base=2)
        ticks = sorted({r["concurrency"] for r in rows})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_title(f"{body} task body (one INCR per job)")
        ax.set_xlabel("concurrency per worker process")
        ax.grid(True, alpha=0.3)
        ax.yaxis.set_major_formatter(thousands)
    axes[0].set_ylabel("drain throughput (jobs/s)")
    axes[0].set_ylim(bottom=0)
    axes[1].legend(loc="lower right")
    fig.suptitle("Drain throughput by worker processes and concurrency")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_backlog(rows: list[dict[str, Any]], path: Path) -> None:
    x = [r["backlog"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    series = (("enqueue", "enqueue (enqueue_many)", "tab:blue"),
              ("drain", "drain (2 worker processes)", "tab:orange"))
    for ax, (key, label, colour) in zip(axes, series, strict=False):
        ax.plot(x, [r[key] for r in rows], marker="o", color=colour)
        ax.set_ylim(0, max(r[key] for r in rows) * 1.2)
        ax.set_ylabel("jobs/s")
        ax.set_title(f"{label}, a fixed slice of jobs")
    relative = axes[2]
    highest = 100.0
    for key, label, colour in series:
        values = [100 * r[key] / rows[0][key] for r in rows]
        highest = max(highest, *values)
        relative.plot(x, values, marker="o", color=colour, label=label)
    relative.plot(x, [100 * DECADE_BUDGET ** i for i in range(len(x))], color="grey",
                  linestyle=":", label="-10 % per decade (the bound)")
    relative.set_ylim(0, highest * 1.15)
    relative.set_ylabel(f"% of the rate at a backlog of {x[0]:,}")
    relative.set_title("Relative to the smallest backlog")
    relative.legend(loc="lower left")
    for ax in axes:
        _backlog_axis(ax, x)
        ax.set_xlabel("jobs already queued (backlog)")
        ax.grid(True, which="both", alpha=0.3)
        ax.yaxis.set_major_formatter(thousands)
    fig.suptitle("Throughput as the backlog grows")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_memory(rows: list[dict[str, Any]], path: Path) -> None:
    x = [r["backlog"] for r in rows]
    y = [r["bytes_per_job"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(x, y, marker="o", color="tab:purple")
    for xi, yi in zip(x, y, strict=True):
        ax.annotate(f"{yi:,.0f} B", (xi, yi), textcoords="offset points", xytext=(0, 8),
                    ha="center")
    _backlog_axis(ax, x)
    ax.set_ylim(0, max(y) * 1.25)
    ax.set_xlabel("jobs queued")
    ax.set_ylabel("Redis used_memory per queued job (bytes)")
    ax.set_title("Redis memory per queued job")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_fairness(rows: list[dict[str, Any]], path: Path) -> None:
    labels = [f"{r['tenants']:,}" for r in rows]
    rates = [r["rate"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bars = ax.bar(labels, rates, color="tab:cyan", width=0.55)
    for bar, rate in zip(bars, rates, strict=True):
        ax.annotate(f"{rate:,.0f}/s\n{100 * rate / rates[0]:.0f} %",
                    (bar.get_x() + bar.get_width() / 2, rate), textcoords="offset points",
                    xytext=(0, 4), ha="center", va="bottom")
    ax.set_ylim(0, max(rates) * 1.25)
    ax.set_xlabel(f"tenants the same {rows[0]['jobs']:,} jobs are spread over")
    ax.set_ylabel("drain throughput (jobs/s)")
    ax.set_title("Fairness cost: drain throughput by number of tenants")
    ax.yaxis.set_major_formatter(thousands)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- report --------------------------------------------------------------------------------


def decade_ratios(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [b[key] / a[key] for a, b in itertools.pairwise(rows)]


def _drain_section(data: dict[str, Any]) -> list[str]:
    rows = data["drain"]
    concs = sorted({r["concurrency"] for r in rows})
    lines = ["## 1. Drain throughput by processes and concurrency", "",
             "![drain throughput](curves/drain_scaling.png)", "",
             "| body | processes | " + " | ".join(f"c={c}" for c in concs) + " |",
             "|---|---:|" + "---:|" * len(concs)]
    for body in ("sync", "async"):
        for procs in sorted({r["procs"] for r in rows}):
            cells = [f"{r['rate']:,.0f}" for c in concs for r in rows
                     if r["body"] == body and r["procs"] == procs and r["concurrency"] == c]
            lines.append(f"| {body} | {procs} | " + " | ".join(cells) + " |")
    lines += ["", f"Jobs per point: {rows[-1]['jobs']:,} ({rows[0]['jobs']:,} at "
              f"concurrency 1); each point is the median of {data['config']['reps']} runs. "
              "Best of each line:", ""]
    for body in ("sync", "async"):
        for procs in sorted({r["procs"] for r in rows}):
            best = max((r for r in rows if r["body"] == body and r["procs"] == procs),
                       key=lambda r: r["rate"])
            lines.append(f"- {body}, {procs} process(es): **{best['rate']:,.0f} jobs/s** at "
                         f"concurrency {best['concurrency']}")
    return [*lines, ""]


def _backlog_section(data: dict[str, Any]) -> list[str]:
    rows, cfg = data["backlog"], data["config"]
    lines = ["## 2. Throughput and memory as the backlog grows", "",
             "![backlog throughput](curves/backlog_throughput.png)", "",
             "![memory per job](curves/backlog_memory.png)", "",
             f"Each row: B jobs enqueued (timed: *bulk enqueue*), then {cfg['reps']} times a "
             f"slice of {cfg['slice']:,} more jobs enqueued (*slice enqueue*) and "
             f"{cfg['slice']:,} jobs drained by {cfg['drain_procs']} worker processes at "
             f"concurrency {cfg['drain_concurrency']} ({cfg['body']} body), medians; the "
             f"queue holds between B and B + {cfg['slice']:,} jobs while a slice is "
             "measured. Memory: `used_memory` after the B jobs minus before, over B.", "",
             "| backlog B | bytes / queued job | bulk enqueue (jobs/s) | slice enqueue "
             "(jobs/s) | drain (jobs/s) |", "|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['backlog']:,} | {r['bytes_per_job']:,.0f} | "
                     f"{r['bulk_enqueue']:,.0f} | {r['enqueue']:,.0f} | {r['drain']:,.0f} |")
    lines += ["", "Ratio from one decade to the next (the bound: ≥ 0.90):", "",
              "| decade | slice enqueue | drain |", "|---|---:|---:|"]
    for i, (e, d) in enumerate(zip(decade_ratios(rows, "enqueue"),
                                   decade_ratios(rows, "drain"), strict=True)):
        lines.append(f"| {rows[i]['backlog']:,} → {rows[i + 1]['backlog']:,} | "
                     f"{_mark(e)} | {_mark(d)} |")
    first, last = rows[0], rows[-1]
    lines += ["", f"Over the whole range ({first['backlog']:,} → {last['backlog']:,}): slice "
              f"enqueue x{last['enqueue'] / first['enqueue']:.2f}, drain "
              f"x{last['drain'] / first['drain']:.2f}.", ""]
    return lines


def _mark(ratio: float) -> str:
    return f"{ratio:.2f}" + ("" if ratio >= DECADE_BUDGET else " ✗")


def _fairness_section(data: dict[str, Any]) -> list[str]:
    rows, cfg = data["fairness"], data["config"]
    lines = ["## 3. Fairness cost", "", "![fairness](curves/fairness.png)", "",
             f"The same {rows[0]['jobs']:,} jobs spread evenly over N tenants "
             "(`task.options(tenant=...).enqueue_many`, one call per tenant), drained by "
             f"{cfg['drain_procs']} worker processes at concurrency "
             f"{cfg['drain_concurrency']} ({cfg['body']} body); medians of {cfg['reps']}.", "",
             "| tenants | jobs per tenant | drain (jobs/s) | vs 1 tenant | enqueue time (s) |",
             "|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['tenants']:,} | {r['jobs'] // r['tenants']:,} | {r['rate']:,.0f} "
                     f"| {r['rate'] / rows[0]['rate']:.2f} | {r['enqueue_seconds']:.2f} |")
    return [*lines, ""]


def markdown(data: dict[str, Any]) -> str:
    m, cfg = data["machine"], data["config"]
    lines = [
        "# Scaling curves", "",
        "How conveyor's drain throughput scales with worker processes and concurrency, how "
        "throughput and Redis memory behave as the backlog grows, and what tenant fairness "
        "costs. Produced by one run of:", "",
        "```sh", "# from the repository root", f".venv/bin/{cfg['command']}", "```", "",
        "Against a private `redis-server` started on a free port (`--save '' --appendonly "
        "no`), emptied before each point; every job is a no-op whose body does one `INCR` "
        "(sync: a per-process `redis.Redis`; async: a per-process `redis.asyncio.Redis`), "
        "and completion is counted from that counter in Redis. Worker processes are "
        "started, wait at a barrier after importing, and run "
        "`app.worker(queues=[...], concurrency=c).run(burst=True)`; the clock runs from the "
        "barrier until the counter reaches the number of jobs.", "",
        "| machine | |", "|---|---|",
        f"| CPUs (nproc) | {m['nproc']} |", f"| CPU model | {m['cpu']} |",
        f"| Redis | {m['redis']} |", f"| Python | {m['python']} |",
        f"| commit | {m['commit']} (with the working tree of the run) |",
        f"| date | {m['date']} |", "",
        f"**Noise.** The machine is shared with other test runs: the 1-minute load average "
        f"at the end of each section was {data['drain_load']:.1f} (drain), "
        f"{data['backlog_load']:.1f} (backlog) and {data['fairness_load']:.1f} (fairness) "
        f"on {m['nproc']} CPUs. Every point is the median of {cfg['reps']} runs; even so, "
        "repeated runs of one point differ by up to ±40 % under that load, so single steps "
        "in a curve (and a decade ratio of one run) are not significant; trends are.", "",
    ]
    lines += _headline(data) + _drain_section(data) + _backlog_section(data)
    lines += _fairness_section(data)
    return "\n".join(lines)


def _headline(data: dict[str, Any]) -> list[str]:
    drain, backlog, fairness = data["drain"], data["backlog"], data["fairness"]
    peak = max(drain, key=lambda r: r["rate"])

    def best(body: str, procs: int) -> float:
        return float(max(r["rate"] for r in drain if r["body"] == body and r["procs"] == procs))

    def at(body: str, procs: int, conc: int) -> float:
        return float(next(r["rate"] for r in drain if r["body"] == body and r["procs"] == procs
                    and r["concurrency"] == conc))

    procs = sorted({r["procs"] for r in drain})
    concs = sorted({r["concurrency"] for r in drain})
    scaling = "; ".join(
        f"{body}: " + ", ".join(f"{p} → x{best(body, p) / best(body, procs[0]):.2f}"
                                for p in procs[1:])
        for body in ("sync", "async"))
    top, below = concs[-1], concs[-2]
    high_conc = ", ".join(f"{b} {p}p x{at(b, p, top) / at(b, p, below):.2f}"
                          for b in ("sync", "async") for p in procs)
    worst = min(min(decade_ratios(backlog, "enqueue")), min(decade_ratios(backlog, "drain")))
    many = fairness[-1]
    return [
        "## Headline", "",
        f"- Peak drain: **{peak['rate']:,.0f} jobs/s** ({peak['body']} body, "
        f"{peak['procs']} processes x concurrency {peak['concurrency']}).",
        f"- Best drain by processes, relative to {procs[0]} process: {scaling}.",
        f"- Concurrency {top} against {below}: {high_conc}.",
        f"- Backlog {backlog[0]['backlog']:,} → {backlog[-1]['backlog']:,}: memory "
        f"{backlog[0]['bytes_per_job']:,.0f} → {backlog[-1]['bytes_per_job']:,.0f} B per "
        f"queued job; slice enqueue x{backlog[-1]['enqueue'] / backlog[0]['enqueue']:.2f}, "
        f"drain x{backlog[-1]['drain'] / backlog[0]['drain']:.2f}; worst single decade "
        f"x{worst:.2f} (bound ≥ {DECADE_BUDGET:.2f}).",
        f"- Fairness: {many['tenants']:,} tenants drain at "
        f"x{many['rate'] / fairness[0]['rate']:.2f} the rate of 1 tenant.", ""]
