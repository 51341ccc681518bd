"""An instrumented application whose spans, in any process, are appended to $TRACE_FILE
as JSON lines (for the tracing test across worker processes)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import conveyor
from conveyor.contrib.otel import instrument


class FileExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a") as out:
            for span in spans:
                assert span.context is not None
                out.write(json.dumps({
                    "name": span.name, "kind": span.kind.name, "pid": os.getpid(),
                    "trace": span.context.trace_id, "span": span.context.span_id,
                    "parent": span.parent.span_id if span.parent else None,
                    "links": [link.context.span_id for link in span.links],
                    "status": span.status.status_code.name,
                    "attributes": dict(span.attributes or {}),
                }) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


app = conveyor.Conveyor(os.environ.get("CONVEYOR_REDIS_URL"),
                        namespace=os.environ.get("TRACED_NAMESPACE", "traced"))
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(FileExporter(os.environ["TRACE_FILE"])))
instrument(app, tracer_provider=provider)


@app.task(name="traced.add", queue="traced")
def add(x: int, y: int) -> int:
    return x + y


@app.task(name="traced.fail", queue="traced", retries=1, backoff=0.05)
async def fail() -> None:
    raise ValueError("always fails")
