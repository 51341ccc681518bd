"""The tables a chaos run prints: faults injected by kind, each promise held or failed,
and the run's figures; and the fault log kept beside the workers' output."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .faults import FAULT_KINDS, Fault
from .invariants import Check, Summary

__all__ = ["print_report", "write_failures", "write_fault_log"]


def faults_table(faults: list[Fault], skipped: dict[str, str]) -> Table:
    table = Table(title="faults injected")
    table.add_column("fault")
    table.add_column("count", justify="right")
    table.add_column("what", ratio=1)
    by_kind: dict[str, list[Fault]] = defaultdict(list)
    for f in faults:
        by_kind[f.kind].append(f)
    for kind, what in FAULT_KINDS.items():
        if kind in skipped:
            table.add_row(kind, "-", f"[dim]not injected: {skipped[kind]}[/dim]")
        elif by_kind.get(kind):
            table.add_row(kind, str(len(by_kind[kind])), what)
    table.add_row("[bold]total[/bold]", f"[bold]{len(faults)}[/bold]", "")
    return table


def checks_table(checks: list[Check]) -> Table:
    table = Table(title="invariants")
    table.add_column("invariant")
    table.add_column("result")
    table.add_column("detail", ratio=1, overflow="fold")
    for c in checks:
        mark = "[green]held[/green]" if c.held else "[bold red]FAILED[/bold red]"
        table.add_row(c.name, mark, c.detail)
    return table


def summary_table(s: Summary, seed: int, seconds: float, extra: dict[str, str]) -> Table:
    table = Table(title="run", show_header=False)
    table.add_column(justify="right")
    table.add_column()
    states = ", ".join(f"{k} {v}" for k, v in sorted(s.states.items()))
    rows = [
        ("seed", str(seed)),
        ("jobs", f"{s.jobs} ({s.poison} poison): {states}"),
        ("runs", str(s.runs)),
        ("re-executions", f"{s.reexecutions} (work jobs' runs beyond one each)"),
        ("attempts charged without a run", str(s.charged_without_run)),
        ("lost leases", f"{s.lost_leases} (bound by the faults' reach: {s.bound})"),
        ("lost", str(s.lost_jobs)),
        *extra.items(),
        ("took", f"{seconds:.0f} s"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def print_report(console: Console, faults: list[Fault], skipped: dict[str, str],
                 checks: list[Check], summary: Summary, seed: int, seconds: float,
                 extra: dict[str, str]) -> None:
    console.print(faults_table(faults, skipped))
    console.print(checks_table(checks))
    console.print(summary_table(summary, seed, seconds, extra))


def write_fault_log(path: Path, seed: int, faults: list[Fault]) -> None:
    lines = [f"seed {seed}"] + [f"{f.at:8.2f} s  {f.kind:<16} {f.detail}  (reach {f.reach})"
                                for f in faults]
    path.write_text("\n".join(lines) + "\n")


def write_failures(path: Path, checks: list[Check]) -> None:
    """Each failed check with every offending job, one a line (the report names a few)."""
    lines = []
    for c in checks:
        if not c.held:
            lines += [f"FAILED {c.name}", *(f"  {item}" for item in c.offending or (c.detail,))]
    path.write_text("\n".join(lines) + "\n")
