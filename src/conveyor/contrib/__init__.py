"""Integrations with other projects, each importable only when its extra is installed:
``conveyor.contrib.otel`` (``conveyor[otel]``) and ``conveyor.contrib.django``
(``conveyor[django]``)."""
