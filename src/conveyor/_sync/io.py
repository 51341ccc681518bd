"""What a sync poll does differently from an async one (hand-written, as its twin
``_async/io.py``): how it reads and how it waits."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["Read", "sleep"]

S = TypeVar("S")
#: what a poll calls for the current state of what it waits for
Read = Callable[[], S]
sleep = time.sleep
