"""A workflow's calls: ``workflow_enqueue`` stores its nodes, ``workflow_release`` tells
waiting nodes a parent ended, ``workflow_settle`` notes ended nodes in the home queue."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ...bounds import Limits
from ...keys import QueueKeys
from .. import ScriptCall
from ..signatures import (
    Arg,
    WorkflowEnqueueArgv,
    WorkflowEnqueueItem,
    WorkflowReleaseArgv,
    WorkflowReleaseItem,
    WorkflowSettleArgv,
    WorkflowSettleItem,
)
from .build import _call, _now, _opt
from .enqueue import JobSpec


class NodeSpec(NamedTuple):
    """One workflow node as ``workflow_enqueue`` stores it."""

    short_id: str
    spec: JobSpec
    args: bytes
    name: str
    waits_for: int  # parents that must end before it runs
    run_if: str  # 'succeeded' | 'finished'
    parents: bytes  # encoded [[name, job id], ...] (read by Python only)
    children: bytes  # encoded [job id, ...] (read by Python only)


@dataclass(frozen=True, slots=True)
class WorkflowHome:
    """The part of a workflow's record stored in its home queue."""

    short_id: str
    nodes: bytes  # encoded node list
    total: int


def workflow_enqueue(
    k: QueueKeys, workflow: str, nodes: Sequence[NodeSpec], limits: Limits,
    home: WorkflowHome | None = None, total: int = 0, now: float | None = None,
) -> ScriptCall[int]:
    """Store the nodes of ``workflow`` that live in ``k``'s queue (and its record, when
    ``home`` is given); the reply is how many nodes were stored."""
    fixed = WorkflowEnqueueArgv(
        now=_now(now), bucket_seconds=limits.bucket_seconds, bucket_ttl=limits.bucket_ttl,
        retention=limits.retention, workflow=workflow,
        home="" if home is None else home.short_id, nodes=b"" if home is None else home.nodes,
        total=total if home is None else home.total, node_count=len(nodes))
    rest: list[Arg] = []
    for node in nodes:
        s = node.spec
        rest.extend(WorkflowEnqueueItem(
            short_id=node.short_id, task=s.task, priority=s.priority, tenant=s.tenant,
            delay_ms=_opt(s.delay_ms), at_ms=_opt(s.at_ms), max_attempts=s.max_attempts,
            visibility_ms=s.visibility_ms, args=node.args, name=node.name,
            waits_for=node.waits_for, run_if=node.run_if, parents=node.parents,
            children=node.children, expires=s.expires, deadline=s.deadline))
    return _call("workflow_enqueue", k, fixed, rest, int)


def workflow_release(
    k: QueueKeys, handovers: Sequence[tuple[str, str, str]], limits: Limits,
    now: float | None = None,
) -> ScriptCall[tuple[int, int]]:
    """Tell waiting nodes of ``k``'s queue, given as (child short id, parent job id,
    outcome: '' succeeded, else the reason), that a parent ended; the reply is how many
    were released and how many cancelled."""
    rest: list[Arg] = []
    for child, parent, outcome in handovers:
        rest.extend(WorkflowReleaseItem(child, parent, outcome))
    return _call("workflow_release", k, WorkflowReleaseArgv(_now(now), limits.retention,
                                                            len(handovers)),
                 rest, lambda r: (int(r[0]), int(r[1])))


def workflow_settle(
    k: QueueKeys, workflow_short_id: str, ended: Sequence[str], limits: Limits
) -> ScriptCall[int]:
    """Note in the home queue that nodes (job ids) of a workflow ended; the reply is how
    many have ended in all."""
    fixed = WorkflowSettleArgv(limits.retention, workflow_short_id, len(ended))
    rest = [field for node in ended for field in WorkflowSettleItem(node)]
    return _call("workflow_settle", k, fixed, rest, int)
