"""Log output of conveyor's processes: plain lines for people, JSON lines for log shippers.

The loggers, and what a worker says at each level:

* ``conveyor.worker``: the banner, the way out, Redis unreachable, the loops' faults
  (Redis out of reach is said once when it starts, every 30 s while it lasts and once
  when it ends, whichever parts of the worker meet it: see :class:`OutageFilter`);
* ``conveyor.jobs``: a retry (INFO) or a dead job (WARNING), one line each;
* ``conveyor.jobs.done``: one line per job that ended otherwise (succeeded, cancelled,
  snoozed), INFO; shown by ``conveyor worker -v``.

In JSON every record is one object on one line, with ``time`` (UTC, ISO 8601), ``level``,
``logger``, ``message``, the fields the line was given (``job_id``, ``task``, ``queue``,
...) and ``traceback`` when there is one.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CHILD_FORMAT = "%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s"
FORMATS = ("text", "json")
DONE_LOGGER = "conveyor.jobs.done"
# The attributes every LogRecord has: what is not among them was passed in ``extra``.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


SPELL_GAP = 15.0  # seconds without a connection error that end an outage
SAY_EVERY = 30.0  # seconds between the lines of one outage


def _connection_error(record: logging.LogRecord) -> BaseException | None:
    from .worker.backoff import CONNECTION_ERRORS

    args = record.args if isinstance(record.args, tuple) else ()
    found = [a for a in args if isinstance(a, CONNECTION_ERRORS)]
    if record.exc_info and isinstance(record.exc_info[1], CONNECTION_ERRORS):
        found.append(record.exc_info[1])
    return found[0] if found else None


class OutageFilter(logging.Filter):
    """Turns the lines of every part of a worker that met Redis out of reach into one line
    when it starts, one every :data:`SAY_EVERY` seconds while it lasts, and one when Redis
    answers again (the first record with ``redis_back`` set, which a part of the worker
    logs when a call succeeds after failures; the others are dropped).

    :param url: the Redis URL to name (set once the application is loaded)
    """

    def __init__(self) -> None:
        super().__init__()
        self.url: str | None = None
        self.began: float | None = None
        self.last = self.said = 0.0

    def _where(self) -> str:
        from .urls import public_url

        return f" at {public_url(self.url)}" if self.url else ""

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if getattr(record, "redis_back", False):
            if self.began is None:
                return False  # no outage was said: nothing to close
            record.msg, record.args = "Redis%s answers again after %.0f s", (
                self._where(), now - self.began)
            self.began = None
            return True
        exc = _connection_error(record)
        if exc is None or record.levelno < logging.WARNING:
            return True
        from .unreachable import cause

        what, check = cause(exc)
        record.exc_info = record.exc_text = None
        if self.began is None or now - self.last > SPELL_GAP:
            self.began = self.last = self.said = now
            record.msg = "lost Redis%s: %s; check %s. Retrying until it answers"
            record.args = (self._where(), what, check)
            record.levelno, record.levelname = logging.ERROR, "ERROR"
            return True
        self.last = now
        if now - self.said < SAY_EVERY:
            return False
        self.said = now
        record.msg, record.args = "Redis%s still out of reach after %.0f s: %s", (
            self._where(), now - self.began, what)
        return True


OUTAGES = OutageFilter()  # the worker process's one, installed by configure(worker=True)


def configure(verbose: int = 0, fmt: str = "text", *, worker: bool = False,
              child: bool = False) -> None:
    """Send log records to stderr in ``fmt`` (``text`` or ``json``), replacing any earlier
    set-up.

    :param verbose: 0: warnings (a worker: also its own INFO lines, retries included);
        1: INFO (a worker: one line per job); 2 or more: DEBUG
    :param worker: set up for a worker process, whose own lines are what its operator
        watches
    :param child: a worker process under a supervisor (its text lines name the process)
    """
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(
        CHILD_FORMAT if child else TEXT_FORMAT))
    level = max(logging.DEBUG, logging.WARNING - 10 * verbose)
    logging.basicConfig(level=level, handlers=[handler], force=True)
    if worker:
        if verbose < 2:  # -vv shows every line as it comes
            handler.addFilter(OUTAGES)
        logging.getLogger("conveyor").setLevel(min(level, logging.INFO))
        logging.getLogger(DONE_LOGGER).setLevel(level)
