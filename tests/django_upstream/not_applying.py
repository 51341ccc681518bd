"""The upstream tests that do not apply to conveyor's backend, each with its reason: the
one list. docs/django.md shows it, and ``tests/test_django_upstream.py`` checks that the
two agree; ``scripts/django_upstream.py`` fails a run where a test not listed here does
not pass, or where a test listed here is not in the run.

Ids are ``<suite>:<unittest id>``, the suite being the distribution the tests come from:
``django`` (``tests/tasks/`` of Django's sdist), ``django-tasks-rq`` and
``django-tasks-db`` (``tests/tests.py`` of theirs). An id naming a module stands for all
of its tests. ``EVERYWHERE`` holds on every Django; ``WITH_THE_BACKPORT`` adds those that
do not apply on Django < 6 (where the ``django-tasks`` package stands in for
``django.tasks``), ``ON_DJANGO_6`` those that do not apply on Django 6.
"""

from __future__ import annotations

__all__ = ["EVERYWHERE", "ON_DJANGO_6", "WITH_THE_BACKPORT", "reasons"]


def _each(prefix: str, names: str, reason: str) -> dict[str, str]:
    """``reason`` for each test of ``names`` (space-separated) under ``prefix``."""
    return {f"{prefix}.{name}": reason for name in names.split()}


_CLASS = "it checks which class the backend is ({0}) and that it has no OPTIONS"
_CUSTOM = ("it tests backend classes the test module defines itself (BaseTaskBackend"
           " subclasses); no TASKS of it names Django's reference backends, so conveyor's"
           " backend takes no part")
_PICKLE = ("the backport's Task cannot be pickled (Django 6.1 added `Task.__reduce__` and"
           " `Task._reconstruct`)")
_ROWS = ("it reads, writes or counts django-tasks-db's `DBTaskResult` rows (or their order,"
         " indexes or migrations); conveyor keeps its jobs in Redis")
_QUERIES = "it counts the SQL queries of an enqueue or a worker run; conveyor's make none"
_ID_FUNCTION = "it tests django-tasks-db's `id_function` option (result ids made by the database)"
_DB_WORKER = ("it tests django-tasks-db's `db_worker` command (its options, output or"
              " processes); conveyor's worker is `manage.py conveyor_worker`")
_PRUNE = "it tests django-tasks-db's `prune_db_task_results` command"
_LOCKS = "it tests django-tasks-db's row locking and exclusive transactions"
_COMPAT = "it tests the package's own `compat` module (which Task classes it accepts)"
_RQ = "it reads RQ's own queues, jobs or settings (`RQ_QUEUES`, job meta, RQ's job class)"

_DJANGO = "django:tasks"
_DB = "django-tasks-db:tests.tests"
_RQ_TESTS = "django-tasks-rq:tests.tests"

EVERYWHERE: dict[str, str] = {
    **_each(f"{_DJANGO}.test_custom_backend.CustomBackendTestCase",
            "test_backend_does_not_support_priority test_enqueue_async_task_on_non_async_backend"
            " test_no_enqueue test_options test_using_correct_backend", _CUSTOM),
    **_each(f"{_DJANGO}.test_custom_backend.CustomTaskTestCase",
            "test_custom_task_default_values test_custom_task_invalid_kwarg"
            " test_custom_task_with_custom_values"
            " test_custom_task_with_standard_and_custom_values", _CUSTOM),
    **_each(f"{_DJANGO}.test_dummy_backend.DummyBackendTestCase", "test_refresh_result",
            "it changes the dummy backend's in-memory result object by hand and expects"
            " refresh() to read that change; conveyor's results are read from Redis, which only"
            " a worker changes (test_refresh_result of the immediate-backend tests runs a worker"
            " instead)"),
    **_each(f"{_DJANGO}.test_dummy_backend.DummyBackendTestCase", "test_refresh_result_async",
            "as test_refresh_result: it edits the dummy backend's in-memory result by hand"),
    **_each(f"{_DJANGO}.test_dummy_backend.DummyBackendTestCase", "test_using_correct_backend",
            _CLASS.format("Django's DummyBackend")),
    **_each(f"{_DJANGO}.test_immediate_backend.ImmediateBackendTestCase",
            "test_cannot_get_result",
            "it checks that the immediate backend cannot read a result back"
            " (NotImplementedError); conveyor's can (supports_get_result), which the get_result"
            " tests check"),
    **_each(f"{_DJANGO}.test_immediate_backend.ImmediateBackendTestCase",
            "test_cannot_pass_run_after",
            "it checks that the immediate backend refuses run_after; conveyor's schedules the"
            " job (supports_defer)"),
    **_each(f"{_DJANGO}.test_immediate_backend.ImmediateBackendTestCase",
            "test_cannot_refresh_result",
            "it checks that the immediate backend cannot refresh a result; conveyor's can"),
    **_each(f"{_DJANGO}.test_immediate_backend.ImmediateBackendTestCase",
            "test_throws_keyboard_interrupt",
            "the immediate backend runs the task inside enqueue(), so a KeyboardInterrupt the"
            " task raises reaches the caller; a queue's task runs in a worker, and nothing it"
            " raises can reach the process that enqueued it"),
    **_each(f"{_DJANGO}.test_immediate_backend.ImmediateBackendTestCase",
            "test_using_correct_backend", _CLASS.format("Django's ImmediateBackend")),
    **_each(f"{_DJANGO}.test_tasks.TaskTestCase", "test_get_backend",
            "it checks which class each backend is (Django's DummyBackend and"
            " ImmediateBackend)"),
    **_each(f"{_DJANGO}.test_tasks.TaskTestCase", "test_using_correct_backend",
            "it checks which class the backend is (Django's DummyBackend)"),
    # django-tasks-rq: the backend through the Tasks API applies; RQ's own parts do not.
    **_each(f"{_RQ_TESTS}.RQBackendTestCase", "test_using_correct_backend",
            _CLASS.format("RQBackend")),
    **_each(f"{_RQ_TESTS}.RQBackendTestCase", "test_complex_return_value",
            "it expects RQ's own handling of a return value it cannot store (RQ's payload"
            " message, the class Exception); conveyor's backend fails the task with Django's"
            " TypeError, as Django's immediate backend does (Django's test_complex_return_value"
            " applies)"),
    **_each(f"{_RQ_TESTS}.RQBackendTestCase",
            "test_exception_classes_pop_empty_list_bug test_invalid_task_path"
            " test_queue_isolation test_unknown_queue_name test_uses_rq_queues_for_queue_names",
            _RQ),
    **_each(f"{_RQ_TESTS}.RQBackendTestCase", "test_rq_app_missing",
            "it checks that the backend's system check asks for the django_rq app"),
    **_each(f"{_RQ_TESTS}.CompatTestCase", "test_compat_has_django_task", _COMPAT),
    # django-tasks-db: almost all of it tests the database the backend keeps.
    **_each(f"{_DB}.DatabaseBackendTestCase", "test_using_correct_backend",
            _CLASS.format("DatabaseBackend")),
    **_each(f"{_DB}.DatabaseBackendTestCase", "test_enqueue_task test_enqueue_task_async",
            "it checks that result ids are UUID 4 and counts the SQL queries of an enqueue;"
            " conveyor's ids are its job ids (queue~random) and it makes no query"),
    **_each(f"{_DB}.DatabaseBackendTestCase", "test_get_result", _QUERIES),
    **_each(f"{_DB}.DatabaseBackendTestCase",
            "test_custom_id_function test_unknown_id_function test_postgres_db_id_function"
            " test_postgres_id_function_expression", _ID_FUNCTION),
    **_each(f"{_DB}.DatabaseBackendTestCase",
            "test_refresh_result test_refresh_result_async test_invalid_task_path"
            " test_missing_task_path test_task_name test_priority_range_check"
            " test_doesnt_wait_until_transaction_commit test_index_scan_for_ready"
            " test_run_after_tz test_run_after_null_0016_migration", _ROWS),
    **_each(f"{_DB}.DatabaseBackendTestCase", "test_database_backend_app_missing",
            "it checks that the backend's system check asks for the django_tasks_db app"),
    **_each(f"{_DB}.DatabaseBackendWorkerTestCase",
            "test_run_enqueued_task test_batch_processes_all_tasks test_failing_task"
            " test_complex_exception test_doesnt_process_different_queue"
            " test_doesnt_process_different_backend test_process_all_queues"
            " test_process_all_queues_excluding_one_queue"
            " test_exclude_queues_requires_processing_all_queues"
            " test_excluding_unknown_queue_processes_selected_queues test_run_after"
            " test_run_after_priority test_invalid_task_path test_missing_task_path"
            " test_task_import_string", _ROWS),
    **_each(f"{_DB}.DatabaseBackendWorkerTestCase", "test_no_tasks", _QUERIES),
    **_each(f"{_DB}.DatabaseBackendWorkerTestCase", "test_complex_return_value",
            "it expects the json module's message (\"is not JSON serializable\"); conveyor's"
            " backend fails the task with Django's TypeError (\"Unsupported type\"), as Django's"
            " immediate backend does (Django's test_complex_return_value applies)"),
    **_each(f"{_DB}.DatabaseBackendWorkerTestCase",
            "test_unknown_backend test_incorrect_backend test_negative_interval"
            " test_infinite_interval test_fractional_interval test_zero_interval"
            " test_negative_max_tasks test_zero_max_tasks test_too_long_worker_id"
            " test_empty_worker_id test_verbose_logging test_worker_doesnt_exit_on_failure"
            " test_worker_with_locked_rows test_max_tasks", _DB_WORKER),
    **_each(f"{_DB}.DatabaseTaskResultTestCase",
            "test_cross_connection test_locks_tasks test_locks_tasks_sqlite"
            " test_locks_tasks_filtered test_locks_tasks_filtered_sqlite test_lock_no_rows"
            " test_get_locked_with_locked_rows", _LOCKS),
    **_each(f"{_DB}.ConnectionExclusiveTranscationTestCase", "test_exclusive_transaction",
            _LOCKS),
    **_each(f"{_DB}.DatabaseBackendPruneTaskResultsTestCase",
            "test_prunes_tasks test_doesnt_prune_new_tasks test_doesnt_prune_running_tasks"
            " test_only_prunes_specified_queue test_prune_all_queues test_min_age"
            " test_failed_min_age test_failed_min_age_zero test_dry_run test_unknown_backend"
            " test_incorrect_backend test_negative_age", _PRUNE),
    **_each(f"{_DB}.DatabaseWorkerProcessTestCase",
            "test_run_subprocess test_interrupt_no_tasks test_interrupt_signals"
            " test_repeat_ctrl_c test_kill test_system_exit_task test_keyboard_interrupt_task"
            " test_multiple_workers", _DB_WORKER),
    **_each(f"{_DB}.CompatTestCase", "test_compat_has_django_task", _COMPAT),
    **_each(f"{_DB}.DBTaskResultOrderingTestCase",
            "test_higher_priority_tasks_come_first"
            " test_earlier_run_after_comes_first_given_same_priority"
            " test_earlier_enqueued_at_comes_first_given_same_priority_and_run_after", _ROWS),
    **_each(f"{_DB}.AdminTestCase",
            "test_display_run_after_returns_empty_for_date_max_or_none"
            " test_display_run_after_returns_db_value",
            "it tests django-tasks-db's admin pages for its rows"),
}

WITH_THE_BACKPORT: dict[str, str] = {
    f"{_DJANGO}.test_custom_backend":
        "the module does not import: the backport's package has no Task at its root",
    **_each(f"{_DJANGO}.test_dummy_backend.DummyBackendTestCase",
            "test_validate_disallowed_async_task",
            "the backport's BaseTaskBackend words the error \"async tasks\", Django 6.1"
            " \"async Tasks\""),
    **_each(f"{_DJANGO}.test_tasks.TaskTestCase",
            "test_pickle_task test_pickle_task_result test_unpickle_arbitrary_string"
            " test_unpickle_non_task_object", _PICKLE),
    **_each(f"{_DJANGO}.test_tasks.TaskTestCase", "test_run_after_in_decorator",
            "the backport's @task does not refuse run_after with Django 6.1's message"),
}

ON_DJANGO_6: dict[str, str] = {
    _RQ_TESTS: "it tests the backport's API (it imports `django_tasks` by name), which"
               " conveyor's backend uses only before Django 6; it runs on Django 5.2",
}


def reasons(version: tuple[object, ...]) -> dict[str, str]:
    """The tests that do not apply on Django ``version`` (``django.VERSION``)."""
    found = dict(EVERYWHERE)
    found.update(WITH_THE_BACKPORT if int(str(version[0])) < 6 else ON_DJANGO_6)
    return found
