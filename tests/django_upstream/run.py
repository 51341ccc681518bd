"""Run one upstream suite's test modules in this interpreter against conveyor, and write
each test's outcome as JSON: ``python -m django_upstream.run OUT.json SUITE LABEL``.

``SUITE`` is ``django`` (Django's ``tests/tasks``, ``LABEL`` ``tasks``),
``django-tasks-rq`` or ``django-tasks-db`` (their ``tests/tests.py``, ``LABEL``
``tests.tests``). ``scripts/django_upstream.py`` calls it with ``PYTHONPATH`` naming
conveyor's ``src``, this package's parent and the folder holding the suite's test
package, and ``CONVEYOR_REDIS_URL`` the private redis-server it started. Every test
starts on an empty Redis (``FLUSHALL``), as every test of the upstream runs starts with
its backend empty. A test of ``not_applying`` is skipped with its reason. Outcomes are
keyed ``SUITE:unittest id``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import sys
import types
import unittest
from typing import Any

import redis

from . import not_applying

__all__ = ["main"]


def backport_inspect() -> None:
    """Django 6 declares Python 3.12 and, of what 3.12 adds, uses only
    ``inspect.markcoroutinefunction`` and the ``inspect.iscoroutinefunction`` that honours
    its mark: on Python 3.11 give ``inspect`` both, made on asyncio's own mark (as
    asgiref does for 3.11), so Django 6 runs here."""
    import asyncio.coroutines
    import inspect

    if hasattr(inspect, "markcoroutinefunction"):
        return
    plain = inspect.iscoroutinefunction
    mark = asyncio.coroutines._is_coroutine  # type: ignore[attr-defined]

    def iscoroutinefunction(obj: Any) -> bool:
        return plain(obj) or getattr(obj, "_is_coroutine", None) is mark

    def markcoroutinefunction(func: Any) -> Any:
        getattr(func, "__func__", func)._is_coroutine = mark
        return func

    inspect.iscoroutinefunction = iscoroutinefunction
    inspect.markcoroutinefunction = markcoroutinefunction  # type: ignore[attr-defined]


def alias_the_backport() -> None:
    """With the django-tasks backport (Django < 6), make ``django.tasks`` name it, with
    Django 6's names for its two renamed errors and its logger, so Django's tests import
    and listen unchanged."""
    if importlib.util.find_spec("django.tasks") is not None:
        return
    import django_tasks

    for part in ("", ".base", ".exceptions", ".signals", ".backends", ".backends.base",
                 ".backends.dummy", ".backends.immediate"):
        sys.modules[f"django.tasks{part}"] = importlib.import_module(f"django_tasks{part}")
    exceptions = django_tasks.exceptions
    exceptions.InvalidTask = exceptions.InvalidTaskError  # type: ignore[attr-defined]
    exceptions.InvalidTaskBackend = (  # type: ignore[attr-defined]
        exceptions.InvalidTaskBackendError)
    django_tasks.signals.logger = logging.getLogger("django.tasks")


class _Outcomes(unittest.TextTestResult):
    """Each test's outcome by id; Redis emptied before each test."""

    outcomes: dict[str, dict[str, str]] = {}
    client: redis.Redis | None = None
    not_applying: dict[str, str] = {}
    prefix = ""

    def _note(self, test: Any, outcome: str, detail: str = "") -> None:
        test_id = test.id() if hasattr(test, "id") else str(test)
        # A module that fails to import shows as one test named after it; a module listed
        # as not applying is expected to.
        test_id = self.prefix + test_id.removeprefix("unittest.loader._FailedTest.")
        if test_id in self.not_applying:
            outcome, detail = "skipped", self.not_applying[test_id]
        known = self.outcomes.get(test_id)
        if known is None or known["outcome"] in {"passed", "skipped"}:
            self.outcomes[test_id] = {"outcome": outcome, "detail": detail}

    def startTest(self, test: Any) -> None:
        if self.client is not None:
            self.client.flushall()
        super().startTest(test)

    def addSuccess(self, test: Any) -> None:
        super().addSuccess(test)
        self._note(test, "passed")

    def addFailure(self, test: Any, err: Any) -> None:
        super().addFailure(test, err)
        self._note(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test: Any, err: Any) -> None:
        super().addError(test, err)
        self._note(test, "failed", self._exc_info_to_string(err, test))

    def addSkip(self, test: Any, reason: str) -> None:
        super().addSkip(test, reason)
        self._note(test, "skipped", reason)

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._note(test, "failed", self._exc_info_to_string(err, test))


def run_a_conveyor_worker(*args: Any, **kwargs: Any) -> None:
    """The step that runs the worker, in the test modules of django-tasks-rq (an RQ
    ``SimpleWorker``) and django-tasks-db (``manage.py db_worker --batch``): a real conveyor
    worker, in this process, until no job of the default backend's queues is ready. Their
    arguments (a backend alias, a verbosity, output streams) are the db worker's options."""
    backend = tasks_api_of_the_run().task_backends["default"]
    queues = sorted(backend.queues) or ["default"]
    backend.app.worker(queues=queues, concurrency=1).run(burst=True)


def tasks_api_of_the_run() -> Any:
    from conveyor.contrib.django import tasks_api

    return tasks_api


def _swap_the_worker_step(tests: list[unittest.TestCase]) -> None:
    for test in tests:
        if hasattr(type(test), "run_worker"):
            type(test).run_worker = staticmethod(run_a_conveyor_worker)  # type: ignore[attr-defined]


def _tests(suite: unittest.TestSuite) -> list[unittest.TestCase]:
    found: list[unittest.TestCase] = []
    for item in suite:
        found += _tests(item) if isinstance(item, unittest.TestSuite) else [item]
    return found


def _skip_not_applying(suite: unittest.TestSuite, reasons: dict[str, str], prefix: str
                       ) -> None:
    for test in _tests(suite):
        reason = reasons.get(prefix + test.id())
        if reason is not None:
            method = getattr(test, test._testMethodName)
            setattr(test, test._testMethodName, unittest.skip(reason)(method))


def real_redis_for_rq() -> None:
    """django-tasks-rq's test module imports the in-memory Redis classes of ``fakeredis``
    for RQ's own connections: here those names are redis-py's own clients, so that every
    connection of the run reaches the private redis-server (the settings' ``RQ_QUEUES``
    name it) and no in-memory stand-in is installed or run. Their ``flushall`` before each
    test is the one this runner does anyway."""
    stand_in = types.ModuleType("fakeredis")
    stand_in.FakeRedis = redis.Redis  # type: ignore[attr-defined]
    stand_in.FakeStrictRedis = redis.StrictRedis  # type: ignore[attr-defined]
    sys.modules["fakeredis"] = stand_in


def main(argv: list[str]) -> int:
    out, suite_name, label = argv
    os.environ["UPSTREAM_SUITE"] = suite_name
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_upstream.settings")
    backport_inspect()
    real_redis_for_rq()
    if suite_name == "django":  # the backends' own tests know the backport by its name
        alias_the_backport()
    import django

    django.setup()
    from django.test.runner import DiscoverRunner

    from .backends import point_at_conveyor

    point_at_conveyor()
    if suite_name != "django":  # their test modules import their tasks as tests.tasks
        from . import backend_tasks

        importlib.import_module("tests")
        sys.modules["tests.tasks"] = backend_tasks
        sys.modules["tests"].tasks = backend_tasks  # type: ignore[attr-defined]
    _Outcomes.client = redis.Redis.from_url(os.environ["CONVEYOR_REDIS_URL"])
    _Outcomes.prefix = f"{suite_name}:"

    class Runner(DiscoverRunner):  # type: ignore[misc]
        def get_resultclass(self) -> type[unittest.TextTestResult]:
            return _Outcomes

        def get_test_runner_kwargs(self) -> dict[str, Any]:
            kwargs: dict[str, Any] = super().get_test_runner_kwargs()
            if sys.version_info < (3, 12):  # Django 6 passes 3.12's durations= on
                kwargs.pop("durations", None)
            return kwargs

    runner = Runner(verbosity=int(os.environ.get("UPSTREAM_VERBOSITY", "1")),
                    interactive=False)
    suite = runner.build_suite([label])
    _Outcomes.not_applying = not_applying.reasons(django.VERSION)
    _skip_not_applying(suite, _Outcomes.not_applying, _Outcomes.prefix)
    _swap_the_worker_step(_tests(suite))
    runner.setup_test_environment()
    databases = runner.setup_databases()
    try:
        runner.run_suite(suite)
    finally:
        runner.teardown_databases(databases)
        runner.teardown_test_environment()
    with open(out, "w") as stream:
        json.dump({"django": django.get_version(), "tests": _Outcomes.outcomes}, stream,
                  indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
