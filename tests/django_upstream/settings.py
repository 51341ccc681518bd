"""Settings of the upstream runs: the suite's test package as an installed app (as
Django's ``runtests.py`` installs ``tasks``; django-tasks-db's tests need its app and
models too) and conveyor as every backend, on the private redis-server the runner
started (``CONVEYOR_REDIS_URL``)."""

import importlib.util
import os

SECRET_KEY = "upstream-tests-only-not-secret"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
SUITE = os.environ.get("UPSTREAM_SUITE", "django")  # which suite runs (run.py)
INSTALLED_APPS = ["django.contrib.contenttypes", "conveyor.contrib.django"]
INSTALLED_APPS += {"django": ["tasks"],
                   "django-tasks-db": ["django.contrib.admin", "django.contrib.auth",
                                       "django.contrib.messages", "django.contrib.sessions",
                                       "django_tasks_db"]}.get(SUITE, [])
if importlib.util.find_spec("django.tasks") is None:
    INSTALLED_APPS.append("django_tasks")  # Django < 6: the django-tasks backport
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}

TASKS = {"default": {"BACKEND": "conveyor.contrib.django.ConveyorBackend",
                     "QUEUES": ["default", "queue-1"],
                     "OPTIONS": {"url": os.environ.get("CONVEYOR_REDIS_URL",
                                                       "redis://127.0.0.1:6379/0"),
                                 "namespace": "upstream"}}}
# django-tasks-rq's tests set up django_rq's own connections before each test: here they
# reach the run's private redis-server with redis-py (see run.real_redis_for_rq).
RQ_QUEUES = {name: {"URL": os.environ.get("CONVEYOR_REDIS_URL", "redis://127.0.0.1:6379/0")}
             for name in ("default", "queue-1")}
