"""Django's contract for a Tasks backend, checked against conveyor's backend with a real
Redis and a real conveyor worker.

The cases follow those Django's own test suite runs against its reference backends
(Django 6.x ``tests/tasks/test_tasks.py``, ``tests/tasks/test_immediate_backend.py``,
``tests/tasks/test_dummy_backend.py``, and the ``django-tasks`` backport's backend tests),
written anew for a queue backend: the worker runs where those backends run at once.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from django_setup import conveyor_tasks, run_worker
from helpers import RedisServer

from django.apps import apps  # isort: skip  (after django_setup)
from django.db import transaction  # isort: skip
from django.utils import timezone  # isort: skip

from conveyor.contrib.django import ConveyorBackend, tasks_api
from django_project import tasks

exceptions = importlib.import_module(f"{tasks_api.__name__}.exceptions")
signals = importlib.import_module(f"{tasks_api.__name__}.signals")
INVALID_TASK = vars(exceptions).get("InvalidTask") or vars(exceptions)["InvalidTaskError"]
LOGGER = tasks_api.__name__  # "django.tasks", or "django_tasks" with the backport
Status = tasks_api.TaskResultStatus


@pytest.fixture
def backend(redis_server: RedisServer, namespace: str) -> Iterator[ConveyorBackend]:
    with conveyor_tasks(redis_server.url, namespace) as made:
        yield made


class Heard:
    """Everything a signal's listener heard, as (signal name, sender, status, result)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, str, Any]] = []
        self._listeners = {name: self._listener(name)
                           for name in ("task_enqueued", "task_started", "task_finished")}

    def _listener(self, name: str) -> Any:
        def listen(sender: Any, task_result: Any, **kwargs: Any) -> None:
            self.calls.append((name, sender, str(task_result.status), task_result))
        return listen

    def __enter__(self) -> Heard:
        for name, listener in self._listeners.items():
            getattr(signals, name).connect(listener)
        return self

    def __exit__(self, *exc: object) -> None:
        for name, listener in self._listeners.items():
            getattr(signals, name).disconnect(listener)


# -- enqueue -----------------------------------------------------------------------------


def test_the_default_backend_is_conveyors(backend: ConveyorBackend) -> None:
    assert isinstance(tasks_api.task_backends["default"], ConveyorBackend)
    assert tasks_api.task_backends["default"] is backend
    assert backend.supports_defer and backend.supports_get_result
    assert backend.supports_async_task and backend.supports_priority


def test_an_enqueued_task_is_ready_and_unfinished(backend: ConveyorBackend) -> None:
    result = tasks.add.enqueue(1, y=2)
    assert result.status == Status.READY and not result.is_finished
    assert (result.started_at, result.last_attempted_at, result.finished_at) == (
        None, None, None)
    assert result.enqueued_at is not None
    assert (result.task, result.args, result.kwargs) == (tasks.add, [1], {"y": 2})
    assert (result.attempts, result.worker_ids, result.errors) == (0, [], [])
    assert result.backend == "default"
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018


def test_aenqueue_and_aget_result(backend: ConveyorBackend) -> None:
    async def both() -> tuple[Any, Any]:
        result = await tasks.add.aenqueue(3, 4)
        return result, await tasks.add.aget_result(result.id)

    result, read = asyncio.run(both())
    assert result.status == Status.READY
    assert read == result


@pytest.mark.parametrize("priority", [-101, 101, 1.5])
def test_a_priority_out_of_range_is_invalid(backend: ConveyorBackend, priority: Any) -> None:
    with pytest.raises(INVALID_TASK, match="priority"):
        tasks.add.using(priority=priority)


def test_a_queue_the_backend_does_not_serve_is_invalid(backend: ConveyorBackend) -> None:
    with pytest.raises(INVALID_TASK, match="nowhere"):
        tasks.add.using(queue_name="nowhere").enqueue(1, 2)


def outsider() -> None:
    """A module-level function of a module under no installed app."""


def test_a_task_the_backend_cannot_import_is_invalid(backend: ConveyorBackend) -> None:
    with pytest.raises(INVALID_TASK, match="outsider"):
        tasks_api.task(outsider).enqueue()


def test_a_naive_run_after_is_invalid(backend: ConveyorBackend) -> None:
    with pytest.raises(INVALID_TASK, match="aware"):
        tasks.add.using(run_after=datetime.now()).enqueue(1, 2)


@pytest.mark.parametrize("bad", [datetime(2026, 1, 1), {1, 2}, b"\xff"], ids=repr)
def test_arguments_that_are_not_json_are_refused_and_never_run(
        backend: ConveyorBackend, bad: object) -> None:
    with Heard() as heard:
        with pytest.raises((TypeError, ValueError)):
            tasks.echo.enqueue(bad)
        namespace = backend.app.namespace
        assert list(backend.app.redis.scan_iter(match=f"*{namespace}*")) == []  # nothing
        run_worker(backend)
    assert heard.calls == []


def test_run_after_is_kept_and_the_job_waits_for_it(backend: ConveyorBackend) -> None:
    later = timezone.now() + timedelta(hours=1)
    result = tasks.add.using(run_after=later).enqueue(1, 2)
    assert result.task.run_after == later
    run_worker(backend)
    read = tasks.add.get_result(result.id)
    assert read.status == Status.READY and read.task.run_after == later


# -- results -----------------------------------------------------------------------------


def test_a_missing_result_does_not_exist(backend: ConveyorBackend) -> None:
    for missing in ("123", "default~AAAAAAAAAAAAAAAA"):
        with pytest.raises(exceptions.TaskResultDoesNotExist):
            backend.get_result(missing)
        with pytest.raises(exceptions.TaskResultDoesNotExist):
            asyncio.run(backend.aget_result(missing))


def test_a_result_of_another_task_is_a_mismatch(backend: ConveyorBackend) -> None:
    result = tasks.add.enqueue(1, 2)
    with pytest.raises(exceptions.TaskResultMismatch):
        tasks.echo.get_result(result.id)


def test_a_result_reads_back_equal(backend: ConveyorBackend) -> None:
    result = tasks.add.using(priority=30).enqueue(1, 2)
    assert backend.get_result(result.id) == result


def test_refresh_of_an_untouched_result_changes_nothing(backend: ConveyorBackend) -> None:
    result = tasks.add.enqueue(1, 2)
    before = (result.status, result.enqueued_at, result.started_at, result.worker_ids)
    result.refresh()
    assert (result.status, result.enqueued_at, result.started_at, result.worker_ids) == before


def test_refresh_after_a_run_shows_its_outcome(backend: ConveyorBackend) -> None:
    result = tasks.add.enqueue(20, 22)
    worker_id = run_worker(backend)
    result.refresh()
    assert result.status == Status.SUCCESSFUL and result.is_finished
    assert result.return_value == 42
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at
    assert (result.attempts, result.worker_ids, result.errors) == (1, [worker_id], [])


def test_a_failed_task_reports_its_error(backend: ConveyorBackend) -> None:
    result = tasks.fail.enqueue()
    run_worker(backend)
    result.refresh()
    assert result.status == Status.FAILED
    [error] = result.errors
    assert error.exception_class is ValueError
    assert "this task fails on purpose" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018


def test_an_async_task_runs(backend: ConveyorBackend) -> None:
    result = tasks.async_add.enqueue(5, 6)
    run_worker(backend)
    assert tasks.async_add.get_result(result.id).return_value == 11


def test_a_task_taking_context_sees_its_attempt(backend: ConveyorBackend) -> None:
    result = tasks.attempt_and_workers.enqueue()
    worker_id = run_worker(backend)
    assert tasks.attempt_and_workers.get_result(result.id).return_value == [1, [worker_id]]


# -- signals and logging -----------------------------------------------------------------


def test_signals_of_a_successful_task(backend: ConveyorBackend) -> None:
    with Heard() as heard:
        result = tasks.add.enqueue(1, 2)
        assert [(n, s, st) for n, s, st, _ in heard.calls] == [
            ("task_enqueued", ConveyorBackend, "READY")]
        run_worker(backend)
    assert [(n, st) for n, _, st, _ in heard.calls] == [
        ("task_enqueued", "READY"), ("task_started", "RUNNING"),
        ("task_finished", "SUCCESSFUL")]
    assert {r.id for *_, r in heard.calls} == {result.id}
    assert heard.calls[-1][3].return_value == 3


def test_signals_of_a_failed_task(backend: ConveyorBackend) -> None:
    with Heard() as heard:
        tasks.fail.enqueue()
        run_worker(backend)
    finished = heard.calls[-1]
    assert (finished[0], finished[2]) == ("task_finished", "FAILED")
    assert finished[3].errors[0].exception_class is ValueError


def test_enqueue_logs(backend: ConveyorBackend, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    result = tasks.add.enqueue(1, 2)
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1 and "enqueued" in lines[0] and result.id in lines[0]


def test_started_and_finished_logs(backend: ConveyorBackend,
                                   caplog: pytest.LogCaptureFixture) -> None:
    ok, bad = tasks.add.enqueue(1, 2), tasks.fail.enqueue()
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    run_worker(backend)
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert any(ok.id in line and "state=RUNNING" in line for line in lines), lines
    assert any(ok.id in line and "state=SUCCESSFUL" in line for line in lines), lines
    assert any(bad.id in line and "state=FAILED" in line for line in lines), lines


# -- transactions, app registry, priorities -------------------------------------------------


def test_enqueue_on_commit_waits_for_the_commit(redis_server: RedisServer,
                                                namespace: str) -> None:
    with conveyor_tasks(redis_server.url, namespace, enqueue_on_commit=True) as backend:
        with Heard() as heard, transaction.atomic():
            result = tasks.add.enqueue(1, 2)
            assert result.enqueued_at is None and heard.calls == []
            with pytest.raises(exceptions.TaskResultDoesNotExist):
                backend.get_result(result.id)
        assert [n for n, *_ in heard.calls] == ["task_enqueued"]
        assert backend.get_result(result.id).status == Status.READY


def test_tasks_run_while_available_apps_is_narrowed(backend: ConveyorBackend) -> None:
    apps.set_available_apps(["conveyor.contrib.django"])  # as TransactionTestCase does
    try:
        result = tasks.add.enqueue(1, 2)
        run_worker(backend)
        assert tasks.add.get_result(result.id).return_value == 3
    finally:
        apps.unset_available_apps()


def test_a_higher_priority_runs_first(backend: ConveyorBackend, redis_server: RedisServer
                                      ) -> None:
    key = f"{backend.app.namespace}:ran"
    for priority in (-50, 0, 10, 100):  # smallest first: a queue in order would run it first
        tasks.note.using(priority=priority).enqueue(redis_server.url, key, str(priority))
    run_worker(backend, concurrency=1)
    assert backend.app.redis.lrange(key, 0, -1) == [b"100", b"10", b"0", b"-50"]
