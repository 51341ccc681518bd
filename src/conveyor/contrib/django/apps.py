"""The Django app of conveyor's Tasks backend: add ``"conveyor.contrib.django"`` to
``INSTALLED_APPS`` for the ``conveyor_worker`` management command."""

from __future__ import annotations

from django.apps import AppConfig


class ConveyorConfig(AppConfig):  # type: ignore[misc]
    name = "conveyor.contrib.django"
    label = "conveyor_django"
    verbose_name = "conveyor"
