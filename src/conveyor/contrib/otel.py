"""OpenTelemetry tracing: a producer span per enqueue, a consumer span per attempt.

>>> from conveyor.contrib.otel import instrument   # pip install 'conveyor[otel]'
>>> instrument(app)

``enqueue <task>`` (kind PRODUCER) wraps the storing of the jobs, and the trace context
current inside it (W3C ``traceparent``, and ``tracestate`` / baggage when set) travels in
each job's payload. ``run <task>`` (kind CONSUMER) wraps each attempt on the worker. The
first attempt of a job enqueued without a delay is a child of its enqueue span, so the
common case reads as one trace; a delayed job's run and every retry start a trace of their
own that *links* to the enqueue, since an hour-later run is not part of the request that
asked for it. Attributes follow the messaging semantic conventions (``messaging.system``,
``messaging.operation.type``, ``messaging.destination.name``, ``messaging.message.id``),
plus ``conveyor.task``, ``conveyor.job.attempt`` and ``conveyor.job.max_attempts``; an
exception the task raises is recorded on the span, whose status becomes ERROR. The enqueue
span's trace id is also stored on each job's record, and the SQL sink (``conveyor sink``)
writes it into the job's rows (``trace_id``): from a slow or failed job in SQL to its trace.

Call :func:`instrument` where the app is defined, so that the producer (a web process)
and the workers (which import the same module) are both instrumented.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import context, propagate, trace

from .. import __version__
from ..hooks import TRACE_ID, Attempt, Hook

if TYPE_CHECKING:
    from ..app import Conveyor
    from ..task import Task

__all__ = ["ConveyorTracing", "instrument", "uninstrument"]

SYSTEM = "conveyor"
DELAYED = "conveyor.delayed"  # meta entry: the job was enqueued to run later


class ConveyorTracing(Hook):
    """The hook :func:`instrument` installs; one per app.

    :param tracer_provider: where spans go (default: the global provider)
    """

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self.tracer = trace.get_tracer("conveyor", __version__, tracer_provider)

    @contextmanager
    def _enqueue(self, task: Task[Any, Any], count: int, meta: dict[str, str]
                 ) -> Iterator[None]:
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM, "messaging.operation.type": "send",
            "messaging.operation.name": "enqueue", "messaging.destination.name": task.queue,
            "conveyor.task": task.name,
        }
        if count != 1:
            attributes["messaging.batch.message_count"] = count
        with self.tracer.start_as_current_span(
            f"enqueue {task.name}", kind=trace.SpanKind.PRODUCER, attributes=attributes,
        ) as span:
            propagate.inject(meta)
            span_context = span.get_span_context()
            if span_context.is_valid:
                meta[TRACE_ID] = trace.format_trace_id(span_context.trace_id)
            options = task.job_options
            if options.delay is not None or options.at is not None:
                meta[DELAYED] = "1"
            yield

    def enqueue(self, task: Task[Any, Any], count: int, meta: dict[str, str]
                ) -> AbstractContextManager[None]:
        return self._enqueue(task, count, meta)

    @contextmanager
    def _run(self, task: Task[Any, Any], attempt: Attempt) -> Iterator[None]:
        carried = propagate.extract(attempt.meta)
        origin = trace.get_current_span(carried).get_span_context()
        links: list[trace.Link] = []
        parent = context.Context()  # a new trace, unless this run continues the enqueue's
        if origin.is_valid:
            links.append(trace.Link(origin, {"conveyor.link": "enqueue"}))
            if attempt.attempt == 1 and DELAYED not in attempt.meta:
                parent = carried
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM, "messaging.operation.type": "process",
            "messaging.operation.name": "run", "messaging.destination.name": attempt.queue,
            "messaging.message.id": attempt.job_id, "conveyor.task": task.name,
            "conveyor.job.attempt": attempt.attempt,
            "conveyor.job.max_attempts": attempt.max_attempts,
        }
        with self.tracer.start_as_current_span(
            f"run {task.name}", context=parent, kind=trace.SpanKind.CONSUMER, links=links,
            attributes=attributes, record_exception=True, set_status_on_exception=True,
        ):
            yield

    def run(self, task: Task[Any, Any], attempt: Attempt) -> AbstractContextManager[None]:
        return self._run(task, attempt)


def instrument(app: Conveyor, tracer_provider: trace.TracerProvider | None = None
               ) -> ConveyorTracing:
    """Trace ``app``'s enqueues and runs (once: a second call returns the same hook).

    :param tracer_provider: where spans go (default: the global provider)
    """
    for hook in app.hooks:
        if isinstance(hook, ConveyorTracing):
            return hook
    tracing = ConveyorTracing(tracer_provider)
    app.hooks.append(tracing)
    return tracing


def uninstrument(app: Conveyor) -> None:
    """Stop tracing ``app``."""
    app.hooks[:] = [h for h in app.hooks if not isinstance(h, ConveyorTracing)]
