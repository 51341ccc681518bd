"""Workflows: jobs that run after others — chains, fan-out, fan-in, batches with a
completion job — enqueued in one call, each node started exactly once.

>>> wf = app.workflow()
>>> fetch = wf.add(fetch_users, "weekly", name="fetch")
>>> sends = [wf.add(send_batch, i, after=[fetch]) for i in range(100)]
>>> report = wf.add(summarize, after=sends)        # once, after every send succeeded
>>> handle = wf.enqueue()
>>> handle.result(timeout=60)["fetch"]

See :mod:`conveyor.workflow.release` for how a node's end reaches its children exactly
once across queues and Cluster slots, and why a killed worker cannot lose or repeat it.
"""

from .builder import Node, Workflow, batch, chain
from .handle import WorkflowHandle, WorkflowInfo, aparent_results, parent_results

__all__ = ["Node", "Workflow", "WorkflowHandle", "WorkflowInfo", "aparent_results", "batch",
           "chain", "parent_results"]
