# Generated from ../_async/poll.py by scripts/generate_sync.py: do not edit;
# change the async source and run that script again.
"""Waiting for a job or a workflow to finish: the one poller behind :meth:`Job.result
<conveyor.Job.result>` and :meth:`WorkflowHandle.result
<conveyor.workflow.WorkflowHandle.result>`, and their async twins.

Written once: ``_async/poll.py`` is the source and ``_sync/poll.py`` is generated from it
(``scripts/generate_sync.py``; ``make lint`` fails when it drifts).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from ..errors import ResultTimeout
from .io import Read, sleep

S = TypeVar("S")
R = TypeVar("R")
GROWTH = 1.5  # each pause is this much longer than the one before, up to the caller's most


def poll(read: Read[S], outcome: Callable[[S], tuple[bool, R]], what: str,
               timeout: float | None, first: float, most: float) -> R:
    """Read the state with ``read()`` until ``outcome(state)`` says it is done, then return
    its value; ``outcome`` raises for an ending that is no result (a dead or cancelled
    job). The pauses grow from ``first`` seconds to ``most``, the last one cut short at
    the deadline.

    :param what: names what is waited for in the timeout's message (``"job q~abc"``)
    :param timeout: seconds to wait at most; ``None`` waits for ever
    :raises ResultTimeout: not done when ``timeout`` seconds have passed
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = first
    while True:
        done, value = outcome(read())
        if done:
            return value
        if deadline is None:
            sleep(pause)
        else:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ResultTimeout(f"{what} did not finish within {timeout} s")
            sleep(min(pause, left))
        pause = min(pause * GROWTH, most)
