"""Planning a workflow's store: the script calls that store its nodes (no I/O).

:mod:`conveyor.producer` runs the enqueue hooks around the planning and sends the calls,
as for every other producer; a failure after some queues were stored cancels what was
(:func:`partly_stored`).

A workflow's id is ``"<home queue>~<short id>"``, the home queue being the first node's:
its record (the node list) lives in that queue's slot. Nodes are stored by
``workflow_enqueue`` calls, one per queue unless a queue has more nodes than one call may
carry (:func:`conveyor.scripts.max_items`: a command's argument limit), the home queue's
first (its record with its first call), all in one pipeline (one round trip) on a single
Redis, one call at a time on a Cluster. A node's parent stored by an earlier call (of
another queue, or of its own) may end before the node is stored; its hand-over is kept,
and the node is settled as it is stored (see ``workflow_enqueue.lua``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from .. import keys as keyspace
from ..errors import ConfigurationError, PartialEnqueue
from ..job import Job
from ..producer import job_spec, seal_args
from ..scripts import ScriptCall, calls, max_items
from .builder import Workflow
from .handle import run_all

if TYPE_CHECKING:
    from ..app import Conveyor
    from ..task import Task

log = logging.getLogger("conveyor.workflow")
_json = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class Plan:
    """What to send: one call per queue, the home queue's first."""

    id: str
    calls: list[tuple[str, ScriptCall[int], list[str]]]  # queue, call, node short ids


def plan(app: Conveyor, wf: Workflow,
         meta_of: Callable[[Task[Any, Any]], dict[str, str] | None] | None = None) -> Plan:
    """The script calls that store ``wf``.

    :param meta_of: the meta the enqueue hooks gave for a task's nodes
    :raises ConfigurationError: no nodes, a cycle, an unknown dependency
    :raises SerializationError: arguments that cannot be encoded
    """
    if wf.enqueued:
        raise ConfigurationError("this workflow was enqueued already: build a new one")
    order = wf.ordered()
    if not order:
        raise ConfigurationError("a workflow needs at least one node")
    home = wf.nodes[0].task.queue
    wf_id = wf.id
    wf_short = keyspace.split_job_id(wf_id)[1]
    ids = {n.name: n.id for n in wf.nodes}
    parents = {n.name: [p if isinstance(p, str) else p.name for p in n.after] for n in order}
    children: dict[str, list[str]] = {n.name: [] for n in order}
    for child, names in parents.items():
        for parent in names:
            children[parent].append(ids[child])
    by_queue: dict[str, list[calls.NodeSpec]] = {home: []}
    for node in order:
        task = node.task
        meta = meta_of(task) if meta_of is not None else None
        args = seal_args(task, ids[node.name],
                         app.codec.encode_args(task.name, node.args, node.kwargs, meta))
        ps = parents[node.name]
        by_queue.setdefault(task.queue, []).append(calls.NodeSpec(
            short_id=keyspace.split_job_id(ids[node.name])[1], spec=job_spec(task), args=args,
            name=node.name, waits_for=len(ps), run_if=node.run_if,
            parents=_json.encode([[p, ids[p]] for p in ps]) if ps else b"",
            children=_json.encode(children[node.name]) if children[node.name] else b"",
        ))
    listing = _json.encode([[n.name, ids[n.name], parents[n.name], n.run_if] for n in wf.nodes])
    total = len(wf.nodes)
    home_record = calls.WorkflowHome(wf_short, listing, total)
    planned = []
    step = max_items("workflow_enqueue")
    for queue, nodes in by_queue.items():
        for i in range(0, len(nodes), step):
            part = nodes[i:i + step]
            call = calls.workflow_enqueue(
                app.keys(queue), wf_id, part, app.limits,
                home=home_record if queue == home and i == 0 else None, total=total)
            planned.append((queue, call, [n.short_id for n in part]))
    wf.enqueued = True
    return Plan(wf_id, planned)


def partly_stored(app: Conveyor, p: Plan, stored: Sequence[int], error: BaseException,
                  unsure: Sequence[int] = ()) -> BaseException:
    """Nothing stored (and nothing in doubt): the error itself. Else cancel what was
    stored, and what may have been (``unsure``: sent, never answered; a cancel of a node
    that is not there changes nothing), as far as Redis lets us, and say what was stored
    and what is still in doubt. ``stored`` and ``unsure`` are places in ``p.calls``."""
    if not stored and not unsure:
        return error
    jobs = [Job._of(app, p.calls[i][0], short) for i in stored for short in p.calls[i][2]]
    doubtful = [Job._of(app, p.calls[i][0], short) for i in unsure for short in p.calls[i][2]]
    try:
        for i in (*stored, *unsure):  # by the ids planned
            queue, _, shorts = p.calls[i]
            k = app.keys(queue)
            run_all(app, [calls.cancel(k, short, app.limits) for short in shorts])
        what = "the stored nodes were cancelled"
        doubtful_left: list[Job[Any]] = []
    except Exception as exc:  # Redis is failing: say so, the caller decides
        log.warning("could not cancel the partly stored workflow %s: %s", p.id, exc)
        what = f"cancelling it failed too ({type(exc).__name__}: {exc})"
        doubtful_left = doubtful
    partial = PartialEnqueue(
        f"workflow {p.id}: the nodes of queue(s) {_names(p, stored)} were stored"
        f" and those of {_names(p, unsure)} may have been before Redis failed"
        f" ({type(error).__name__}: {error}); {what}; .jobs lists the stored nodes,"
        " .unconfirmed those that may be stored", jobs, doubtful_left)
    partial.__cause__ = error
    return partial


def _names(p: Plan, places: Sequence[int]) -> str:
    """The queues of the calls at ``places``, once each ('none' for none); a queue whose
    nodes took several calls is named with the share of them meant."""
    counts: dict[str, int] = {}
    for i in places:
        counts[p.calls[i][0]] = counts.get(p.calls[i][0], 0) + 1
    total = {queue: sum(q == queue for q, _, _ in p.calls) for queue in counts}
    return ", ".join(queue if n == total[queue] else f"{queue} ({n} of {total[queue]} calls)"
                     for queue, n in counts.items()) or "none"
