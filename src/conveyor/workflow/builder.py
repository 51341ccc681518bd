"""Building a workflow: nodes, their dependencies, and the checks made before any I/O.

A :class:`Workflow` collects nodes; nothing touches Redis until
:meth:`Workflow.enqueue`. Dependencies may name nodes not added yet (by name), so a
cycle can be written down; it is refused when the workflow is planned, before anything is
stored, with the cycle spelled out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import keys as keyspace
from ..errors import ConfigurationError
from ..task import Task, new_short_id

if TYPE_CHECKING:
    from ..app import Conveyor
    from .handle import WorkflowHandle

RUN_IF = ("succeeded", "finished")


@dataclass(eq=False, slots=True)
class Node:
    """One job of a workflow, made by :meth:`Workflow.add`.

    :ivar name: unique within its workflow (default ``"<task name>#<n>"``)
    :ivar id: the id its job will have once the workflow is enqueued
    :ivar task: the task (with its options) the node runs
    :ivar after: the nodes (or node names) it waits for
    :ivar run_if: ``"succeeded"``: run once every parent succeeded, be cancelled if one
        ends dead or cancelled; ``"finished"``: run once every parent ended, however
    """

    name: str
    id: str
    task: Task[Any, Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    after: tuple[Node | str, ...] = ()
    run_if: str = "succeeded"
    workflow: Workflow | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return f"<Node {self.name!r} task={self.task.name}>"


class Workflow:
    """A set of jobs with dependencies, enqueued together by :meth:`enqueue`.

    Made by :meth:`conveyor.Conveyor.workflow`. Any directed acyclic graph works: chains,
    fan-out (many nodes after one), fan-in (one node after many), and mixes of these.
    Each node is started exactly once, after its parents, also when workers die at any
    instant and when the nodes live on different queues or Cluster nodes.
    """

    def __init__(self, app: Conveyor) -> None:
        self.app = app
        self.nodes: list[Node] = []
        self._names: dict[str, Node] = {}
        self._counters: dict[str, int] = {}
        self._short_id = new_short_id()
        self.enqueued = False  # its ids are taken once it was sent: never send it twice

    @property
    def id(self) -> str:
        """The id the workflow will have once enqueued: ``"<queue of the first node>~..."``
        (a node may be given it as an argument, to read the workflow while it runs).

        :raises ConfigurationError: no node was added yet
        """
        if not self.nodes:
            raise ConfigurationError("a workflow's id is known once its first node is added")
        return keyspace.job_id(self.nodes[0].task.queue, self._short_id)

    def __len__(self) -> int:
        return len(self.nodes)

    def add(
        self, task: Task[Any, Any], *args: Any, after: Iterable[Node | str] | Node | None = None,
        name: str | None = None, run_if: str = "succeeded", **kwargs: Any,
    ) -> Node:
        """Add a node that runs ``task(*args, **kwargs)`` after the nodes in ``after``.

        :param task: a task of this workflow's app, or ``task.options(...)`` (priority,
            tenant, delay and at apply; a delay counts from when the parents are done)
        :param after: nodes (or names of nodes, also of nodes added later) to wait for
        :param name: unique name; default ``"<task name>#<n>"``
        :param run_if: ``"succeeded"`` (default) or ``"finished"``
        :raises ConfigurationError: an unknown task, a duplicate name, a bad ``run_if``,
            a node of another workflow, or an option a node cannot have (``key``,
            ``durable``)
        """
        if self.enqueued:
            raise ConfigurationError("this workflow was enqueued already: build a new one")
        if not isinstance(task, Task) or self.app.tasks.get(task.name) is None:
            raise ConfigurationError(f"workflow nodes run tasks of this app, got {task!r}")
        if run_if not in RUN_IF:
            raise ConfigurationError(f"run_if must be 'succeeded' or 'finished', got {run_if!r}")
        if task.job_options.key is not None or task.job_options.durable:
            raise ConfigurationError("workflow nodes take no key= or durable= option")
        parents = _parents(self, after)
        if name is None:
            name = self._default_name(task.name)
        elif not isinstance(name, str) or not name:
            raise ConfigurationError(f"a node name must be a non-empty string, got {name!r}")
        if name in self._names:
            raise ConfigurationError(f"this workflow already has a node named {name!r}")
        node = Node(name, keyspace.job_id(task.queue, new_short_id()), task, tuple(args),
                    dict(kwargs), parents, run_if, self)
        self.nodes.append(node)
        self._names[name] = node
        return node

    def _default_name(self, task_name: str) -> str:
        n = self._counters.get(task_name, 0)
        while True:
            n += 1
            name = f"{task_name}#{n}"
            if name not in self._names:
                self._counters[task_name] = n
                return name

    def node(self, name: str) -> Node:
        """The node called ``name``.

        :raises KeyError: no such node
        """
        return self._names[name]

    def ordered(self) -> list[Node]:
        """The nodes, parents before children.

        :raises ConfigurationError: an ``after`` names no node of this workflow, or the
            dependencies form a cycle (named in the message)
        """
        parents = {n.name: [self._resolve(p, n) for p in n.after] for n in self.nodes}
        children: dict[str, list[str]] = {n.name: [] for n in self.nodes}
        for child, names in parents.items():
            for parent in names:
                children[parent].append(child)
        left = {name: len(names) for name, names in parents.items()}
        order = [n for n in self.nodes if not left[n.name]]
        for node in order:  # grows while it is walked (Kahn's algorithm)
            for child in children[node.name]:
                left[child] -= 1
                if not left[child]:
                    order.append(self._names[child])
        if len(order) < len(self.nodes):
            raise ConfigurationError("the workflow has a cycle: " + " -> ".join(
                _cycle({n for n, c in left.items() if c}, parents)))
        return order

    def _resolve(self, parent: Node | str, child: Node) -> str:
        name = parent if isinstance(parent, str) else parent.name
        if name not in self._names:
            raise ConfigurationError(
                f"node {child.name!r} runs after {name!r}, which is no node of this workflow")
        if name == child.name:
            raise ConfigurationError(f"node {name!r} cannot run after itself")
        return name

    def enqueue(self) -> WorkflowHandle:
        """Store every node in one call per queue involved (one round trip on a single
        Redis); nodes without parents become ready at once.

        :raises ConfigurationError: a cycle or an unknown dependency (nothing is stored)
        :raises PartialEnqueue: some queues' nodes were stored before Redis failed; the
            workflow was then cancelled, as far as Redis allowed
        """
        from ..producer import store_workflow

        return store_workflow(self.app, self)

    async def aenqueue(self) -> WorkflowHandle:
        """Async twin of :meth:`enqueue`."""
        from ..producer import astore_workflow

        return await astore_workflow(self.app, self)


def _parents(wf: Workflow, after: Iterable[Node | str] | Node | None) -> tuple[Node | str, ...]:
    if after is None:
        return ()
    items = (after,) if isinstance(after, Node | str) else tuple(after)
    for item in items:
        if isinstance(item, Node):
            if item.workflow is not wf:
                raise ConfigurationError(f"{item!r} belongs to another workflow")
        elif not isinstance(item, str):
            raise ConfigurationError(f"after= takes nodes or node names, got {item!r}")
    return tuple(dict.fromkeys(items))  # the same parent twice counts once


def _cycle(stuck: set[str], parents: dict[str, list[str]]) -> list[str]:
    """A cycle among ``stuck`` (nodes that never became free), parent -> child order.
    Every stuck node has a stuck parent, so walking up from any one must loop."""
    path: list[str] = []
    seen: dict[str, int] = {}
    current = min(stuck)
    while current not in seen:
        seen[current] = len(path)
        path.append(current)
        current = next(p for p in parents[current] if p in stuck)
    loop = [*path[seen[current]:], current]
    return loop[::-1]


def chain(wf: Workflow, *tasks: Task[Any, Any] | tuple[Any, ...]) -> list[Node]:
    """Add ``tasks`` to ``wf``, each after the one before; an item is a task, or a tuple
    ``(task, *args)``. Returns the nodes in order."""
    nodes: list[Node] = []
    for item in tasks:
        task, args = (item[0], item[1:]) if isinstance(item, tuple) else (item, ())
        nodes.append(wf.add(task, *args, after=nodes[-1:]))
    return nodes


def batch(
    wf: Workflow, task: Task[Any, Any], items: Sequence[Any], then: Task[Any, Any] | None = None,
    then_args: Sequence[Any] = (), run_if: str = "succeeded",
) -> tuple[list[Node], Node | None]:
    """Fan out ``task`` over ``items`` (each a tuple of arguments, a dict of keyword
    arguments or a single argument) and, with ``then``, fan in to one completion node."""
    nodes = []
    for item in items:
        if isinstance(item, dict):
            nodes.append(wf.add(task, **item))
        elif isinstance(item, tuple | list):
            nodes.append(wf.add(task, *item))
        else:
            nodes.append(wf.add(task, item))
    done = None if then is None else wf.add(then, *then_args, after=nodes, run_if=run_if)
    return nodes, done
