"""Arguments and results keep their types: the round-trip table of docs/reference/app.md.

Every row is sent through a real worker on a real redis-server, in JSON and in
MessagePack: the task receives the type its parameter is annotated with, and
``result()`` gives back the type of its return annotation. An argument that does not fit
its annotation ends the job dead at once, naming the parameter.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import logging
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Annotated, Any, Literal, NamedTuple, TypedDict

import msgspec
import pytest

import conveyor
from conveyor import testing
from helpers import RedisServer, running_worker, wait_until


@dataclasses.dataclass(frozen=True)
class Order:
    id: int
    placed: dt.datetime


class Point(msgspec.Struct, frozen=True):
    x: float
    y: float


class Color(enum.Enum):
    RED = "red"


class Size(enum.IntEnum):
    LARGE = 3


class Pair(NamedTuple):
    key: str
    count: int


class Movie(TypedDict):
    title: str
    year: int


UTC = dt.UTC
PLACED = dt.datetime(2026, 11, 26, 9, 30, tzinfo=UTC)
ID = uuid.UUID("12345678-1234-5678-1234-567812345678")


SAME = object()  # a row whose value arrives as it was sent


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the table: ``sent`` to a parameter annotated ``annotation`` arrives as
    ``received`` (the value sent, unless given; ``in_msgpack`` when MessagePack differs)."""

    id: str
    sent: Any
    annotation: Any
    received: Any = SAME
    in_msgpack: Any = SAME

    def expected(self, encoding: str) -> Any:
        if encoding == "msgpack" and self.in_msgpack is not SAME:
            return self.in_msgpack
        return self.sent if self.received is SAME else self.received


ROWS = [
    Row("dataclass", Order(7, PLACED), Order),
    Row("struct", Point(1.5, -2.0), Point),
    Row("datetime-aware", PLACED, dt.datetime),
    Row("datetime-naive", dt.datetime(2026, 1, 2, 3, 4, 5), dt.datetime),
    Row("date", dt.date(2026, 11, 26), dt.date),
    Row("time", dt.time(23, 10), dt.time),
    Row("timedelta", dt.timedelta(minutes=90), dt.timedelta),
    Row("uuid", ID, uuid.UUID),
    Row("decimal", Decimal("19.90"), Decimal),
    Row("bytes", b"\x00\xffraw", bytes),
    Row("bytearray", bytearray(b"ab"), bytearray),
    Row("set", {3, 1, 2}, set[int]),
    Row("frozenset", frozenset({"a"}), frozenset[str]),
    Row("tuple", (1, "a"), tuple[int, str]),
    Row("tuple-varlen", (1, 2, 3), tuple[int, ...]),
    Row("int-keys", {1: "a", 2: "b"}, dict[int, str]),
    Row("uuid-keys", {ID: 1}, dict[uuid.UUID, int]),
    Row("enum", Color.RED, Color),
    Row("intenum", Size.LARGE, Size),
    Row("namedtuple", Pair("k", 2), Pair),
    Row("typeddict", Movie(title="Alien", year=1979), Movie),
    Row("literal", "b", Literal["a", "b"]),
    Row("nested", [Order(1, PLACED)], list[Order]),
    Row("optional-none", None, dt.date | None),
    Row("int-to-float", 3, float, 3.0),
    Row("unannotated", Order(7, PLACED), None, {"id": 7, "placed": "2026-11-26T09:30:00Z"},
        {"id": 7, "placed": PLACED}),
    Row("any", {1: ID}, Any, {"1": str(ID)}, {1: str(ID)}),
]


def _echo(annotation: Any) -> Callable[..., Any]:
    """A task function that returns its argument; annotated (argument and result) unless
    ``annotation`` is None."""
    def echo(x):  # type: ignore[no-untyped-def]
        return x
    if annotation is not None:
        echo.__annotations__ = {"x": annotation, "return": annotation}
    return echo


@pytest.fixture(scope="module", params=["json", "msgpack"])
def apps(request: pytest.FixtureRequest) -> Iterator[tuple[conveyor.Conveyor, dict[str, Any]]]:
    """An app of one encoding with a task per row, and a worker running it; what each
    task received, by row id."""
    server = RedisServer().start()
    app = conveyor.Conveyor(server.url, encoding=request.param)
    received: dict[str, Any] = {}
    for row in ROWS:
        fn = _echo(row.annotation)

        def record(x: Any, fn: Callable[..., Any] = fn, key: str = row.id) -> Any:
            received[key] = x
            return fn(x)
        record.__annotations__ = fn.__annotations__  # the hints the worker reads
        app.task(name=f"echo.{row.id}", queue="types")(record)
    try:
        with running_worker(app, queues=["types"], concurrency=4):
            yield app, received
    finally:
        app.close()
        server.stop()
        server.cleanup()


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_each_type_of_the_table_round_trips_through_a_worker(
        apps: tuple[conveyor.Conveyor, dict[str, Any]], row: Row) -> None:
    app, received = apps
    expected = row.expected(app.codec.format)
    job = app.tasks[f"echo.{row.id}"].enqueue(row.sent)
    result = job.result(timeout=20)
    got = received[row.id]
    assert type(got) is type(expected) and got == expected
    assert type(result) is type(expected) and result == expected
    if row.id == "nested":
        assert type(got[0]) is Order and type(got[0].placed) is dt.datetime


def test_an_argument_that_does_not_fit_ends_the_job_dead_at_once(
        app: conveyor.Conveyor) -> None:
    runs: list[Order] = []
    dead: list[str] = []
    app.on_dead(lambda info: dead.append(info.id))

    @app.task(name="ship", queue="q", retries=5)
    def ship(o: Order, copies: int = 1) -> None:
        runs.append(o)

    with running_worker(app, queues=["q"]):
        bad = ship.enqueue({"id": "seven", "placed": "2026-11-26T09:30:00Z"})  # type: ignore[arg-type]
        worse = ship.enqueue(Order(1, PLACED), copies="two")  # type: ignore[arg-type]
        for job in (bad, worse):
            with pytest.raises(conveyor.JobFailed):
                job.result(timeout=20)
        wait_until(lambda: len(dead) == 2, 10, message="on_dead")
    info = bad.info()
    assert info.attempts == 1 and not runs
    assert info.error == ("argument 'o' of task 'ship': expected `int`, got `str`"
                          " - at `o.id`")
    assert worse.info().error == ("argument 'copies' of task 'ship': expected `int`,"
                                  " got `str`")


def test_star_args_and_kwargs_take_their_annotations(app: conveyor.Conveyor) -> None:
    seen: list[Any] = []

    @app.task(name="gather", queue="q")
    def gather(first: dt.date, *ids: uuid.UUID, when: dt.time, **extra: Decimal) -> int:
        seen.append((first, ids, when, extra))
        return len(ids)

    @app.task(name="loose", queue="q")
    def loose(*items, **named):  # type: ignore[no-untyped-def]
        seen.append((items, named))

    with running_worker(app, queues=["q"]):
        job = gather.enqueue(dt.date(2026, 1, 1), ID, ID, when=dt.time(9), price=Decimal("1.5"))
        assert job.result(timeout=20) == 2
        loose.enqueue(ID, tag=ID).result(timeout=20)
        bad = gather.enqueue(dt.date(2026, 1, 1), ID, "nope", when=dt.time(9))  # type: ignore[arg-type]
        with pytest.raises(conveyor.JobFailed):
            bad.result(timeout=20)
    assert seen[0] == (dt.date(2026, 1, 1), (ID, ID), dt.time(9), {"price": Decimal("1.5")})
    assert seen[1] == ((str(ID),), {"tag": str(ID)})  # unannotated: as decoded
    assert (bad.info().error or "").startswith("argument 'ids[1]' of task 'gather': invalid")


def test_inline_mode_converts_as_a_worker_does(app: conveyor.Conveyor) -> None:
    seen: list[Any] = []

    @app.task(name="place", queue="q", retries=3)
    def place(o: Order, tags: set[str]) -> Order:
        seen.append((o, tags))
        return o

    with testing.inline(app):
        order = place.enqueue(Order(3, PLACED), {"a"}).result()
        bad = place.enqueue(Order(3, PLACED), 5)  # type: ignore[arg-type]
        info = bad.info()
    assert order == Order(3, PLACED) and type(order) is Order
    assert seen == [(Order(3, PLACED), {"a"})]
    assert (info.state, info.attempts) == ("dead", 1)
    assert info.error == "argument 'tags' of task 'place': expected `array`, got `int`"


def test_results_are_converted_only_by_an_app_that_knows_the_task(
        app: conveyor.Conveyor, redis_server: RedisServer, namespace: str) -> None:
    @app.task(name="when", queue="q")
    def when() -> dt.datetime:
        return PLACED

    with running_worker(app, queues=["q"]):
        job = when.enqueue()
        assert job.result(timeout=20) == PLACED
    other = conveyor.Conveyor(redis_server.url, namespace=namespace)  # no tasks registered
    try:
        assert other.job(job.id).result(timeout=5) == "2026-11-26T09:30:00Z"
    finally:
        other.close()


def test_hints_that_cannot_be_resolved_leave_arguments_as_decoded(
        app: conveyor.Conveyor, caplog: pytest.LogCaptureFixture) -> None:
    def later(o):  # type: ignore[no-untyped-def]
        return o
    later.__annotations__ = {"o": "NotDefinedAnywhere"}
    task = app.task(name="later", queue="q")(later)
    with caplog.at_level(logging.WARNING, logger="conveyor"), testing.inline(app):
        assert task.enqueue(Order(1, PLACED)).result() == {
            "id": 1, "placed": "2026-11-26T09:30:00Z"}
    assert "task later: its type hints cannot be resolved (NameError" in caplog.text


def test_constraints_of_annotated_hints_are_checked(app: conveyor.Conveyor) -> None:
    @app.task(name="count", queue="q")
    def count(n: Annotated[int, msgspec.Meta(ge=0)]) -> int:
        return n

    with testing.inline(app):
        assert count.enqueue(3).result() == 3
        info = count.enqueue(-1).info()
    assert (info.state, info.error) == ("dead", "argument 'n' of task 'count': expected"
                                                " `int` >= 0")


def test_an_argument_of_no_supported_type_fails_at_enqueue_naming_what_is(
        app: conveyor.Conveyor) -> None:
    class Opaque:
        pass

    @app.task(name="takes", queue="q")
    def takes(x: Any) -> None:
        pass

    with pytest.raises(conveyor.SerializationError) as caught:
        takes.enqueue(Opaque())
    text = str(caught.value)
    assert "Opaque" in text and "'takes'" in text
    for name in ("dataclass", "msgspec.Struct", "datetime", "UUID", "Decimal", "bytes",
                 "set", "tuple", "enum"):  # each a row of the round-trip table
        assert name in text.split("supported: ", 1)[1]
