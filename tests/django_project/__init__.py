"""A Django project for the tests of conveyor's Tasks backend, set up in the test process
(``tests/django_setup.py``) and in worker subprocesses (``DJANGO_SETTINGS_MODULE``)."""
