"""``conveyor workflow ID``: a workflow as a tree of its nodes, with their states."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console
from rich.tree import Tree

from ..app import Conveyor
from ..errors import JobNotFound
from ..workflow import WorkflowInfo
from .base import app_options, main
from .inspect import info_dict

console = Console(soft_wrap=True)  # a line per node, however long: greppable
STYLE = {"succeeded": "green", "dead": "red", "cancelled": "yellow", "active": "cyan",
         "ready": "bold", "retrying": "magenta", "scheduled": "dim"}


def _label(info: WorkflowInfo, name: str) -> str:
    job = info.nodes.get(name)
    if job is None:
        return f"{name}  [dim](record expired)[/]"
    state = job.state.value
    text = f"{name}  [{STYLE.get(state, '')}]{state}[/]  [dim]{job.id}[/]"
    if len(info.after[name]) > 1:
        text += f"  [dim](after {', '.join(info.after[name])})[/]"
    if job.error and state in ("dead", "cancelled", "retrying"):
        text += f"  [dim]{job.error.splitlines()[0][:80]}[/]"
    return text


def tree(info: WorkflowInfo) -> Tree:
    """Each node under its first parent; its other parents are named beside it."""
    root = Tree(f"workflow {info.id}  [bold]{info.state}[/]  " + ", ".join(
        f"{state} {n}" for state, n in sorted(info.counts.items())))
    children: dict[str, list[str]] = {name: [] for name in info.after}
    for name, parents in info.after.items():
        if parents:
            children[parents[0]].append(name)
    stack = [(root, name) for name in reversed(list(info.after)) if not info.after[name]]
    while stack:
        branch, name = stack.pop()
        sub = branch.add(_label(info, name))
        stack.extend((sub, child) for child in reversed(children[name]))
    return root


@main.command()
@click.argument("workflow_id")
@click.option("--json", "as_json", is_flag=True, help="Print the workflow as JSON.")
@app_options
def workflow(app: Conveyor, workflow_id: str, as_json: bool) -> None:
    """Show workflow WORKFLOW_ID: its state and its nodes as a tree, with their states."""
    try:
        info = app.workflow_handle(workflow_id).info()
    except (JobNotFound, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        out: dict[str, Any] = {"id": info.id, "state": info.state, "counts": info.counts,
                               "nodes": {n: {**info_dict(j), "after": list(info.after[n])}
                                         for n, j in info.nodes.items()}}
        click.echo(json.dumps(out, default=str, indent=2))
        return
    console.print(tree(info))
