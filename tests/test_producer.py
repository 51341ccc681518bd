"""One producer path: every way of storing jobs runs the enqueue hooks once, and only
``conveyor.producer`` (its plans and its senders) builds and sends the calls that store
jobs."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import conveyor
from conveyor import hooks, producer, testing
from conveyor.scripts import calls
from helpers import run_async

SRC = Path(conveyor.__file__).parent


class Counting(hooks.Hook):
    """Notes each enqueue hook entered: (task name, count), and how many were open at once."""

    def __init__(self) -> None:
        self.entered: list[tuple[str, int]] = []
        self.open = 0
        self.most_open = 0

    @contextmanager
    def _enqueue(self, task: conveyor.Task[Any, Any], count: int) -> Iterator[None]:
        self.entered.append((task.name, count))
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            yield
        finally:
            self.open -= 1

    def enqueue(self, task: conveyor.Task[Any, Any], count: int, meta: dict[str, str]
                ) -> AbstractContextManager[None]:
        return self._enqueue(task, count)


def test_every_producer_runs_the_enqueue_hooks_once_per_call(app: conveyor.Conveyor) -> None:
    counting = Counting()
    app.hooks.append(counting)

    @app.task(name="p.one", queue="producer")
    def one(x: int) -> int:
        return x

    @app.task(name="p.two", queue="producer-two")
    def two(x: int) -> int:
        return x

    one.enqueue(1)
    one.enqueue_many([2, 3, 4])
    run_async(app, one.aenqueue(5))
    run_async(app, one.aenqueue_many([6, 7]))
    assert counting.entered == [("p.one", 1), ("p.one", 3), ("p.one", 1), ("p.one", 2)]

    counting.entered.clear()
    wf = app.workflow()
    first = wf.add(one, 1)
    for i in range(3):
        wf.add(two, i, after=[first])
    wf.add(two.options(tenant="acme"), 9, after=[first])
    wf.enqueue()
    # one entry per kind of job (task and options), all open around the one store
    assert counting.entered == [("p.one", 1), ("p.two", 3), ("p.two", 1)]
    assert counting.most_open == 3

    counting.entered.clear()
    app.store("producer", calls.JobSpec(task="p.one"), [("raw", b"[[1]]")])
    assert counting.entered == []  # jobs encoded by the caller: no task, no hooks

    with testing.inline(app):  # the inline sender takes the same plans, hooks and all
        assert one.enqueue(8).result() == 8
    assert counting.entered == [("p.one", 1)]


def test_a_plan_stored_later_keeps_its_ids_and_runs_the_hooks_then(
    app: conveyor.Conveyor,
) -> None:
    counting = Counting()
    app.hooks.append(counting)

    @app.task(name="p.later", queue="producer-later")
    def later(x: int) -> int:
        return x

    planned = producer.plan(later, [((1,), {})])
    assert counting.entered == []  # planning is no enqueue: nothing stored yet
    [job_id] = planned.job_ids
    [job] = producer.store(planned)
    assert job.id == job_id
    assert counting.entered == [("p.later", 1)]
    assert job.info().state == conveyor.JobState.READY


# (module, call name): which module may make which call that stores jobs
ALLOWED = {
    "enqueue": {"conveyor.producer"},  # calls.enqueue: the enqueue script's call
    "enqueue_one": {"conveyor.producer.send"},
    "enqueue_plain": {"conveyor.producer.send"},
    "workflow_enqueue": {"conveyor.workflow.store"},  # planned there, sent by the producer
}


def _storing_calls(tree: ast.Module) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr, owner = node.func.attr, node.func.value
            if attr == "enqueue" and not (isinstance(owner, ast.Name) and owner.id == "calls"):
                continue  # task.enqueue, hook.enqueue: not the script's call
            if attr in ALLOWED:
                yield node.lineno, attr


def test_only_the_producer_builds_and_sends_the_calls_that_store_jobs() -> None:
    found = []
    for file in sorted(SRC.rglob("*.py")):
        parts = file.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name.startswith("conveyor.scripts"):
            continue  # where the calls and the runners are defined
        for line, attr in _storing_calls(ast.parse(file.read_text())):
            if name not in ALLOWED[attr]:
                found.append(f"{file.relative_to(SRC.parent)}:{line} {attr}")
    assert found == []
    sample = ast.parse("calls.enqueue(k, spec, jobs, limits)\nrunner.enqueue_one(k)\n"
                       "task.enqueue(1)\n")
    assert [attr for _, attr in _storing_calls(sample)] == ["enqueue", "enqueue_one"]
