"""Authentication, CSRF protection and security headers of the dashboard.

- **Authentication** (optional): a bearer token (``Authorization: Bearer <token>``, or a
  cookie set by opening any page once with ``?token=<token>``) and/or basic-auth
  credentials, one admin or several users with roles (:mod:`conveyor.web.roles`).
  Secrets are compared in constant time. The request's :class:`~conveyor.web.roles.User`
  is left in ``scope["conveyor.user"]`` for the actions to check.
- **CSRF**: a state-changing request must be a POST whose form carries ``csrf``, an HMAC
  of a random nonce kept in a same-site, HTTP-only cookie; and its ``Origin`` (or, when a
  browser sends none, its ``Referer``) must name this host.
- **Headers**: a strict Content-Security-Policy (scripts only from this server, no inline
  script), no framing, no MIME sniffing.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.datastructures import URL, MutableHeaders
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .roles import ADMIN, NOBODY, Account, User

CSRF_COOKIE = "conveyor_csrf"
USER_SCOPE_KEY = "conveyor.user"  # where the middleware leaves the request's User
TOKEN_COOKIE = "conveyor_token"
HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; "
        "base-uri 'none'; form-action 'self'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}


def same(a: str, b: str) -> bool:
    """Constant-time string equality."""
    return hmac.compare_digest(a.encode(), b.encode())


@dataclass(frozen=True)
class Credentials:
    """What a request must present; nothing set means the dashboard is open (to admins).

    :param token: bearer token; whoever presents it is an admin over every queue
    :param basic: ``(username, password)`` for HTTP basic authentication, an admin too
    :param accounts: users of HTTP basic authentication, each with its role
    """

    token: str | None = None
    basic: tuple[str, str] | None = None
    accounts: Mapping[str, Account] = field(default_factory=dict)

    @property
    def required(self) -> bool:
        return self.token is not None or self.basic is not None or bool(self.accounts)

    @property
    def asks_basic(self) -> bool:
        return self.basic is not None or bool(self.accounts)

    def identify(self, request: Request) -> User | None:
        """The user this request authenticates as, or None when it does not."""
        if not self.required:
            return ADMIN
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if self.token is not None:
            if scheme.lower() == "bearer" and same(value.strip(), self.token):
                return ADMIN
            if same(request.cookies.get(TOKEN_COOKIE, ""), self.token):
                return ADMIN
        if self.asks_basic and scheme.lower() == "basic":
            try:
                name, _, password = base64.b64decode(value).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return None
            return self._basic_user(name, password)
        return None

    def _basic_user(self, name: str, password: str) -> User | None:
        # Every account compared, names and passwords, always: how long this takes tells
        # nothing about which user exists or which half was wrong.
        found = None
        if self.basic is not None:
            ok_name, ok_password = same(name, self.basic[0]), same(password, self.basic[1])
            if ok_name and ok_password:
                found = User(self.basic[0], "admin")
        for account_name, account in self.accounts.items():
            ok_name, ok_password = same(name, account_name), same(password, account.password)
            if ok_name and ok_password:
                found = account.user
        return found


class SecurityMiddleware:
    """Refuses unauthenticated requests and adds the security headers to every response."""

    def __init__(self, app: ASGIApp, credentials: Credentials) -> None:
        self.app = app
        self.credentials = credentials

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        user = self.credentials.identify(request)
        if user is None:
            await self._refusal(request)(scope, receive, self._with_headers(send))
            return
        scope[USER_SCOPE_KEY] = user
        await self.app(scope, receive, self._with_headers(send))

    def _refusal(self, request: Request) -> Response:
        creds = self.credentials
        offered = request.query_params.get("token")
        if creds.token is not None and offered is not None and same(offered, creds.token):
            # Trade the token in the URL for a cookie, and drop it from the address bar.
            clean = URL(scope=request.scope).remove_query_params("token")
            response = RedirectResponse(str(clean), status_code=303)
            response.set_cookie(TOKEN_COOKIE, creds.token, httponly=True, samesite="strict",
                                path=request.scope.get("root_path") or "/")
            return response
        headers = {"www-authenticate": 'Basic realm="conveyor"'} if creds.asks_basic else {}
        return PlainTextResponse("authentication required", status_code=401, headers=headers)

    @staticmethod
    def _with_headers(send: Send) -> Callable[[Message], Awaitable[None]]:
        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        return wrapped


class Csrf:
    """Issues and checks CSRF tokens bound to a per-browser nonce cookie.

    :param secret: HMAC key; a fresh random one per process when None (tokens then last
        as long as the process)
    """

    def __init__(self, secret: bytes | None = None) -> None:
        self.secret = secret or secrets.token_bytes(32)

    def _sign(self, nonce: str) -> str:
        return hmac.new(self.secret, nonce.encode(), hashlib.sha256).hexdigest()

    def token(self, request: Request) -> tuple[str, str | None]:
        """The token for this browser's forms, and a new nonce to set as cookie (or None)."""
        nonce = request.cookies.get(CSRF_COOKIE)
        fresh = None
        if not nonce or len(nonce) > 128:
            nonce = fresh = secrets.token_urlsafe(24)
        return self._sign(nonce), fresh

    @staticmethod
    def set_cookie(request: Request, response: Response, nonce: str) -> None:
        response.set_cookie(CSRF_COOKIE, nonce, httponly=True, samesite="strict",
                            path=request.scope.get("root_path") or "/")

    def refusal(self, request: Request, form_token: str | None) -> str | None:
        """Why this POST must be refused, or None when it is ours."""
        host = request.headers.get("host", "")
        source = request.headers.get("origin") or request.headers.get("referer")
        if not source or source == "null":
            return "the request carries neither Origin nor Referer"
        if urlsplit(source).netloc != host:
            return "cross-site request"
        nonce = request.cookies.get(CSRF_COOKIE)
        if not nonce or not form_token or not same(form_token, self._sign(nonce)):
            return "missing or invalid CSRF token"
        return None


def user_of(request: Request) -> User:
    """The user the middleware authenticated (read-only when it left none: deny by default)."""
    user = request.scope.get(USER_SCOPE_KEY)
    return user if isinstance(user, User) else NOBODY
