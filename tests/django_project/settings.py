"""Settings of the test project: the backend's url and namespace come from the
environment, so a worker subprocess serves the namespace its test uses; the test process
overrides ``TASKS`` per test."""

import importlib.util
import os

SECRET_KEY = "tests-only-not-secret"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "conveyor.contrib.django",
    "django_project.apps.ProjectConfig",
]
if importlib.util.find_spec("django.tasks") is None:
    INSTALLED_APPS.append("django_tasks")  # Django < 6: the django-tasks package

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                         "NAME": os.environ.get("TEST_PROJECT_DB", ":memory:")}}
LOGGING_CONFIG = None


def tasks_setting(url: str, namespace: str, **options: object) -> dict[str, object]:
    """``TASKS`` for one conveyor backend on ``url`` and ``namespace``."""
    return {"default": {"BACKEND": "conveyor.contrib.django.ConveyorBackend",
                        "QUEUES": ["default", "other"],
                        "OPTIONS": {"url": url, "namespace": namespace, "backoff": 0.05,
                                    **options}}}


TASKS = tasks_setting(os.environ.get("CONVEYOR_REDIS_URL", "redis://127.0.0.1:6379/0"),
                      os.environ.get("CONVEYOR_NAMESPACE", "conveyor"))
