"""Finding the application a command line names: ``MODULE:APP``.

The CLI, the supervisor and its child processes all load the user's app from the same
spec, so they share this one loader and its error messages. It imports nothing of the
CLI: a supervisor's new child starts serving without loading click.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING

from .errors import ConfigurationError

if TYPE_CHECKING:
    from .app import Conveyor

DEFAULT_NAMES = ("app", "conveyor")
"""Attributes looked up when the spec names a module only."""


def import_app(spec: str) -> Conveyor:
    """Import ``MODULE:APP`` (the current directory is importable) and return the app;
    without ``:APP``, the module's ``app`` or ``conveyor``.

    :raises ConfigurationError: the spec has no module, the module cannot be imported, or
        it has no :class:`~conveyor.Conveyor` under the name looked up
    """
    from .app import Conveyor

    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise ConfigurationError(f"expected MODULE:APP, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from exc
    candidates = [attr] if attr else list(DEFAULT_NAMES)
    for name in candidates:
        value = getattr(module, name, None)
        if isinstance(value, Conveyor):
            return value
    raise ConfigurationError(
        f"{module_name!r} has no conveyor.Conveyor named {' or '.join(candidates)!r}")
