"""What the dashboard answers while Redis cannot be reached.

A page says so in a banner, with the URL (password hidden), the cause and what to check,
under status 503; the JSON API answers ``{"error": ..., "detail": ...}`` with 503, which
the pages' scripts show in the same banner while they keep polling, and hide once an
answer comes back. Any other error stays a 500: that one is a bug.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import redis.exceptions
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from ..unreachable import describe, is_expected
from .api import json_response
from .security import user_of

if TYPE_CHECKING:
    from ..app import Conveyor

UNAVAILABLE = 503
# What the handlers are registered for; is_expected() decides among them.
CAUGHT = (redis.exceptions.RedisError, OSError)


class Outage:
    """The exception handler of one dashboard (its app and templates)."""

    def __init__(self, app: Conveyor, templates: Jinja2Templates) -> None:
        self.app = app
        self.templates = templates

    async def __call__(self, request: Request, exc: Exception) -> Response:
        if not is_expected(exc):
            raise exc
        detail = describe(exc, self.app.url)
        base = request.scope.get("root_path", "")
        if request.url.path.startswith("/api/"):
            return json_response({"error": "redis unavailable", "detail": detail},
                                 UNAVAILABLE)
        user = user_of(request)  # the header names who is signed in, on this page too
        return self.templates.TemplateResponse(
            request, "outage.html",
            {"page": "outage", "base": base, "csrf": "", "here": base + request.url.path,
             "namespace": self.app.namespace, "notice": None, "outage": detail,
             "user": user, "can": user.can},
            status_code=UNAVAILABLE)
