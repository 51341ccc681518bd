"""Settings of the example project: SQLite, and Django Tasks through conveyor."""

import importlib.util
import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "example-only-not-secret"
DEBUG = True
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "mysite.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "conveyor.contrib.django",  # python manage.py conveyor_worker
    "shop",
]
if importlib.util.find_spec("django.tasks") is None:
    INSTALLED_APPS.append("django_tasks")  # Django < 6: the django-tasks package

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SHOP_DB", str(BASE_DIR / "shop.sqlite3")),
    }
}

TASKS = {
    "default": {
        "BACKEND": "conveyor.contrib.django.ConveyorBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            "url": os.environ.get("CONVEYOR_REDIS_URL", "redis://127.0.0.1:6379/0"),
            "namespace": os.environ.get("CONVEYOR_NAMESPACE", "conveyor"),
            "retries": 1,  # one more run after a failure before the result is FAILED
            "backoff": 0.1,
            "enqueue_on_commit": True,  # enqueue in atomic(): stored once it commits
        },
    }
}
