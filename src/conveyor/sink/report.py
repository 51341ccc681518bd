"""``conveyor report``: jobs, mean and p95 of wait and run time per task type, from SQL.

Percentiles are computed in the database by nearest rank (ORDER BY ... OFFSET), which
SQLite and PostgreSQL both run, so no row leaves the database but the answer.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass

import sqlalchemy as sa

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass(frozen=True, slots=True)
class TaskReport:
    """One task type over the period: jobs finished and their timings (seconds; the
    timings are those of each job's last attempt)."""

    task: str
    jobs: int
    succeeded: int
    dead: int
    retries: int  # attempts beyond the first, summed over the jobs
    wait_mean: float | None
    wait_p95: float | None
    run_mean: float | None
    run_p95: float | None


def parse_since(text: str, now: float) -> float:
    """``7d``, ``24h``, ``30m``, ``90s``, ``2w`` ago, or an ISO date/time (UTC if naive).

    :raises ValueError: neither form
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if match:
        return now - float(match.group(1)) * UNITS[match.group(2)]
    when = dt.datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def _p95(conn: sa.Connection, column: sa.ColumnElement[float], where: sa.ColumnElement[bool],
         n: int) -> float | None:
    if n == 0:
        return None
    rank = max(1, math.ceil(0.95 * n))
    query = sa.select(column).where(where, column.is_not(None)).order_by(column) \
        .offset(rank - 1).limit(1)
    value = conn.execute(query).scalar()
    return float(value) if value is not None else None


def report(engine: sa.Engine, table: sa.Table, since: float | None = None) -> list[TaskReport]:
    """Per task type, jobs finished since ``since`` (epoch s; None: all), sorted."""
    c = table.c
    window = sa.true() if since is None else c.finished_at >= since
    counts = sa.select(
        c.task,
        sa.func.count(),
        sa.func.sum(sa.case((c.state == "succeeded", 1), else_=0)),
        sa.func.sum(sa.case((c.state == "dead", 1), else_=0)),
        sa.func.sum(sa.case((c.attempt > 1, c.attempt - 1), else_=0)),
        sa.func.avg(c.wait_time), sa.func.count(c.wait_time),
        sa.func.avg(c.run_time), sa.func.count(c.run_time),
    ).where(window).group_by(c.task).order_by(c.task)
    out = []
    with engine.connect() as conn:
        for task, jobs, ok, dead, retries, wmean, wn, rmean, rn in conn.execute(counts):
            mine = sa.and_(window, c.task == task)
            out.append(TaskReport(
                task=task, jobs=int(jobs), succeeded=int(ok or 0), dead=int(dead or 0),
                retries=int(retries or 0),
                wait_mean=float(wmean) if wmean is not None else None,
                wait_p95=_p95(conn, c.wait_time, mine, int(wn)),
                run_mean=float(rmean) if rmean is not None else None,
                run_p95=_p95(conn, c.run_time, mine, int(rn)),
            ))
    return out
