"""The upstream tests of Django's Tasks framework, run unchanged against conveyor's
backend with a real Redis and a real conveyor worker: Django's own (``tests/tasks/`` of
its source distribution) and the backend tests of django-tasks-rq and django-tasks-db
(``tests/tests.py`` of theirs), all fetched from PyPI at run time by
``scripts/django_upstream.py``.

Only two things differ from their own runs:

- the settings (``settings.py``): every ``TASKS`` a test sets is pointed at conveyor by
  ``backends.py``; the backends' tests import their tasks as ``tests.tasks``, a module
  their source distributions do not ship, which ``backend_tasks.py`` provides;
- the step that runs a task: where Django's immediate backend runs it inside
  ``enqueue`` (``backends.RunAtOnce``), and where the backends' tests call their
  ``run_worker`` (``run.run_a_conveyor_worker``), a real conveyor worker runs the stored
  job.

The tests that do not apply to conveyor's backend are listed, each with its reason, in
``not_applying.py``; docs/django.md shows the same list.
"""
