"""The SQL table of finished attempts, and how a stream event becomes a row.

One row per event of the stream: a job that finished (succeeded or dead), with the
attempt it finished on and the timings of that attempt. Rows are keyed by job id, attempt
and finish time: a replayed event inserts nothing, while a dead job given fresh attempts
by ``dead requeue`` (its attempt count starts again) still gets a row of its own.

``trace_id`` is the OpenTelemetry trace id of the enqueue (32 hex digits) of a job enqueued
with ``conveyor.contrib.otel`` instrumentation, NULL otherwise. Columns added by later
versions are added to a table an older version created (:func:`add_missing_columns`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from .. import keys as keyspace

DEFAULT_TABLE = "conveyor_jobs"
KEY_COLUMNS = ("job_id", "attempt", "finished_at")


def jobs_table(metadata: sa.MetaData, name: str = DEFAULT_TABLE) -> sa.Table:
    """Define the table (on ``metadata``); :meth:`sa.MetaData.create_all` creates it."""
    return sa.Table(
        name, metadata,
        sa.Column("job_id", sa.String(200), primary_key=True),
        sa.Column("attempt", sa.Integer, primary_key=True),
        sa.Column("finished_at", sa.Float, primary_key=True),
        sa.Column("queue", sa.String(200), nullable=False),
        sa.Column("task", sa.String(200), nullable=False),
        sa.Column("tenant", sa.String(200)),
        sa.Column("priority", sa.Integer),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("enqueued_at", sa.Float),
        sa.Column("run_at", sa.Float),
        sa.Column("started_at", sa.Float),
        sa.Column("wait_time", sa.Float),
        sa.Column("run_time", sa.Float),
        sa.Column("error", sa.Text),
        sa.Column("stream_id", sa.String(40)),
        sa.Column("trace_id", sa.String(32)),
        sa.Index(f"ix_{name}_task_finished", "task", "finished_at"),
        sa.Index(f"ix_{name}_finished", "finished_at"),
        sa.Index(f"ix_{name}_trace", "trace_id"),
    )


# Nullable columns added since the table's first version, with the indexes that go with
# them: a sink adds those missing from an existing table when it starts.
ADDED_COLUMNS = {"trace_id": "ix_{name}_trace"}


def missing_columns(conn: sa.Connection, table: sa.Table) -> list[str]:
    """The columns of :data:`ADDED_COLUMNS` that ``table`` lacks in the database."""
    present = {c["name"] for c in sa.inspect(conn).get_columns(table.name)}
    return [column for column in ADDED_COLUMNS if column not in present]


def add_missing_columns(conn: sa.Connection, table: sa.Table) -> list[str]:
    """Add to ``table`` in the database the columns of :data:`ADDED_COLUMNS` it lacks (a
    table created by an older version), and their indexes. Returns the columns added."""
    added = missing_columns(conn, table)
    for column in added:
        index_name = ADDED_COLUMNS[column]
        preparer = conn.dialect.identifier_preparer
        kind = table.c[column].type.compile(dialect=conn.dialect)
        conn.execute(sa.text(f"ALTER TABLE {preparer.format_table(table)} "
                             f"ADD COLUMN {preparer.quote(column)} {kind}"))
        wanted = index_name.format(name=table.name)
        for index in table.indexes:
            if index.name == wanted:
                index.create(conn, checkfirst=True)
    return added


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


def _float(value: str) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


def row_from_event(queue: str, stream_id: str, fields: Mapping[Any, Any]) -> dict[str, Any]:
    """A table row from one events-stream entry (as XREADGROUP returns its fields)."""
    get = {_text(k): _text(v) for k, v in fields.items()}.get
    enqueued_at, run_at = _float(get("enqueued_at", "")), _float(get("run_at", ""))
    started_at, finished_at = _float(get("started_at", "")), _float(get("finished_at", ""))
    wait_time = run_time = None
    if started_at is not None and enqueued_at is not None:
        wait_time = max(0.0, started_at - max(enqueued_at, run_at or enqueued_at))
    if started_at is not None and finished_at is not None:
        run_time = max(0.0, finished_at - started_at)
    return {
        "job_id": keyspace.job_id(queue, get("id", "")),
        "attempt": int(_float(get("attempts", "")) or 0),
        "finished_at": finished_at or 0.0,
        "queue": queue,
        "task": get("task", ""),
        "tenant": get("tenant") or None,
        "priority": int(_float(get("priority", "")) or 5),
        "state": get("state", ""),
        "enqueued_at": enqueued_at,
        "run_at": run_at,
        "started_at": started_at,
        "wait_time": wait_time,
        "run_time": run_time,
        "error": get("error") or None,
        "stream_id": stream_id,
        "trace_id": get("trace") or None,
    }
