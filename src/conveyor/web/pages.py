"""HTML pages and the actions their forms post.

Pages render a frame server-side (escaped by Jinja's autoescape) and fill live figures
from the JSON API with ``textContent`` only. Actions are POST-only, CSRF-checked, and
report back through a redirect that names the outcome from a fixed list of messages.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from ..clock import server_now
from ..errors import ConfigurationError, JobNotFound
from . import queries
from .api import PAGE_SIZE, WINDOWS, int_param, window_of
from .security import Csrf

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
LIMIT_FIELDS = ("concurrency", "rate", "tenant_concurrency", "tenant_rate")
REPORT_PARAMS = ("done", "n")
MAX_FORM_BYTES = 16_384


def local_path(value: str | None, fallback: str) -> str:
    """``value`` when it is a path on this site (no scheme, no host), else ``fallback``."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return fallback
    return value


async def read_form(request: Request) -> dict[str, str]:
    """The fields of a small url-encoded form (the only kind the pages post).

    Parsed here with the standard library: multipart parsing is not needed for a few
    hidden fields.
    """
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return {}
    return dict(parse_qsl(body.decode("utf-8", errors="replace"), max_num_fields=20))


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
            Route("/actions/limits", self.limits_action, methods=["POST"], name="limits"),
            Route("/actions/signal", self.signal_action, methods=["POST"], name="signal"),
            Route("/actions/{action}", self.action, methods=["POST"], name="action"),
        ]

    # -- rendering -------------------------------------------------------------------------

    def render(self, request: Request, name: str, page: str, status_code: int = 200,
               **context: Any) -> Response:
        token, fresh_nonce = self.csrf.token(request)
        params = [(k, v) for k, v in request.query_params.multi_items()
                  if k not in REPORT_PARAMS]
        here = request.scope.get("root_path", "") + request.url.path
        if params:
            here += "?" + urlencode(params)
        response = self.templates.TemplateResponse(
            request, name, {"page": page, "base": request.scope.get("root_path", ""),
                            "csrf": token, "here": here, "namespace": self.app.namespace,
                            "notice": self._notice(request), **context},
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
                           flow=self.app.monitor.flow(queue))

    def tasks(self, request: Request) -> Response:
        return self.render(request, "tasks.html", "tasks", window=window_of(request),
                           windows=WINDOWS)

    def jobs(self, request: Request) -> Response:
        wanted = request.query_params.get("id", "").strip()
        if wanted:
            base = request.scope.get("root_path", "")
            return RedirectResponse(f"{base}/jobs/{wanted}", status_code=303)
        queues = self.app.known_queues()
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

    # -- actions ---------------------------------------------------------------------------

    async def action(self, request: Request) -> Response:
        form = await read_form(request)
        why = self.csrf.refusal(request, form.get("csrf"))
        if why is not None:
            return PlainTextResponse(f"refused: {why}", status_code=403)
        handler = self._actions().get(request.path_params["action"])
        if handler is None:
            return PlainTextResponse("unknown action", status_code=404)
        queue, job_id = form.get("queue", ""), form.get("job_id", "")
        base = request.scope.get("root_path", "")
        target = local_path(form.get("next"), base + "/")
        try:
            done, n = await run_in_threadpool(handler, queue, job_id)
        except (ValueError, JobNotFound):
            done, n = "bad-request", 0
        separator = "&" if "?" in target else "?"
        return RedirectResponse(f"{target}{separator}{urlencode({'done': done, 'n': n})}",
                                status_code=303)

    async def limits_action(self, request: Request) -> Response:
        """Set a queue's limits from the form on its page (an empty field removes that
        limit); with a tenant, that tenant's own concurrency and rate."""
        form = await read_form(request)
        why = self.csrf.refusal(request, form.get("csrf"))
        if why is not None:
            return PlainTextResponse(f"refused: {why}", status_code=403)
        base = request.scope.get("root_path", "")
        target = local_path(form.get("next"), base + "/")
        try:
            await run_in_threadpool(self._set_limits, form)
            done = "limits-set"
        except ConfigurationError:
            done = "bad-limits"
        except ValueError:
            done = "bad-request"
        separator = "&" if "?" in target else "?"
        return RedirectResponse(f"{target}{separator}{urlencode({'done': done, 'n': 1})}",
                                status_code=303)

    async def signal_action(self, request: Request) -> Response:
        """Send a signal to a job (durable waits) from the form on its page."""
        form = await read_form(request)
        why = self.csrf.refusal(request, form.get("csrf"))
        if why is not None:
            return PlainTextResponse(f"refused: {why}", status_code=403)
        base = request.scope.get("root_path", "")
        target = local_path(form.get("next"), base + "/")
        try:
            raw = form.get("data", "").strip()
            payload = json.loads(raw) if raw else None
            sent = await run_in_threadpool(self.app.signal, form.get("job_id", ""),
                                           form.get("name", "").strip(), payload)
            done = "signalled" if sent else "not-signalled"
        except ValueError:  # no JSON, no name, no job id
            done = "bad-signal"
        separator = "&" if "?" in target else "?"
        return RedirectResponse(f"{target}{separator}{urlencode({'done': done, 'n': 1})}",
                                status_code=303)

    def _set_limits(self, form: dict[str, str]) -> None:
        queue = form.get("queue", "")
        if not queue:
            raise ValueError("missing queue")
        values: dict[str, Any] = {}
        for name in LIMIT_FIELDS:
            raw = form.get(name, "").strip()
            values[name] = None if not raw else _limit_value(name, raw)
        q, tenant = self.app.queue(queue), form.get("tenant", "").strip()
        if tenant:
            q.set_tenant_limits(tenant, concurrency=values["concurrency"], rate=values["rate"])
        else:
            q.set_limits(**values)

    def _actions(self) -> dict[str, Callable[[str, str], tuple[str, int]]]:
        app = self.app

        def need(value: str) -> str:
            if not value:
                raise ValueError("missing")
            return value

        def requeue(queue: str, job_id: str) -> tuple[str, int]:
            return "requeued", app.dead_letters(need(queue)).requeue(job_id or None)

        def purge(queue: str, job_id: str) -> tuple[str, int]:
            return "purged", app.dead_letters(need(queue)).purge()

        def cancel(queue: str, job_id: str) -> tuple[str, int]:
            done = app.job(need(job_id)).cancel()
            return ("cancelled" if done else "not-cancelled"), int(done)

        def cancel_workflow(queue: str, job_id: str) -> tuple[str, int]:
            return "workflow-cancelled", app.workflow_handle(need(job_id)).cancel()

        def pause(queue: str, job_id: str) -> tuple[str, int]:
            app.pause(need(queue))
            return "paused", 1

        def resume(queue: str, job_id: str) -> tuple[str, int]:
            app.resume(need(queue))
            return "resumed", 1

        return {"requeue": requeue, "purge": purge, "cancel": cancel, "pause": pause,
                "resume": resume, "cancel_workflow": cancel_workflow}


def _limit_value(name: str, raw: str) -> Any:
    """A form field's text as the value ``Queue.set_limits`` takes."""
    if "rate" in name:
        try:
            return float(raw)
        except ValueError:
            return raw  # "200/s": parsed (and checked) by the queue handle
    try:
        return int(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be a whole number, got {raw!r}") from None
