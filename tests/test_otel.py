"""OpenTelemetry: producer and consumer spans, linked through the job, across a real worker."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import conveyor
from conveyor import testing
from conveyor.contrib.otel import instrument, uninstrument
from conveyor.keys import split_job_id
from conveyor.sink import stream_events
from helpers import RedisServer, env_with_src, run_async, running_worker, wait_until


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_enqueue_and_run_spans_across_a_worker(
    app: conveyor.Conveyor, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans

    @app.task(name="otel.add", queue="traced")
    def add(x: int, y: int) -> int:
        return x + y

    assert instrument(app, tracer_provider=provider) is instrument(app)  # once per app
    request = provider.get_tracer("test").start_as_current_span("POST /signup")
    with request as outer:
        job = add.enqueue(2, 3)
    with running_worker(app, queues=["traced"], concurrency=2):
        assert job.result(timeout=30) == 5
        wait_until(lambda: named(exporter, "run otel.add"), 10, message="consumer span")

    [producer] = named(exporter, "enqueue otel.add")
    [consumer] = named(exporter, "run otel.add")
    assert producer.kind == SpanKind.PRODUCER and consumer.kind == SpanKind.CONSUMER
    assert producer.parent is not None
    assert producer.parent.span_id == outer.get_span_context().span_id
    assert producer.attributes is not None and consumer.attributes is not None
    assert producer.attributes["messaging.system"] == "conveyor"
    assert producer.attributes["messaging.destination.name"] == "traced"
    assert producer.attributes["messaging.operation.type"] == "send"
    # An immediate first run continues the request's trace, as a child of the enqueue...
    assert consumer.context is not None and producer.context is not None
    assert consumer.context.trace_id == producer.context.trace_id
    assert consumer.parent is not None and consumer.parent.span_id == producer.context.span_id
    # ... and links to it too.
    assert [link.context.span_id for link in consumer.links] == [producer.context.span_id]
    assert consumer.attributes["messaging.message.id"] == job.id
    assert consumer.attributes["messaging.operation.type"] == "process"
    assert consumer.attributes["conveyor.job.attempt"] == 1
    assert consumer.status.status_code != StatusCode.ERROR


def test_retries_and_delayed_runs_link_without_parent(
    app: conveyor.Conveyor, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    instrument(app, tracer_provider=provider)
    attempts: list[int] = []

    @app.task(name="otel.flaky", retries=2, backoff=0.05)
    async def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 2:
            raise ValueError("first attempt fails")
        return "ok"

    @app.task(name="otel.later")
    def later() -> None:
        return None

    job = flaky.enqueue()
    delayed = later.options(delay=0.3).enqueue()
    with running_worker(app, concurrency=4):
        assert job.result(timeout=30) == "ok"
        delayed.result(timeout=30)
        wait_until(lambda: len(named(exporter, "run otel.flaky")) == 2
                   and named(exporter, "run otel.later"), 10, message="consumer spans")

    [producer] = named(exporter, "enqueue otel.flaky")
    assert producer.context is not None
    first, second = sorted(named(exporter, "run otel.flaky"),
                           key=lambda s: (s.attributes or {})["conveyor.job.attempt"])
    assert first.status.status_code == StatusCode.ERROR
    assert any(e.name == "exception" and (e.attributes or {}).get("exception.type")
               == "ValueError" for e in first.events)
    assert first.parent is not None and first.parent.span_id == producer.context.span_id
    # The retry is a trace of its own, linked to the enqueue.
    assert second.parent is None and second.context is not None
    assert second.context.trace_id != producer.context.trace_id
    assert [link.context.span_id for link in second.links] == [producer.context.span_id]
    assert second.status.status_code != StatusCode.ERROR

    [enqueue_later] = named(exporter, "enqueue otel.later")
    [run_later] = named(exporter, "run otel.later")
    assert enqueue_later.context is not None
    assert run_later.parent is None
    assert [link.context.trace_id for link in run_later.links] == [
        enqueue_later.context.trace_id]


def test_the_enqueue_trace_id_reaches_the_sink_rows(
    app: conveyor.Conveyor, spans: tuple[TracerProvider, InMemorySpanExporter], tmp_path: Path
) -> None:
    provider, exporter = spans

    @app.task(name="otel.sum", queue="sunk")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="otel.dies", queue="sunk", retries=1, backoff=0.01)
    def dies() -> None:
        raise RuntimeError("never works")

    stream_events(app, "sunk")  # a sink has read the queue before
    instrument(app, tracer_provider=provider)
    with provider.get_tracer("test").start_as_current_span("POST /orders"):
        one = add.enqueue(1, 2)
    batch = add.enqueue_many([(i, i) for i in range(3)])  # one call: one producer span
    doomed = dies.enqueue()
    uninstrument(app)
    plain = add.enqueue(5, 5)
    jobs = [one, *batch, doomed, plain]
    with running_worker(app, queues=["sunk"], concurrency=4):
        wait_until(lambda: all(j.info().state.finished for j in jobs), 30, message="jobs done")
    # Only the record carries the trace id; the payload's meta does not.
    payload = app.redis.hget(app.keys("sunk").job(split_job_id(one.id)[1]), "a")
    assert payload is not None and "conveyor.trace_id" not in app.codec.decode_meta(payload)
    assert app.redis.hget(app.keys("sunk").job(split_job_id(plain.id)[1]), "tr") is None

    db = f"sqlite:///{tmp_path / 'jobs.db'}"
    done = subprocess.run(
        [str(Path(sys.executable).with_name("conveyor")), "sink", "--db", db, "--until-idle",
         "--url", app.url, "--namespace", app.namespace],
        env=env_with_src(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    engine = sa.create_engine(db)
    with engine.connect() as conn:
        rows = [(r.job_id, r.state, r.attempt, r.trace_id) for r in conn.execute(sa.text(
            "SELECT job_id, state, attempt, trace_id FROM conveyor_jobs"))]
    engine.dispose()
    trace_of = {r[0]: r[3] for r in rows}

    def trace_id(span: ReadableSpan) -> str:
        assert span.context is not None
        return trace.format_trace_id(span.context.trace_id)

    single, many = named(exporter, "enqueue otel.sum")
    [dying] = named(exporter, "enqueue otel.dies")
    assert len(rows) == 6
    assert trace_of[one.id] == trace_id(single)
    assert {trace_of[j.id] for j in batch} == {trace_id(many)} != {trace_id(single)}
    assert (doomed.id, "dead", 2, trace_id(dying)) in rows  # its retry kept the enqueue's
    assert trace_of[plain.id] is None  # enqueued without instrumentation: NULL


def test_batches_inline_runs_and_uninstrument(
    app: conveyor.Conveyor, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    instrument(app, tracer_provider=provider)

    @app.task(name="otel.double")
    def double(x: int) -> int:
        assert trace.get_current_span().is_recording()  # the task runs inside its span
        return 2 * x

    double.enqueue_many([1, 2, 3])
    [batch] = named(exporter, "enqueue otel.double")
    assert batch.attributes is not None
    assert batch.attributes["messaging.batch.message_count"] == 3
    assert [i.result for i in testing.drain(app, timeout=60)] == [2, 4, 6]
    assert len(named(exporter, "run otel.double")) == 3
    with testing.inline(app):
        assert double.enqueue(5).result() == 10
    assert len(named(exporter, "run otel.double")) == 4

    uninstrument(app)
    exporter.clear()
    double.enqueue(1)
    testing.drain(app, timeout=60)
    assert exporter.get_finished_spans() == ()


def test_a_workflow_enqueue_is_traced(
    app: conveyor.Conveyor, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """Each task among a workflow's nodes has an enqueue span (one per task and options,
    counting its nodes), and the nodes' runs continue the enqueue's trace."""
    provider, exporter = spans
    instrument(app, tracer_provider=provider)

    @app.task(name="otel.fetch", queue="wf-traced")
    def fetch() -> int:
        return 2

    @app.task(name="otel.send", queue="wf-traced-sends")
    def send(i: int) -> int:
        return i

    request = provider.get_tracer("test").start_as_current_span("POST /campaign")
    with request as outer:
        wf = app.workflow()
        first = wf.add(fetch, name="fetch")
        for i in range(3):
            wf.add(send, i, after=[first])
        handle = wf.enqueue()
    [enqueue_fetch] = named(exporter, "enqueue otel.fetch")
    [enqueue_sends] = named(exporter, "enqueue otel.send")
    assert enqueue_fetch.kind == SpanKind.PRODUCER
    assert enqueue_sends.attributes is not None
    assert enqueue_sends.attributes["messaging.batch.message_count"] == 3
    assert enqueue_sends.attributes["messaging.destination.name"] == "wf-traced-sends"
    trace_id = outer.get_span_context().trace_id
    assert {s.context.trace_id for s in (enqueue_fetch, enqueue_sends) if s.context} == {
        trace_id}

    testing.drain(app, queues=["wf-traced", "wf-traced-sends"], timeout=60)
    assert handle.result(timeout=10) == {"fetch": 2, **{f"otel.send#{i + 1}": i
                                                        for i in range(3)}}
    runs = named(exporter, "run otel.fetch") + named(exporter, "run otel.send")
    assert len(runs) == 4
    assert {s.context.trace_id for s in runs if s.context} == {trace_id}

    async def aenqueue() -> None:
        wf = app.workflow()
        wf.add(fetch, name="fetch")
        await wf.aenqueue()

    run_async(app, aenqueue())
    assert len(named(exporter, "enqueue otel.fetch")) == 2


def test_context_crosses_into_supervised_worker_processes(
    redis_server: RedisServer, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace_file = tmp_path / "spans.jsonl"
    env = env_with_src()
    env.update(CONVEYOR_REDIS_URL=redis_server.url, TRACED_NAMESPACE=namespace,
               TRACE_FILE=str(trace_file))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.delitem(sys.modules, "apps.traced", raising=False)
    traced = importlib.import_module("apps.traced")

    ok = traced.add.enqueue(20, 22)
    bad = traced.fail.enqueue()
    log = open(tmp_path / "worker.log", "ab")  # noqa: SIM115 - closed below
    worker = subprocess.Popen(
        [str(Path(sys.executable).with_name("conveyor")), "worker", "apps.traced:app", "-p", "1",
         "-c", "2"], cwd=Path(__file__).parent, env=env, stdout=log, stderr=log)
    try:
        assert ok.result(timeout=60) == 42
        wait_until(lambda: bad.info().state == conveyor.JobState.DEAD, 60, message="dead")

        def spans() -> list[dict[str, Any]]:
            lines = trace_file.read_text().splitlines() if trace_file.exists() else []
            return [json.loads(line) for line in lines]

        wait_until(lambda: len([s for s in spans() if s["name"].startswith("run ")]) == 3, 30,
                   message="three consumer spans")
    finally:
        worker.terminate()
        worker.wait(30)
        log.close()
        traced.app.close()
    by_name: dict[str, list[dict[str, Any]]] = {}
    for span in spans():
        by_name.setdefault(span["name"], []).append(span)
    [enqueue_add], [run_add] = by_name["enqueue traced.add"], by_name["run traced.add"]
    assert enqueue_add["pid"] == os.getpid() and run_add["pid"] != os.getpid()
    assert (enqueue_add["kind"], run_add["kind"]) == ("PRODUCER", "CONSUMER")
    assert run_add["trace"] == enqueue_add["trace"] and run_add["parent"] == enqueue_add["span"]
    assert run_add["attributes"]["messaging.message.id"] == ok.id
    [enqueue_fail] = by_name["enqueue traced.fail"]
    first, second = sorted(by_name["run traced.fail"],
                           key=lambda s: s["attributes"]["conveyor.job.attempt"])
    assert first["status"] == second["status"] == "ERROR"
    assert first["parent"] == enqueue_fail["span"]
    assert second["parent"] is None and second["links"] == [enqueue_fail["span"]]
