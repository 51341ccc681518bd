"""conveyor's Django Tasks backend in the test process (tests/django_project), against a
real Redis and real conveyor workers: what it validates, stores, reads back and signals."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from django_setup import conveyor_tasks, heard, run_worker
from helpers import RedisServer, env_with_src

from django.apps import apps  # isort: skip  (after django_setup)
from django.db import transaction  # isort: skip
from django.test import override_settings  # isort: skip
from django.utils import timezone  # isort: skip

from conveyor.contrib.django import ConveyorBackend, api, tasks_api
from conveyor.contrib.django.priority import TABLE, to_conveyor_priority
from conveyor.contrib.django.results import ordered
from django_project import tasks
from django_project.settings import tasks_setting

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def backend(redis_server: RedisServer, namespace: str) -> Iterator[ConveyorBackend]:
    with conveyor_tasks(redis_server.url, namespace) as made:
        yield made


def _keys(backend: ConveyorBackend) -> list[bytes]:
    return sorted(backend.app.redis.scan_iter(match=f"*{backend.app.namespace}*"))


# -- 1. a call that raises stores nothing ------------------------------------------------


@pytest.mark.parametrize("bad", [datetime.now(), b"\xff", object()],
                         ids=["datetime", "bytes", "object"])
def test_an_enqueue_rejected_for_its_arguments_stores_nothing(
        backend: ConveyorBackend, bad: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        tasks.echo.enqueue(1, bad)
    with pytest.raises((TypeError, ValueError)):
        tasks.echo.enqueue(key=[bad])
    assert _keys(backend) == []  # no job, no queue, nothing
    run_worker(backend)
    assert heard(backend) == []  # and so nothing ran


def test_the_job_stores_the_arguments_django_normalised(backend: ConveyorBackend) -> None:
    result = tasks.echo.enqueue((1, 2), b"text", key={"nested": (3,)})
    assert (result.args, result.kwargs) == ([[1, 2], "text"], {"key": {"nested": [3]}})
    run_worker(backend)
    done = tasks.echo.get_result(result.id)
    assert done.return_value == [[[1, 2], "text"], {"key": {"nested": [3]}}]


# -- 2. the invalid-task error of the installed API ----------------------------------------


def outsider() -> None:
    """A module-level function of a module under no installed app."""


def test_a_task_outside_the_installed_apps_is_refused_with_the_apis_error(
        backend: ConveyorBackend) -> None:
    offered = vars(tasks_api.exceptions)  # Django 6's name, else the backport's
    named = offered.get("InvalidTask") or offered["InvalidTaskError"]
    assert api.InvalidTask is named
    stray = tasks_api.task(outsider)
    with pytest.raises(named, match=r"test_django_backend\.outsider .*INSTALLED_APPS"):
        stray.enqueue()
    assert _keys(backend) == []


def test_names_are_resolved_by_what_the_module_offers() -> None:
    django6 = types.ModuleType("django6_like")
    django6.InvalidTask = KeyError  # type: ignore[attr-defined]
    django6.InvalidTaskError = IndexError  # type: ignore[attr-defined]
    backport = types.ModuleType("backport_like")
    backport.InvalidTaskError = IndexError  # type: ignore[attr-defined]
    assert api.first_attribute(django6, "InvalidTask", "InvalidTaskError") is KeyError
    assert api.first_attribute(backport, "InvalidTask", "InvalidTaskError") is IndexError
    with pytest.raises(ImportError, match="neither_like has none of InvalidTask, Other"):
        api.first_attribute(types.ModuleType("neither_like"), "InvalidTask", "Other")


# -- 3. signals, from the producer and from a worker in another process ---------------------


def test_signals_are_sent_by_the_producer_and_by_a_worker_process(
        backend: ConveyorBackend, redis_server: RedisServer) -> None:
    ok, bad = tasks.add.enqueue(1, 2), tasks.fail.enqueue()
    assert heard(backend) == [f"task_enqueued {ok.id} READY  ConveyorBackend",
                              f"task_enqueued {bad.id} READY  ConveyorBackend"]
    env = env_with_src()
    env.update(DJANGO_SETTINGS_MODULE="django_project.settings",
               CONVEYOR_REDIS_URL=redis_server.url, CONVEYOR_NAMESPACE=backend.app.namespace)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "django", "conveyor_worker", "--burst",
                           "-c", "1"], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    lines = heard(backend)[2:]
    worker = re.escape(lines[0].split()[3])
    assert re.fullmatch(rf"task_started {ok.id} RUNNING {worker} ConveyorBackend", lines[0])
    assert lines[1:] == [f"task_finished {ok.id} SUCCESSFUL {lines[0].split()[3]}"
                         " ConveyorBackend",
                         f"task_started {bad.id} RUNNING {lines[0].split()[3]} ConveyorBackend",
                         f"task_finished {bad.id} FAILED {lines[0].split()[3]} ConveyorBackend"]
    # Django's own logging on the Tasks logger heard the worker's signals too.
    assert re.search(rf"Task id={ok.id} path=django_project.tasks.add state=SUCCESSFUL",
                     proc.stderr), proc.stderr
    assert re.search(rf"Task id={bad.id} path=django_project.tasks.fail state=FAILED",
                     proc.stderr), proc.stderr


# -- 4. one source of truth for a result -------------------------------------------------


def test_a_result_reads_back_equal_and_refresh_changes_nothing(
        backend: ConveyorBackend) -> None:
    later = timezone.now() + timedelta(hours=1, microseconds=123)
    for task in (tasks.add, tasks.add.using(priority=25, queue_name="other",
                                            run_after=later)):
        result = task.enqueue(2, 3)
        assert result.enqueued_at is not None
        assert result.enqueued_at.microsecond % 1000 == 0  # the server's milliseconds
        assert result == backend.get_result(result.id)
        before = [getattr(result, name) for name in sorted(tasks_api.base.TASK_REFRESH_ATTRS)
                  if hasattr(result, name)]
        result.refresh()
        after = [getattr(result, name) for name in sorted(tasks_api.base.TASK_REFRESH_ATTRS)
                 if hasattr(result, name)]
        assert after == before
        assert backend.get_result(result.id).task == task


# -- 5. INSTALLED_APPS decides, not the narrowed app registry ----------------------------


def test_tasks_of_installed_apps_run_while_available_apps_is_narrowed(
        backend: ConveyorBackend) -> None:
    apps.set_available_apps(["conveyor.contrib.django"])  # as TransactionTestCase does
    try:
        result = tasks.add.enqueue(20, 22)
        run_worker(backend)
        assert tasks.add.get_result(result.id).return_value == 42
    finally:
        apps.unset_available_apps()


# -- 6. enqueue on commit ----------------------------------------------------------------


def test_an_enqueue_on_commit_has_no_enqueued_at_until_the_commit(
        redis_server: RedisServer, namespace: str) -> None:
    with conveyor_tasks(redis_server.url, namespace, enqueue_on_commit=True) as backend:
        with transaction.atomic():
            result = tasks.add.enqueue(1, 1)
            assert (result.status, result.enqueued_at) == ("READY", None)
            assert heard(backend) == []
            with pytest.raises(api.TaskResultDoesNotExist):
                backend.get_result(result.id)
        # The commit stored the job and filled in the result enqueue returned, as
        # Django's own backends do; the signal is sent then, not before.
        assert heard(backend) == [f"task_enqueued {result.id} READY  ConveyorBackend"]
        assert result.enqueued_at is not None
        assert result == backend.get_result(result.id)
    with conveyor_tasks(redis_server.url, namespace, enqueue_on_commit=True) as backend:
        with pytest.raises(RuntimeError), transaction.atomic():
            rolled_back = tasks.add.enqueue(1, 1)
            raise RuntimeError("roll back")
        assert rolled_back.enqueued_at is None
        with pytest.raises(api.TaskResultDoesNotExist):
            backend.get_result(rolled_back.id)


# -- 7. priorities -----------------------------------------------------------------------


def test_a_larger_django_priority_runs_first(backend: ConveyorBackend,
                                             redis_server: RedisServer) -> None:
    order = f"{backend.app.namespace}:order"
    priorities = [-100, -61, -21, 0, 1, 26, 51, 76]  # one per conveyor priority used
    for priority in priorities:  # enqueued smallest first: run in the opposite order
        tasks.note.using(priority=priority).enqueue(redis_server.url, order, str(priority))
    run_worker(backend, "default", concurrency=1)
    ran = [int(x) for x in backend.app.redis.lrange(order, 0, -1)]
    assert ran == sorted(priorities, reverse=True)


def test_the_priority_table_is_monotonic_and_the_one_documented() -> None:
    mapped = [to_conveyor_priority(p) for p in range(-100, 101)]
    assert mapped == sorted(mapped)
    assert [level for _, _, level in TABLE] == list(range(10))
    docs = (ROOT / "docs" / "django.md").read_text()
    for low, high, level in TABLE:
        span = f"{low}" if low == high else f"{low} to {high}"
        assert f"| {span} | {level} |" in docs, (span, level)


# -- 8. worker ids -----------------------------------------------------------------------


def test_worker_ids_name_the_worker_of_the_latest_attempt(
        redis_server: RedisServer, namespace: str) -> None:
    with conveyor_tasks(redis_server.url, namespace, retries=1) as backend:
        seen = tasks.attempt_and_workers.enqueue()
        failed = tasks.fail.enqueue()
        worker_id = run_worker(backend)
        while not tasks.fail.get_result(failed.id).is_finished:  # its retry is due soon
            worker_id_2 = run_worker(backend)
        result = tasks.attempt_and_workers.get_result(seen.id)
        assert result.return_value == [1, [worker_id]]  # while running: this worker
        assert result.worker_ids == [worker_id]
        done = tasks.fail.get_result(failed.id)
        assert done.attempts == 2
        assert done.worker_ids == ["", worker_id_2]  # earlier attempts' are not recorded


def test_a_listener_that_raises_in_the_worker_changes_no_outcome(
        backend: ConveyorBackend, caplog: pytest.LogCaptureFixture) -> None:
    def broken_listener(sender: type, task_result: object, **kwargs: object) -> None:
        raise RuntimeError("a listener's own bug")

    result = tasks.add.enqueue(1, 2)
    api.signals.task_started.connect(broken_listener)
    api.signals.task_finished.connect(broken_listener)
    try:
        run_worker(backend)
    finally:
        api.signals.task_started.disconnect(broken_listener)
        api.signals.task_finished.disconnect(broken_listener)
    assert tasks.add.get_result(result.id).return_value == 3
    failures = [r for r in caplog.records if r.name == "django.dispatch"]  # logged there
    assert len(failures) == 2 and all(r.exc_info for r in failures)


# -- 9. what Django's own tests found (scripts/django_upstream.py) --------------------------


def test_a_return_value_django_cannot_store_fails_the_task(backend: ConveyorBackend) -> None:
    result = tasks.returns_a_function.enqueue()
    run_worker(backend)
    result.refresh()
    assert result.status == tasks_api.TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class is TypeError and "Unsupported type" in error.traceback


def test_a_task_sent_to_another_alias_runs_and_reads_back_with_it(
        redis_server: RedisServer, namespace: str) -> None:
    with conveyor_tasks(redis_server.url, namespace) as backend:
        setting = {**tasks_setting(redis_server.url, namespace),
                   "other": tasks_setting(redis_server.url, namespace)["default"]}
        with override_settings(TASKS=setting):
            other = tasks_api.task_backends["other"]
            result = tasks.add.using(backend="other").enqueue(2, 5)
            assert result.backend == "other" and result.task.backend == "other"
            run_worker(other)
            done = other.get_result(result.id)
            assert (done.return_value, done.backend, done.task.backend) == (7, "other", "other")
            assert done.task == tasks.add.using(backend="other")
            other.app.close()
        assert backend.get_result(result.id).return_value == 7  # same Redis and namespace


def test_result_times_never_go_back() -> None:
    assert ordered(10.0, 12.5, 12.4) == [10.0, 12.5, 12.5]  # a finish a moment early
    assert ordered(10.0, 9.9, None) == [10.0, 10.0, None]
    assert ordered(None, None, None) == [None, None, None]
    assert ordered(10.0, None, 11.0) == [10.0, None, 11.0]


def test_tasks_of_the_settings_package_resolve_inside_override_settings(
        backend: ConveyorBackend) -> None:
    # django_project is the settings' package; with it out of INSTALLED_APPS only the
    # settings module vouches for its tasks, and override_settings hides that one.
    with override_settings(INSTALLED_APPS=["conveyor.contrib.django"]):
        assert backend._resolve("django_project.tasks.add") is tasks.add
        assert backend._resolve("json.dumps") is None  # still nothing outside them
