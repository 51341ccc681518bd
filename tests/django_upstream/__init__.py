"""Django's own tests of the Tasks framework (``tests/tasks/`` of Django's source
distribution, fetched from PyPI at run time by ``scripts/django_upstream.py``), run
unchanged against conveyor's backend with a real Redis and a real conveyor worker.

Only two things differ from Django's own run: the settings (``settings.py``; every
``TASKS`` a test sets is pointed at conveyor by ``backends.py``) and the step that runs
a task (``backends.RunAtOnce``: where Django's immediate backend runs a task inside
``enqueue``, a conveyor worker runs the stored job before ``enqueue`` returns). The tests
that cannot apply to a queue backend are listed, each with its reason, in
``not_applying.py``; docs/django.md shows the same list.
"""
