"""Durable waits: a running job that sleeps, waits for a signal or for a child job without
holding a worker slot (``ctx.sleep``, ``ctx.wait_for``, ``ctx.child``).

The replay rule: the first time a run reaches a wait whose outcome is not known yet, the
run ends and the job is *suspended* (no slot, no lease, no attempt used). When the wait is
over, the job is ready again and its task runs from the top; every step, sleep, wait and
child already over returns its recorded outcome at once, so the code after them runs once.

Each wait's outcome is recorded on the job record as ``w:<name>``, by whichever learns it
first (``scripts/include/suspend.lua``), one tagged value:

* ``t`` — a sleep is over;
* ``s`` + payload — the signal's encoded payload; ``x`` — the wait for it timed out;
* ``o`` + result — the child succeeded with this encoded result; ``d`` + child id, a
  newline, its error — the child is dead; ``c`` + child id, a newline, the reason — the
  child was cancelled.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from . import keys as keyspace
from .encryption import open_payload
from .errors import JobCancelled, JobFailed, LeaseLost, WaitTimeout
from .scripts import calls
from .scripts.resend import resend

if TYPE_CHECKING:
    from .app import Conveyor
    from .context import Lease

__all__ = ["DurableWaits", "Suspended", "child_outcome", "due_now"]

MAX_NAME_BYTES = 200


class Suspended(BaseException):
    """Ends a run at a durable wait that is not over; the worker suspends the job.

    A ``BaseException``, like ``asyncio.CancelledError``: a task's ``except Exception``
    must not swallow the end of its own run."""


def child_outcome(state: bytes, result: bytes | None, error: bytes | None,
                  child_id: str) -> bytes:
    """The tagged outcome a parent records for its child that ended in ``state``."""
    if state == b"succeeded":
        return b"o" + (result or b"")
    tag = b"c" if state == b"cancelled" else b"d"  # dead or expired: JobFailed
    return tag + child_id.encode() + b"\n" + (error or b"")


def due_now(wt: bytes | None) -> bytes | None:
    """A wait's 'wt' field with its end in time moved to the past (for
    ``conveyor.testing.drain``); None for a wait without one."""
    parts = (wt or b"").split(b" ", 3)
    if len(parts) != 4 or parts[1] == b"-":
        return None
    return b" ".join((parts[0], b"0", parts[2], parts[3]))


class DurableWaits:
    """The durable waits of :class:`conveyor.JobContext` (which provides what is read
    here)."""

    _app: Conveyor
    _held: Lease
    _waits_seen: set[str]
    id: str

    @property
    def _short_id(self) -> str:
        return self._held.leased.short_id

    @property
    def _keys(self) -> keyspace.QueueKeys:
        return self._app.keys(self._held.queue)

    def _claim_wait(self, name: str) -> None:
        if not isinstance(name, str) or not name or len(name.encode()) > MAX_NAME_BYTES:
            raise ValueError(f"a wait's name must be a non-empty str of at most"
                             f" {MAX_NAME_BYTES} bytes: {name!r}")
        seen = self._waits_seen
        if name in seen:
            raise ValueError(f"wait {name!r} was reached twice in one run of job {self.id}:"
                             " each sleep, wait and child of a job needs a name of its own")
        seen.add(name)

    def _wait_recorded(self, name: str) -> bytes | None:
        raw = self._app.redis.hget(self._keys.job(self._short_id), "w:" + name)
        return raw if isinstance(raw, bytes) else None

    def _wait(self, kind: str, name: str, ms: float | None, child: str = "") -> tuple[bool, bytes]:
        """(True, the recorded outcome) or (False, the child id the wait names)."""
        leased = self._held.leased
        call = calls.wait(self._keys, leased.short_id, leased.token, kind, name, ms, child)
        # Sent until answered while the lease may hold: a wait described but never
        # answered would be described again by the same call (the transport keeps replies).
        code, value = resend(lambda: self._app.scripts.run(call), leased.visibility_ms / 1000)
        if code == calls.WAIT_RECORDED:
            return True, value
        if code == calls.WAIT_SUSPEND:
            return False, value
        if code == calls.WAIT_CANCELLING or self._held.cancel_requested:
            self._held.cancel_requested = True
            raise LeaseLost(self.id, f"wait {name!r} not recorded: the job is being cancelled")
        raise LeaseLost(self.id, f"wait {name!r} not recorded: this run lost its lease")

    def sleep(self, name: str, seconds: float) -> None:
        """Suspend the job for ``seconds`` (the first time this run reaches it); once they
        passed, the task runs again and this returns at once.

        :param name: names this sleep within the job
        :raises ValueError: ``seconds`` is not a number >= 0, or ``name`` was used before
            in this run
        """
        length = float(seconds)
        if math.isnan(length) or length < 0 or math.isinf(length):
            raise ValueError(f"sleep {name!r}: seconds must be a finite number >= 0,"
                             f" got {seconds!r}")
        self._claim_wait(name)
        if self._wait_recorded(name) is not None:
            return
        over, _ = self._wait("time", name, length * 1000)
        if not over:
            raise Suspended(f"sleep {name!r}")

    def wait_for(self, name: str, timeout: float | None = None) -> Any:
        """The payload of signal ``name`` (``job.signal(name, payload)``): at once if it was
        sent already, else the job is suspended until it arrives.

        :param timeout: seconds to wait at most, counted from the first time a run reached
            this wait; ``None`` waits for ever
        :raises WaitTimeout: no such signal arrived in time (recorded: a later run of the
            task raises it here again)
        """
        if timeout is not None:
            timeout = float(timeout)
            if math.isnan(timeout) or timeout < 0:
                raise ValueError(f"wait_for {name!r}: timeout must be a number >= 0 or None,"
                                 f" got {timeout!r}")
        self._claim_wait(name)
        value = self._wait_recorded(name)
        if value is None:
            over, value = self._wait("signal", name,
                                     None if timeout is None or math.isinf(timeout)
                                     else timeout * 1000)
            if not over:
                raise Suspended(f"wait for signal {name!r}")
        if value[:1] == b"x":
            raise WaitTimeout(self.id, name)
        return self._app.codec.decode_result(value[1:])

    def child(self, name: str, task: Any, *args: Any, **kwargs: Any) -> Any:
        """Enqueue ``task(*args, **kwargs)`` once as this job's child (``task`` may carry
        options, such as ``send.options(queue="emails")``), suspend until it ends, and
        return its result.

        :raises JobFailed: the child is dead
        :raises JobCancelled: the child was cancelled
        """
        from . import producer
        from .task import Task

        if not isinstance(task, Task):
            raise TypeError(f"child {name!r}: expected a task (or task.options(...)),"
                            f" got {type(task).__name__}")
        self._claim_wait(name)
        value = self._wait_recorded(name)
        if value is None:
            planned = keyspace.job_id(task.queue, producer.new_short_id())
            over, value = self._wait("child", name, None, planned)
            if not over:
                queue, short_id = keyspace.split_job_id(value.decode())
                producer.enqueue_child(task.options(queue=queue), args, kwargs, short_id,
                                       self.id)
                raise Suspended(f"child {name!r}")
        return self._child_result(value, task.name)

    def _child_result(self, value: bytes, task: str) -> Any:
        tag, rest = value[:1], value[1:]
        if tag == b"o":  # an encrypted child's result is sealed for the child: it opens here
            return self._app.codec.decode_result(
                open_payload(self._app.encryption, rest, task, "result"))
        child_id, _, detail = rest.decode(errors="replace").partition("\n")
        if tag == b"d":
            raise JobFailed(child_id, detail or None)
        raise JobCancelled(child_id)
