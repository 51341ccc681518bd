"""The JSON API under ``/api``: read-only views the pages poll (documented in the package
docstring). No endpoint here changes anything."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import untrusted
from ..clock import server_now
from ..errors import JobNotFound
from ..fleet.published import DECISIONS_KEPT
from . import figures, queries
from .shared import SharedAnswers

if TYPE_CHECKING:
    from ..app import Conveyor

WINDOWS = (300, 900, 3600, 10800)  # selectable chart windows (s); buckets live 24 h at most
DEFAULT_WINDOW = 900
PAGE_SIZE = 50


def json_response(data: Any, status_code: int = 200) -> Response:
    # msgspec writes NaN/inf as null and knows datetimes, unlike json.dumps(allow_nan=False).
    return Response(msgspec.json.encode(data), status_code=status_code,
                    media_type="application/json", headers={"cache-control": "no-store"})


def window_of(request: Request) -> int:
    """The ``window`` query parameter, snapped to one of :data:`WINDOWS`."""
    try:
        asked = int(request.query_params.get("window", DEFAULT_WINDOW))
    except ValueError:
        return DEFAULT_WINDOW
    return min(WINDOWS, key=lambda w: abs(w - asked))


def int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    try:
        value = int(request.query_params.get(name, default))
    except ValueError:
        return default
    return max(low, min(high, value))


class Api:
    """Endpoints bound to one application (no module-level state).

    :param cache_seconds: how long an answer of a polled endpoint is shared by every
        client asking the same (0: never)
    """

    def __init__(self, app: Conveyor, cache_seconds: float = 1.0) -> None:
        self.app = app
        self.answers = SharedAnswers(cache_seconds)

    def shared(self, request: Request, compute: Any) -> Response:
        """``compute()`` as JSON, shared by every request for the same path and query."""
        key = (request.url.path, tuple(sorted(request.query_params.multi_items())))
        body = self.answers.get(key, lambda: msgspec.json.encode(compute()))
        return Response(body, media_type="application/json",
                        headers={"cache-control": "no-store"})

    def routes(self) -> list[Route]:
        return [
            Route("/api/overview", self.overview),
            Route("/api/tasks", self.tasks),
            Route("/api/workers", self.workers),
            Route("/api/supervisors", self.supervisors),
            Route("/api/schedules", self.schedules),
            Route("/api/queues/{queue}", self.queue),
            Route("/api/queues/{queue}/series", self.series),
            Route("/api/queues/{queue}/jobs", self.jobs),
            Route("/api/jobs/{job_id:path}", self.job),
            Route("/api/workflows/{workflow_id:path}", self.workflow),
        ]

    def overview(self, request: Request) -> Response:
        return self.shared(request, lambda: figures.overview(self.app))

    def tasks(self, request: Request) -> Response:
        window = window_of(request)
        return self.shared(request, lambda: {"window": window,
                                             "tasks": figures.task_types(self.app, window)})

    def workers(self, request: Request) -> Response:
        return self.shared(request, self._workers)

    def _workers(self) -> dict[str, Any]:
        now = server_now(self.app.redis)
        rows = queries.workers(self.app, now)
        capacity = sum(untrusted.integer(w.get("concurrency")) for w in rows)
        return {"time": now, "workers": rows, "capacity": capacity,
                "supervisors": queries.supervisors(self.app, now)}

    def supervisors(self, request: Request) -> Response:
        now = server_now(self.app.redis)
        kept = int_param(request, "decisions", 10, 0, DECISIONS_KEPT)
        return json_response({"time": now,
                              "supervisors": queries.supervisors(self.app, now, kept)})

    def schedules(self, request: Request) -> Response:
        now = server_now(self.app.redis)
        return json_response({"time": now, "schedules": queries.schedules(self.app, now)})

    def queue(self, request: Request) -> Response:
        queue = request.path_params["queue"]
        return self.shared(request,
                           lambda: figures.queue_detail(self.app, queue, window_of(request)))

    def series(self, request: Request) -> Response:
        queue, window = request.path_params["queue"], window_of(request)
        return self.shared(request, lambda: {
            "window": window, **figures.queue_series(self.app, queue, window)})

    def jobs(self, request: Request) -> Response:
        state = request.query_params.get("state", "dead")
        if state not in queries.LISTS:
            return json_response({"error": f"state must be one of {sorted(queries.LISTS)}"},
                                 400)
        offset = int_param(request, "offset", 0, 0, 10**9)
        limit = int_param(request, "limit", PAGE_SIZE, 1, 500)
        data = queries.list_jobs(self.app, request.path_params["queue"], state, offset, limit)
        return json_response(data)

    def workflow(self, request: Request) -> Response:
        try:
            return json_response(queries.workflow_detail(
                self.app, request.path_params["workflow_id"]))
        except (JobNotFound, ValueError) as exc:
            return json_response({"error": str(exc)}, 404)

    def job(self, request: Request) -> Response:
        try:
            return json_response(queries.job_detail(self.app, request.path_params["job_id"]))
        except (JobNotFound, ValueError) as exc:
            return json_response({"error": str(exc)}, 404)
