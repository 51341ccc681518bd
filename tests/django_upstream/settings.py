"""Settings of the upstream run: Django's test package ``tasks`` as an installed app (as
Django's ``runtests.py`` installs it) and conveyor as every backend, on the private
redis-server the runner started (``CONVEYOR_REDIS_URL``)."""

import importlib.util
import os

SECRET_KEY = "upstream-tests-only-not-secret"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "conveyor.contrib.django", "tasks"]
if importlib.util.find_spec("django.tasks") is None:
    INSTALLED_APPS.append("django_tasks")  # Django < 6: the django-tasks backport
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}

TASKS = {"default": {"BACKEND": "conveyor.contrib.django.ConveyorBackend",
                     "OPTIONS": {"url": os.environ.get("CONVEYOR_REDIS_URL",
                                                       "redis://127.0.0.1:6379/0"),
                                 "namespace": "upstream"}}}
