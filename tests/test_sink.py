"""The analytics sink: events stream -> SQL, exactly one row per attempt, outages survived."""

from __future__ import annotations

import contextlib
import socket
import threading
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

import conveyor
from conveyor.scripts import calls
from conveyor.sink import Sink, schema, stream_events
from conveyor.sink.report import parse_since, report
from conveyor.sink.schema import jobs_table, row_from_event
from helpers import running_worker, wait_until

PG_HOST, PG_PORT = "127.0.0.1", 5432
PG_URL = "postgresql+psycopg://postgres@{host}:{port}/test"


def postgres_up() -> bool:
    with contextlib.suppress(OSError), socket.create_connection((PG_HOST, PG_PORT), 1):
        return True
    return False


class Proxy:
    """A TCP relay in front of PostgreSQL that can be cut and restored on the same port."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self.conns: list[socket.socket] = []
        self.listener: socket.socket | None = None
        self.lock = threading.Lock()
        self.up()

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        self.port = listener.getsockname()[1]
        listener.listen(16)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        """Refuse new connections and break every open one, as a dead server would."""
        with self.lock:
            listener, self.listener = self.listener, None
            conns, self.conns = self.conns, []
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
            listener.close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            with self.lock:
                self.conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def table_name() -> str:
    return f"jobs_{uuid.uuid4().hex[:10]}"


def make_tasks(app: conveyor.Conveyor) -> dict[str, conveyor.Task]:  # type: ignore[type-arg]
    failed_once: set[int] = set()
    for queue in ("default", "other"):  # a sink has read them before: their events are on
        stream_events(app, queue)

    @app.task(name="ok")
    def ok(n: int) -> int:
        return n

    @app.task(name="flaky", retries=2, backoff=0.01)
    def flaky(n: int) -> int:
        if n not in failed_once:
            failed_once.add(n)
            raise RuntimeError("first attempt fails")
        return n

    @app.task(name="doomed", retries=0, queue="other")
    def doomed(n: int) -> None:
        raise RuntimeError("never works")

    return {"ok": ok, "flaky": flaky, "doomed": doomed}


def run_jobs(app: conveyor.Conveyor, jobs: list[conveyor.Job]) -> None:
    with running_worker(app, concurrency=16):
        wait_until(lambda: all(j.info().state.finished for j in jobs), 30, 0.05, "jobs done")


def count_rows(engine: sa.Engine, table: str) -> tuple[int, int]:
    with engine.connect() as conn:
        total = conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
        distinct = conn.execute(sa.text(
            f"SELECT count(*) FROM (SELECT DISTINCT job_id, attempt FROM {table}) d")).scalar_one()
    return int(total), int(distinct)


def test_sqlite_sink_writes_one_row_per_attempt_and_replays_insert_nothing(
    app: conveyor.Conveyor, tmp_path: Path, table_name: str
) -> None:
    tasks = make_tasks(app)
    jobs = (tasks["ok"].enqueue_many([(n,) for n in range(20)])
            + tasks["flaky"].enqueue_many([(n,) for n in range(5)])
            + tasks["doomed"].enqueue_many([(n,) for n in range(3)]))
    run_jobs(app, jobs)
    db = f"sqlite:///{tmp_path / 'jobs.db'}"
    sink = Sink(app, db, table=table_name, consumer="c1")
    assert sink.run(until_idle=True) == 20 + 5 + 3  # one event per finished job
    assert count_rows(sink.engine, table_name) == (28, 28)
    assert sink.lag() == {"default": 0, "other": 0}
    # Replay every event from the start of the streams: nothing is inserted twice.
    for queue in ("default", "other"):
        app.redis.xgroup_setid(app.keys(queue).events, sink.group, "0")
    assert sink.run(until_idle=True) == 28
    assert count_rows(sink.engine, table_name) == (28, 28)
    rows = {r.task: r for r in report(sink.engine, sink.table)}
    assert (rows["ok"].jobs, rows["ok"].succeeded, rows["ok"].retries) == (20, 20, 0)
    assert (rows["flaky"].jobs, rows["flaky"].retries, rows["flaky"].succeeded) == (5, 5, 5)
    assert rows["doomed"].dead == 3 and rows["ok"].run_p95 is not None
    info = jobs[0].info()
    with sink.engine.connect() as conn:
        row = conn.execute(sa.select(sink.table).where(sink.table.c.job_id == info.id)).one()
    assert row.wait_time == pytest.approx(info.wait_time) and row.state == "succeeded"
    assert report(sink.engine, sink.table, since=info.finished_at + 3600) == []
    sink.close()


def test_pending_events_are_picked_up_after_a_crash(
    app: conveyor.Conveyor, tmp_path: Path, table_name: str
) -> None:
    tasks = make_tasks(app)
    run_jobs(app, tasks["ok"].enqueue_many([(n,) for n in range(30)]))
    db = f"sqlite:///{tmp_path / 'jobs.db'}"
    Sink(app, db, table=table_name, queues=["default"])._ensure()
    events = app.keys("default").events
    # A sink that read 10 events and died before acknowledging them ...
    app.redis.xreadgroup("conveyor-sink", "crashed", {events: ">"}, count=10)
    # ... and one that read 10, committed them and died before acknowledging.
    read = app.redis.xreadgroup("conveyor-sink", "wrote", {events: ">"}, count=10)
    writer = Sink(app, db, table=table_name, queues=["default"], consumer="wrote")
    with writer.engine.begin() as conn:
        writer._insert_new(conn, [row_from_event("default", i.decode(), f)
                                  for i, f in read[0][1]])
    assert writer.step(block=False) == 10  # its own pending first, on restart ...
    assert count_rows(writer.engine, table_name) == (10, 10)  # ... inserted nothing twice
    other = Sink(app, db, table=table_name, queues=["default"], consumer="new", claim_idle=0)
    assert other.run(until_idle=True) == 20  # the crashed consumer's 10, then the last 10
    assert count_rows(other.engine, table_name) == (30, 30)
    assert app.redis.xpending(events, "conveyor-sink")["pending"] == 0


@pytest.mark.skipif(not postgres_up(), reason="PostgreSQL is not running on 127.0.0.1:5432")
def test_sink_survives_postgres_unreachable_and_inserts_nothing_twice(
    app: conveyor.Conveyor, table_name: str
) -> None:
    tasks = make_tasks(app)
    proxy = Proxy((PG_HOST, PG_PORT))
    direct = sa.create_engine(PG_URL.format(host=PG_HOST, port=PG_PORT))
    sink = Sink(app, PG_URL.format(host="127.0.0.1", port=proxy.port), table=table_name,
                queues=["default"], batch=50, block=0.2)
    thread = threading.Thread(target=sink.run, daemon=True)
    try:
        run_jobs(app, tasks["ok"].enqueue_many([(n,) for n in range(100)]))
        thread.start()
        wait_until(lambda: sink.written == 100, 30, 0.05, "first 100 rows")
        proxy.down()
        run_jobs(app, tasks["ok"].enqueue_many([(n,) for n in range(150)]))
        wait_until(lambda: sink.failures >= 2, 30, 0.05, "the sink to notice the outage")
        assert count_rows(direct, table_name) == (100, 100)
        assert sink.lag()["default"] == 150  # kept in Redis, unacknowledged
        proxy.up()
        wait_until(lambda: sink.written == 250, 60, 0.05, "rows after the outage")
        assert count_rows(direct, table_name) == (250, 250)
        assert sink.lag()["default"] == 0
        # A full replay after the outage still inserts nothing twice.
        app.redis.xgroup_setid(app.keys("default").events, sink.group, "0")
        wait_until(lambda: sink.written == 500, 60, 0.05, "replayed events")
        assert count_rows(direct, table_name) == (250, 250)
    finally:
        sink.stop()
        thread.join(30)
        proxy.down()
        sink.close()
        with direct.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table_name}"))
        direct.dispose()


def test_parse_since() -> None:
    assert parse_since("7d", 1_000_000.0) == 1_000_000.0 - 7 * 86400
    assert parse_since("90s", 100.0) == 10.0
    assert parse_since("2026-01-01", 0) == 1767225600.0
    with pytest.raises(ValueError):
        parse_since("last tuesday", 0)


def test_row_from_event_reads_the_trace_id() -> None:
    fields = {b"id": b"a", b"task": b"t", b"state": b"succeeded", b"attempts": b"1",
              b"finished_at": b"10.0"}
    assert row_from_event("q", "1-0", fields)["trace_id"] is None
    fields[b"trace"] = b"4bf92f3577b34da6a3ce929d0e0e4736"
    assert row_from_event("q", "1-0", fields)["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"


def old_table(name: str) -> sa.Table:
    """The table as a version without trace ids created it."""
    new = jobs_table(sa.MetaData(), name)
    return sa.Table(name, sa.MetaData(), *(
        sa.Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
        for c in new.c if c.name != "trace_id"))


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_table_made_before_trace_ids_gets_the_column(
    app: conveyor.Conveyor, tmp_path: Path, table_name: str, backend: str
) -> None:
    if backend == "postgresql" and not postgres_up():
        pytest.skip("no PostgreSQL on 127.0.0.1:5432")
    db = (f"sqlite:///{tmp_path / 'old.db'}" if backend == "sqlite"
          else PG_URL.format(host=PG_HOST, port=PG_PORT))
    engine = sa.create_engine(db)
    old = old_table(table_name)
    old.create(engine)
    with engine.begin() as conn:
        conn.execute(sa.insert(old), [{"job_id": "default~old", "attempt": 1,
                                       "finished_at": 1.0, "queue": "default", "task": "t",
                                       "state": "succeeded"}])
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    k = app.keys("default")
    stream_events(app, "default")  # a sink of the old version read the queue
    spec = calls.JobSpec(task="t", trace=trace_id)
    app.scripts.run(calls.enqueue(k, spec, [("new", b"[[]]")], app.limits))
    leased = app.scripts.run(calls.fetch(k, 1, app.limits)).jobs[0]
    app.scripts.run(calls.finish(k, [calls.Outcome("new", leased.token, "ok", 0.0, b"1")],
                                 app.limits))
    # The first sink to start adds the column (and its index); a later one finds it there.
    sinks = [Sink(app, db, table=table_name, queues=["default"], consumer=f"c{i}")
             for i in range(2)]
    try:
        assert sinks[0].run(until_idle=True) == 1
        assert sinks[1].run(until_idle=True) == 0
        inspector = sa.inspect(engine)
        assert "trace_id" in {c["name"] for c in inspector.get_columns(table_name)}
        assert f"ix_{table_name}_trace" in {i["name"] for i in inspector.get_indexes(table_name)}
        with engine.connect() as conn:
            rows = {r.job_id: r.trace_id for r in conn.execute(sa.text(
                f"SELECT job_id, trace_id FROM {table_name}"))}
        assert rows == {"default~old": None, "default~new": trace_id}
    finally:
        for sink in sinks:
            sink.close()
        if backend == "postgresql":
            with engine.begin() as conn:
                conn.execute(sa.text(f"DROP TABLE {table_name}"))
        engine.dispose()


def test_two_sinks_upgrading_at_once_do_not_fail(
    app: conveyor.Conveyor, tmp_path: Path, table_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race: another sink adds the column between this one's look and its ALTER TABLE.
    db = f"sqlite:///{tmp_path / 'race.db'}"
    engine = sa.create_engine(db)
    old_table(table_name).create(engine)
    first = Sink(app, db, table=table_name, queues=["default"])
    looked = schema.missing_columns

    def stale_look(conn: sa.Connection, table: sa.Table) -> list[str]:
        missing = looked(conn, table)
        monkeypatch.setattr(schema, "missing_columns", looked)
        with engine.begin() as other:  # the other sink wins the race
            schema.add_missing_columns(other, table)
        return missing

    monkeypatch.setattr(schema, "missing_columns", stale_look)
    try:
        first.step(block=False)  # its ALTER TABLE fails; the column is there: no error
        assert "trace_id" in {c["name"] for c in sa.inspect(engine).get_columns(table_name)}
        assert schema.missing_columns is looked  # the race did happen
    finally:
        first.close()
        engine.dispose()


def test_a_queue_no_sink_has_read_writes_no_events_and_one_that_was_read_writes_all(
    app: conveyor.Conveyor, tmp_path: Path, table_name: str
) -> None:
    @app.task(name="quiet", queue="unread")
    def quiet(n: int) -> int:
        return n

    k = app.keys("unread")
    before = quiet.enqueue_many([(n,) for n in range(5)])
    run_jobs(app, before)
    assert app.redis.xlen(k.events) == 0 and not app.redis.exists(k.events_on)
    sink = Sink(app, f"sqlite:///{tmp_path / 'jobs.db'}", table=table_name, queues=["unread"])
    assert sink.run(until_idle=True) == 0
    assert app.redis.exists(k.events_on)  # the sink's first read turned the stream on
    after = quiet.enqueue_many([(n,) for n in range(7)])
    run_jobs(app, after)
    assert sink.run(until_idle=True) == 7
    rows = count_rows(sink.engine, table_name)
    assert rows == (7, 7)
    sink.close()


def test_a_running_sink_turns_the_stream_on_again_after_redis_lost_the_mark(
    app: conveyor.Conveyor, tmp_path: Path, table_name: str
) -> None:
    @app.task(name="again", queue="rolled")
    def again(n: int) -> int:
        return n

    k = app.keys("rolled")
    sink = Sink(app, f"sqlite:///{tmp_path / 'jobs.db'}", table=table_name, queues=["rolled"])
    sink.MARK_SECONDS = 0.0  # every step (a minute in production)
    assert sink.run(until_idle=True) == 0
    app.redis.delete(k.events_on)  # as a restore from before the sink's first read would
    assert sink.run(until_idle=True) == 0
    assert app.redis.exists(k.events_on)
    jobs = again.enqueue_many([(n,) for n in range(3)])
    run_jobs(app, jobs)
    assert sink.run(until_idle=True) == 3
    sink.close()
