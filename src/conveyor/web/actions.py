"""The actions the pages' forms post, and the one gate every one of them passes.

Every state-changing request is ``POST /actions/<name>`` and goes through
:meth:`Actions.post`, which refuses it (403, plain text) unless it carries this site's
CSRF token and the user's role allows ``<name>`` on every queue it touches
(:mod:`conveyor.web.roles`). The queues touched are read from the form: its ``queue``,
the queue inside a ``job_id`` and, for a workflow, the queues of all its nodes. The
outcome comes back through a redirect that names it from a fixed list of messages.
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

from ..errors import ConfigurationError, JobNotFound
from ..keys import split_job_id
from .roles import User
from .security import Csrf, user_of

if TYPE_CHECKING:
    from ..app import Conveyor

Handler = Callable[[dict[str, str]], tuple[str, int]]  # form -> (outcome, count)
LIMIT_FIELDS = ("concurrency", "rate", "tenant_concurrency", "tenant_rate")
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


def need(value: str) -> str:
    if not value:
        raise ValueError("missing")
    return value


class Actions:
    """The action endpoint bound to one application."""

    def __init__(self, app: Conveyor, csrf: Csrf) -> None:
        self.app = app
        self.csrf = csrf
        self.handlers: dict[str, Handler] = {
            "requeue": self.requeue, "purge": self.purge, "cancel": self.cancel,
            "cancel_workflow": self.cancel_workflow, "pause": self.pause,
            "resume": self.resume, "signal": self.signal, "limits": self.limits,
        }

    def routes(self) -> list[Route]:
        return [Route("/actions/{action}", self.post, methods=["POST"], name="action")]

    async def post(self, request: Request) -> Response:
        action, user = request.path_params["action"], user_of(request)
        form = await read_form(request)
        why = self.csrf.refusal(request, form.get("csrf"))
        if why is None:  # the role's check, the same for every action: see roles.RULES
            queues = await run_in_threadpool(self.queues_touched, action, form, user)
            why = user.refusal(action, queues)
        if why is not None:
            return PlainTextResponse(f"refused: {why}", status_code=403)
        handler = self.handlers.get(action)
        if handler is None:
            return PlainTextResponse("unknown action", status_code=404)
        try:
            done, n = await run_in_threadpool(handler, form)
        except (ValueError, JobNotFound):
            done, n = "bad-request", 0
        target = local_path(form.get("next"), request.scope.get("root_path", "") + "/")
        separator = "&" if "?" in target else "?"
        return RedirectResponse(f"{target}{separator}{urlencode({'done': done, 'n': n})}",
                                status_code=303)

    def queues_touched(self, action: str, form: dict[str, str], user: User) -> set[str]:
        """Every queue the action would change; empty when the form names none (or names
        it wrongly: the action then fails as a bad request, or is refused to a user
        limited to queues)."""
        queues = {form["queue"]} if form.get("queue") else set()
        ident = form.get("job_id", "")
        if not ident:
            return queues
        try:
            queues.add(split_job_id(ident)[0])
            if action == "cancel_workflow" and user.queues is not None:
                # A workflow's nodes may run on other queues than its home: all must be
                # the user's. Read only for a limited user; others may cancel any.
                entries = self.app.workflow_handle(ident).entries()
                queues.update(split_job_id(e.job_id)[0] for e in entries)
        except (ValueError, JobNotFound):
            return set()
        return queues

    # -- the actions: form -> (outcome, count) ----------------------------------------------

    def requeue(self, form: dict[str, str]) -> tuple[str, int]:
        queue = need(form.get("queue", ""))
        return "requeued", self.app.dead_letters(queue).requeue(form.get("job_id") or None)

    def purge(self, form: dict[str, str]) -> tuple[str, int]:
        return "purged", self.app.dead_letters(need(form.get("queue", ""))).purge()

    def cancel(self, form: dict[str, str]) -> tuple[str, int]:
        done = self.app.job(need(form.get("job_id", ""))).cancel()
        return ("cancelled" if done else "not-cancelled"), int(done)

    def cancel_workflow(self, form: dict[str, str]) -> tuple[str, int]:
        handle = self.app.workflow_handle(need(form.get("job_id", "")))
        return "workflow-cancelled", handle.cancel()

    def pause(self, form: dict[str, str]) -> tuple[str, int]:
        self.app.pause(need(form.get("queue", "")))
        return "paused", 1

    def resume(self, form: dict[str, str]) -> tuple[str, int]:
        self.app.resume(need(form.get("queue", "")))
        return "resumed", 1

    def signal(self, form: dict[str, str]) -> tuple[str, int]:
        """Send a signal to a job (durable waits) from the form on its page."""
        try:
            raw = form.get("data", "").strip()
            payload = json.loads(raw) if raw else None
            sent = self.app.signal(form.get("job_id", ""), form.get("name", "").strip(),
                                   payload)
        except ValueError:  # no JSON, no name, no job id
            return "bad-signal", 1
        return ("signalled" if sent else "not-signalled"), 1

    def limits(self, form: dict[str, str]) -> tuple[str, int]:
        """Set a queue's limits from the form on its page (an empty field removes that
        limit); with a tenant, that tenant's own concurrency and rate."""
        queue = form.get("queue", "")
        if not queue:
            return "bad-request", 1
        try:
            values = {name: _limit_value(name, form.get(name, "").strip())
                      for name in LIMIT_FIELDS}
            q, tenant = self.app.queue(queue), form.get("tenant", "").strip()
            if tenant:
                q.set_tenant_limits(tenant, concurrency=values["concurrency"],
                                    rate=values["rate"])
            else:
                q.set_limits(**values)
        except ConfigurationError:
            return "bad-limits", 1
        return "limits-set", 1


def _limit_value(name: str, raw: str) -> Any:
    """A form field's text as the value ``Queue.set_limits`` takes (empty: no limit)."""
    if not raw:
        return None
    if "rate" in name:
        try:
            return float(raw)
        except ValueError:
            return raw  # "200/s": parsed (and checked) by the queue handle
    try:
        return int(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be a whole number, got {raw!r}") from None
