"""What an async poll does differently from a sync one (hand-written, as its twin
``_sync/io.py``): how it reads and how it waits."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["Read", "sleep"]

S = TypeVar("S")
#: what a poll calls for the current state of what it waits for
Read = Callable[[], Awaitable[S]]
sleep = asyncio.sleep
