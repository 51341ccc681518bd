"""One log line per job outcome, once Redis has recorded it.

The line follows the reply of ``finish``, not the attempt: a retry the script turned
into a dead job (its attempts used up) is logged as dead, and an outcome refused (the
lease was lost) is not logged as the job's end. A retry is INFO and a dead job WARNING on
``conveyor.jobs``; any other end is INFO on ``conveyor.jobs.done``, which ``conveyor
worker`` shows only with ``-v`` (see :mod:`conveyor.logs`). Every line carries its fields
(``job_id``, ``task``, ``queue``, ``outcome``, ``attempt``) for JSON output.
"""

from __future__ import annotations

import logging

from .. import keys as keyspace
from ..scripts import calls
from .executor import Held

jobs_log = logging.getLogger("conveyor.jobs")
done_log = logging.getLogger("conveyor.jobs.done")

ENDS = {calls.FINISH_SUCCEEDED: "succeeded", calls.FINISH_RETRYING: "retrying",
        calls.FINISH_DEAD: "dead", calls.FINISH_CANCELLED: "cancelled",
        calls.FINISH_SNOOZED: "snoozed", calls.FINISH_EXPIRED: "expired",
        calls.FINISH_SUSPENDED[0]: "suspended"}


def printable(text: str) -> str:
    """``text`` as a log line can carry it: a task name read from a mangled record keeps
    its undecodable bytes as surrogates, which no log handler could write."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def first_line(error: bytes | str) -> str:
    text = error.decode(errors="replace") if isinstance(error, bytes) else error
    return text.strip().splitlines()[0] if text.strip() else "no error text"


def log_outcome(queue: str, outcome: calls.Outcome, code: int, held: Held | None) -> None:
    """Log what became of ``outcome`` (``held``: its run, which names the task)."""
    end = ENDS.get(code)
    if end is None:
        return  # refused: the job is another worker's now, which will say how it ends
    if end not in ("dead", "retrying") and not done_log.isEnabledFor(logging.INFO):
        return  # the common case, on the hot path: nothing to build
    task = printable(held.leased.task) if held is not None else "?"
    attempt = held.leased.attempts if held is not None else 0
    most = held.leased.max_attempts if held is not None else 0
    job_id = printable(keyspace.job_id(queue, outcome.short_id))
    fields = {"job_id": job_id, "task": task, "queue": queue, "outcome": end,
              "attempt": attempt, "max_attempts": most}
    if end == "dead":
        error = first_line(outcome.payload)
        jobs_log.warning("job %s (%s) is dead after attempt %d of %d: %s", job_id, task,
                         attempt, most, error, extra={**fields, "error": error})
    elif end == "retrying":
        error = first_line(outcome.payload)
        jobs_log.info("job %s (%s) failed attempt %d of %d, retrying in %.1f s: %s", job_id,
                      task, attempt, most, outcome.retry_delay_ms / 1000, error,
                      extra={**fields, "error": error})
    else:
        done_log.info("job %s (%s) %s on attempt %d of %d", job_id, task, end, attempt, most,
                      extra=fields)


def log_dead_at_fetch(queue: str, short_ids: list[str]) -> None:
    """Jobs a fetch found dead: their leases lapsed once too often (their worker died with
    them each time), or their records could not run."""
    for short in short_ids:
        job_id = keyspace.job_id(queue, short)
        jobs_log.warning("job %s is dead: it could not run (its workers died with it, or its"
                         " record is broken); `conveyor job %s` shows why", job_id, job_id,
                         extra={"job_id": job_id, "queue": queue, "outcome": "dead"})
