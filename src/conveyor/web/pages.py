"""HTML pages.

Pages render a frame server-side (escaped by Jinja's autoescape) and fill live figures
from the JSON API with ``textContent`` only. The forms they show post to
:mod:`conveyor.web.actions`; a page shows only the forms its user's role allows
(``can(action, queue)`` in every template).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from ..clock import server_now
from ..errors import JobNotFound
from . import queries
from .api import PAGE_SIZE, WINDOWS, int_param, window_of
from .security import Csrf, user_of

if TYPE_CHECKING:
    from ..app import Conveyor

NOTICES = {
    "requeued": ("ok", "Requeued {n} dead job(s)."),
    "purged": ("ok", "Purged {n} dead job(s)."),
    "cancelled": ("ok", "Cancelled the job: it will not run (a running job is stopped within"
                        " seconds)."),
    "not-cancelled": ("warn", "The job was not cancelled: it has already ended."),
    "workflow-cancelled": ("ok", "Cancelled {n} node(s) of the workflow that had not ended."),
    "paused": ("ok", "Paused: the queue accepts jobs but hands none out."),
    "resumed": ("ok", "Resumed: workers take jobs from the queue again."),
    "bad-request": ("warn", "That action needs a queue or a job id it did not get."),
    "signalled": ("ok", "Signal sent: the job's wait of that name gets it (kept until then)."),
    "not-signalled": ("warn", "The signal was not sent: the job has ended."),
    "bad-signal": ("warn", "A signal needs a name (1-200 bytes) and a payload in JSON (or"
                   " nothing): nothing was sent."),
    "limits-set": ("ok", "Limits changed: every worker obeys them at its next claim."),
    "bad-limits": ("warn", "Those limits are not valid (a cap is a whole number >= 0, a rate"
                   " is like 200/s, 50/m or 10): nothing was changed."),
}
REPORT_PARAMS = ("done", "n")


def latest_decisions(supervisors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every supervisor's decisions in one list, newest first, each naming its supervisor."""
    rows = [{**d, "supervisor": sup["id"]} for sup in supervisors for d in sup["decisions"]]
    return sorted(rows, key=lambda d: -(d["at"] or 0.0))


class Pages:
    """Page and action endpoints bound to one application and one template set."""

    def __init__(self, app: Conveyor, templates: Jinja2Templates, csrf: Csrf) -> None:
        self.app = app
        self.templates = templates
        self.csrf = csrf

    def routes(self) -> list[Route]:
        return [
            Route("/", self.overview, name="overview"),
            Route("/queues/{queue}", self.queue, name="queue"),
            Route("/queues/{queue}/jobs", self.job_list, name="job_list"),
            Route("/tasks", self.tasks, name="tasks"),
            Route("/jobs", self.jobs, name="jobs"),
            Route("/jobs/{job_id:path}", self.job, name="job"),
            Route("/workflows/{workflow_id:path}", self.workflow, name="workflow"),
            Route("/workers", self.workers, name="workers"),
            Route("/schedules", self.schedules, name="schedules"),
        ]

    # -- rendering -------------------------------------------------------------------------

    def render(self, request: Request, name: str, page: str, status_code: int = 200,
               **context: Any) -> Response:
        token, fresh_nonce = self.csrf.token(request)
        user = user_of(request)
        params = [(k, v) for k, v in request.query_params.multi_items()
                  if k not in REPORT_PARAMS]
        here = request.scope.get("root_path", "") + request.url.path
        if params:
            here += "?" + urlencode(params)
        response = self.templates.TemplateResponse(
            request, name, {"page": page, "base": request.scope.get("root_path", ""),
                            "csrf": token, "here": here, "namespace": self.app.namespace,
                            "notice": self._notice(request), "user": user, "can": user.can,
                            **context},
            status_code=status_code)
        if fresh_nonce is not None:
            self.csrf.set_cookie(request, response, fresh_nonce)
        return response

    @staticmethod
    def _notice(request: Request) -> dict[str, str] | None:
        done = request.query_params.get("done")
        if done not in NOTICES:
            return None
        kind, text = NOTICES[done]
        try:
            n = int(request.query_params.get("n", "0"))
        except ValueError:
            n = 0
        return {"kind": kind, "text": text.format(n=n)}

    # -- pages -----------------------------------------------------------------------------

    def overview(self, request: Request) -> Response:
        return self.render(request, "overview.html", "overview")

    def queue(self, request: Request) -> Response:
        queue = request.path_params["queue"]
        backlog = queries.backlog(self.app, [queue])[queue]
        return self.render(request, "queue.html", "queue", queue=queue, backlog=backlog,
                           window=window_of(request), windows=WINDOWS,
                           flow=self.app.monitor.flow(queue),
                           shards=queries.shards(self.app, queue))

    def tasks(self, request: Request) -> Response:
        return self.render(request, "tasks.html", "tasks", window=window_of(request),
                           windows=WINDOWS)

    def jobs(self, request: Request) -> Response:
        wanted = request.query_params.get("id", "").strip()
        if wanted:
            base = request.scope.get("root_path", "")
            return RedirectResponse(f"{base}/jobs/{wanted}", status_code=303)
        queues = self.app.monitor.queue_names()
        return self.render(request, "jobs.html", "jobs", queues=queues,
                           backlog=queries.backlog(self.app, queues))

    def job_list(self, request: Request) -> Response:
        queue = request.path_params["queue"]
        state = request.query_params.get("state", "dead")
        if state not in queries.LISTS:
            state = "dead"
        page = int_param(request, "page", 1, 1, 10**6)
        data = queries.list_jobs(self.app, queue, state, (page - 1) * PAGE_SIZE, PAGE_SIZE)
        pages = max(1, -(-data["total"] // PAGE_SIZE))
        return self.render(request, "job_list.html", "job_list", queue=queue, state=state,
                           data=data, page_no=page, pages=pages,
                           states=list(queries.LISTS))

    def job(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        try:
            job = queries.job_detail(self.app, job_id)
        except (JobNotFound, ValueError) as exc:
            return self.render(request, "job.html", "job", status_code=404, job=None,
                               job_id=job_id, missing=str(exc))
        return self.render(request, "job.html", "job", job=job, job_id=job_id)

    def workflow(self, request: Request) -> Response:
        workflow_id = request.path_params["workflow_id"]
        try:
            wf = queries.workflow_detail(self.app, workflow_id)
        except (JobNotFound, ValueError) as exc:
            return self.render(request, "workflow.html", "workflow", status_code=404, wf=None,
                               workflow_id=workflow_id, missing=str(exc))
        return self.render(request, "workflow.html", "workflow", wf=wf,
                           workflow_id=workflow_id)

    def workers(self, request: Request) -> Response:
        # Rendered here too (the script then keeps them fresh), so they read without it.
        sups = queries.supervisors(self.app, server_now(self.app.redis))
        return self.render(request, "workers.html", "workers", supervisors=sups,
                           decisions=latest_decisions(sups))

    def schedules(self, request: Request) -> Response:
        rows = queries.schedules(self.app, server_now(self.app.redis))
        return self.render(request, "schedules.html", "schedules", rows=rows)
