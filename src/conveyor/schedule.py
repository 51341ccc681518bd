"""Periodic jobs: cron schedules that fire once per tick however many workers run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .task import Task


@dataclass(frozen=True)
class Periodic:
    """A task fired on a cron schedule (UTC)."""

    task: Task[Any, Any]
    cron: str
