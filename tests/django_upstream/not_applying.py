"""Django's upstream tests of the Tasks framework that do not apply to conveyor's
backend, each with its reason: the one list. docs/django.md shows it, and
``tests/test_django_upstream.py`` checks that the two agree.

Ids are unittest's, ``tasks.<module>.<class>.<test>``. ``EVERYWHERE`` applies on every
Django; ``WITH_THE_BACKPORT`` adds those that do not apply on Django < 6, where the
``django-tasks`` package stands in for ``django.tasks``.
"""

from __future__ import annotations

__all__ = ["EVERYWHERE", "WITH_THE_BACKPORT", "reasons"]

_CLASS = "it checks which class the backend is (Django's {0}) and that it has no OPTIONS"
_CUSTOM = ("it tests backend classes the test module defines itself (BaseTaskBackend"
           " subclasses); no TASKS of it names Django's reference backends, so conveyor's"
           " backend takes no part")

EVERYWHERE: dict[str, str] = {
    "tasks.test_custom_backend.CustomBackendTestCase.test_backend_does_not_support_priority":
        _CUSTOM,
    "tasks.test_custom_backend.CustomBackendTestCase.test_enqueue_async_task_on_non_async_backend":
        _CUSTOM,
    "tasks.test_custom_backend.CustomBackendTestCase.test_no_enqueue": _CUSTOM,
    "tasks.test_custom_backend.CustomBackendTestCase.test_options": _CUSTOM,
    "tasks.test_custom_backend.CustomBackendTestCase.test_using_correct_backend": _CUSTOM,
    "tasks.test_custom_backend.CustomTaskTestCase.test_custom_task_default_values": _CUSTOM,
    "tasks.test_custom_backend.CustomTaskTestCase.test_custom_task_invalid_kwarg": _CUSTOM,
    "tasks.test_custom_backend.CustomTaskTestCase.test_custom_task_with_custom_values": _CUSTOM,
    "tasks.test_custom_backend.CustomTaskTestCase.test_custom_task_with_standard_and_custom_values":
        _CUSTOM,
    "tasks.test_dummy_backend.DummyBackendTestCase.test_refresh_result":
        "it changes the dummy backend's in-memory result object by hand and expects refresh()"
        " to read that change; conveyor's results are read from Redis, which only a worker"
        " changes (test_refresh_result of the immediate-backend tests runs a worker instead)",
    "tasks.test_dummy_backend.DummyBackendTestCase.test_refresh_result_async":
        "as test_refresh_result: it edits the dummy backend's in-memory result by hand",
    "tasks.test_dummy_backend.DummyBackendTestCase.test_using_correct_backend":
        _CLASS.format("DummyBackend"),
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_cannot_get_result":
        "it checks that the immediate backend cannot read a result back (NotImplementedError);"
        " conveyor's can (supports_get_result), which the get_result tests check",
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_cannot_pass_run_after":
        "it checks that the immediate backend refuses run_after; conveyor's schedules the job"
        " (supports_defer)",
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_cannot_refresh_result":
        "it checks that the immediate backend cannot refresh a result; conveyor's can",
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_throws_keyboard_interrupt":
        "the immediate backend runs the task inside enqueue(), so a KeyboardInterrupt the task"
        " raises reaches the caller; a queue's task runs in a worker, and nothing it raises"
        " can reach the process that enqueued it",
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_using_correct_backend":
        _CLASS.format("ImmediateBackend"),
    "tasks.test_tasks.TaskTestCase.test_get_backend":
        "it checks which class each backend is (Django's DummyBackend and ImmediateBackend)",
    "tasks.test_tasks.TaskTestCase.test_using_correct_backend":
        "it checks which class the backend is (Django's DummyBackend)",
}

_PICKLE = ("the backport's Task cannot be pickled (Django 6.1 added `Task.__reduce__` and"
           " `Task._reconstruct`)")

WITH_THE_BACKPORT: dict[str, str] = {
    "tasks.test_custom_backend":
        "the module does not import: the backport's package has no Task at its root",
    "tasks.test_dummy_backend.DummyBackendTestCase.test_validate_disallowed_async_task":
        "the backport's BaseTaskBackend words the error \"async tasks\", Django 6.1"
        " \"async Tasks\"",
    "tasks.test_tasks.TaskTestCase.test_pickle_task": _PICKLE,
    "tasks.test_tasks.TaskTestCase.test_pickle_task_result": _PICKLE,
    "tasks.test_tasks.TaskTestCase.test_run_after_in_decorator":
        "the backport's @task does not refuse run_after with Django 6.1's message",
    "tasks.test_tasks.TaskTestCase.test_unpickle_arbitrary_string": _PICKLE,
    "tasks.test_tasks.TaskTestCase.test_unpickle_non_task_object": _PICKLE,
}


def reasons(version: tuple[object, ...]) -> dict[str, str]:
    """The tests that do not apply on Django ``version`` (``django.VERSION``)."""
    found = dict(EVERYWHERE)
    if int(str(version[0])) < 6:
        found.update(WITH_THE_BACKPORT)
    return found
