"""Log output of conveyor's processes: plain lines for people, JSON lines for log shippers.

The loggers, and what a worker says at each level:

* ``conveyor.worker``: the banner, the way out, Redis unreachable, the loops' faults;
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
        logging.getLogger("conveyor").setLevel(min(level, logging.INFO))
        logging.getLogger(DONE_LOGGER).setLevel(level)
