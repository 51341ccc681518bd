"""The web dashboard: ``create_app(app)`` returns an ASGI application (Starlette).

Run it with ``conveyor dashboard MODULE:APP`` or mount it in an existing ASGI app::

    from starlette.routing import Mount
    routes = [Mount("/conveyor", app=create_app(my_conveyor, token="s3cret"))]

Pages: ``/`` overview, ``/queues/<queue>`` queue detail and charts, ``/queues/<queue>/jobs``
scheduled / active / dead jobs with paging, ``/tasks`` task types, ``/jobs`` look-up,
``/jobs/<id>`` one job, ``/workflows/<id>`` one workflow (nodes grouped by state, a
cancel button), ``/workers`` the worker registry with the supervisors and their
latest decisions, ``/schedules`` periodic jobs.
Actions are forms that POST to ``/actions/<name>`` (``requeue``, ``purge``, ``cancel``,
``pause``, ``resume``, ``cancel_workflow``, ``limits``, ``signal``) with a CSRF token; see
:mod:`conveyor.web.security`. Which user may post which action, on which queues, is the
table of :mod:`conveyor.web.roles`; pages show only the forms their user may post.

JSON API (GET only; nothing under ``/api`` changes state; times are epoch seconds from
the Redis server's clock, durations seconds, rates per second; a figure that cannot be
had is ``null``):

``/api/overview``
    ``{time, totals: {ready, scheduled, active, suspended, dead, throughput}, workers:
    {count, capacity}, queues: [{name, paused, ready, scheduled, active, suspended, dead,
    throughput,
    wait_p95, advice: {workers_needed, eta_seconds, reasons} | null, spark: {t,
    processed, wait_p95}}], tasks: [{name, queue, active, idle, idle_since, idle_for,
    threshold}]}`` — throughput and wait p95 over the last minute, sparklines
    over ten minutes.
``/api/queues/<queue>?window=900``
    ``{name, time, window, backlog, stats: {enqueued, started, succeeded, failed,
    retried, dead, throughput, failure_rate, wait: {mean, p50, p95, p99}, run: {...}},
    advice, flow: {limits: {concurrency, rate, tenant_concurrency, tenant_rate, tenants},
    paused, running, held, blocked_by, held_tenants: [{tenant, held, running}]},
    priorities: [{priority, ready, tenant_count, hidden, tenants: [{tenant,
    ready}]}], top_tenants: [{tenant, ready}]}``. ``window`` is snapped to 300, 900, 3600
    or 10800 seconds.
``/api/queues/<queue>/series?window=900``
    ``{window, step, t, processed, failed, enqueued, wait_p50, wait_p95, wait_p99,
    run_p50, run_p95, run_p99}``: parallel arrays, one point per ``step`` seconds.
``/api/queues/<queue>/jobs?state=dead&offset=0&limit=50``
    ``{queue, state, total, offset, limit, jobs: [job + {due}]}``; ``state`` is
    ``scheduled`` (soonest first), ``active``, ``suspended`` (in no order; ``due``: when
    the job was enqueued) or ``dead`` (newest first).
``/api/tasks?window=900``
    ``{window, tasks: [{name, queue, registered, active, idle, idle_since, idle_for,
    threshold, enqueued, ..., throughput, failure_rate, wait, run}]}``.
``/api/jobs/<id>``
    the job record (fields of :class:`conveyor.JobInfo`) with ``args`` and ``kwargs``;
    404 with ``{error}`` when there is no such job.
``/api/workflows/<id>``
    ``{id, state, counts, nodes: [job + {name, after}], groups: [{state, nodes}]}``: the
    workflow (``state`` running, succeeded, failed or cancelled) and its nodes, also
    grouped by job state; 404 with ``{error}`` when there is no such workflow.
``/api/workers``
    ``{time, capacity, workers: [{id, last_seen, age, host, pid, queues, concurrency,
    jobs, processed, started_at, supervisor, fields}], supervisors: [...]}``: live
    workers, most recent heartbeat first, and the supervisors as below (ten decisions
    each).
``/api/supervisors?decisions=10``
    ``{time, supervisors: [{id, last_seen, age, host, pid, queues, concurrency, children,
    active, target, min, max, target_wait, ready, rate, p95_wait, processed, started_at,
    fields, decisions: [{at, kind, from, to, text}]}]}``: live worker supervisors as they
    last published themselves (``children`` processes, ``active`` of them not draining,
    ``target`` the count it scales to, ``min``/``max``/``target_wait`` ``null`` unless it
    autoscales; ``ready``, ``rate`` and ``p95_wait`` the queue signals it last read) with
    their latest ``decisions`` (0 to 50; newest first). A decision's ``kind`` is
    ``scale out``, ``scale in``, ``restart``, ``replace`` or ``recycle``; ``from`` and
    ``to`` are process counts (``null`` unless it scaled); ``text`` says why.
``/api/schedules``
    ``{time, schedules: [{task, queue, cron, next, last}]}``: ``last`` is the latest tick
    that fired, ``null`` until one has (a worker's first start records the current tick
    without firing it).

While Redis cannot be reached, every endpoint answers 503 with ``{error: "redis
unavailable", detail}`` (``detail`` names the URL without its password, the cause and what
to check), and pages show the same in a banner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from . import filters, roles
from .actions import Actions
from .api import Api
from .outage import CAUGHT, Outage
from .pages import Pages
from .security import Credentials, Csrf, SecurityMiddleware

if TYPE_CHECKING:
    from ..app import Conveyor

__all__ = ["create_app"]

HERE = Path(__file__).parent


def create_app(
    app: Conveyor,
    *,
    token: str | None = None,
    username: str | None = None,
    password: str | None = None,
    users: Mapping[str, tuple[str, str] | tuple[str, str, Sequence[str]]] | None = None,
    secret: bytes | None = None,
    cache_seconds: float = 1.0,
) -> Starlette:
    """The dashboard of ``app`` as an ASGI application.

    With none of ``token``, ``username`` and ``users``, the dashboard is open: whoever
    reaches it is an admin. ``token`` and ``username``/``password`` also let in an admin
    over every queue; ``users`` lets in users by HTTP basic authentication, each with its
    role. They combine: a request is let in by any of them. ::

        create_app(app, users={"ann": ("secret", "admin"), "bob": ("pw", "readonly"),
                               "cy": ("pw2", "operator", ["emails"])})

    Roles: ``readonly`` (pages and API), ``operator`` (also requeue, cancel a job or a
    workflow, pause, resume, signal), ``admin`` (also purge, set limits). A role given
    queues may act only on those; it still reads every queue. See
    :mod:`conveyor.web.roles`.

    :param app: the conveyor application to show (its Redis, queues and tasks)
    :param token: when set, a request presenting it (bearer header, or a cookie set by
        opening a page once with ``?token=...``) is an admin
    :param username: with ``password``, HTTP basic-auth credentials of an admin
    :param password: see ``username``
    :param users: user name -> ``(password, role)`` or ``(password, role, queues)``, users
        of HTTP basic authentication
    :param secret: key of the CSRF tokens; random per process when None
    :param cache_seconds: how long an answer of a polled JSON endpoint (overview, tasks,
        workers, a queue and its series) is shared by every client asking the same, so
        that many open dashboards cost Redis what one costs (0: never shared)
    :raises ValueError: ``username`` without ``password`` (or the reverse); an entry of
        ``users`` with an unknown role, an empty password, a bad shape or bad queues (the
        message names the user); a user named as ``username``;
        an empty ``users``
    """
    if (username is None) != (password is None):
        raise ValueError("give both username and password for basic authentication, or neither")
    basic = (username, password) if username is not None and password is not None else None
    accounts = roles.accounts(users) if users is not None else {}
    if basic is not None and basic[0] in accounts:
        raise ValueError(f"user {basic[0]!r} is given both as username and in users")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every value rendered as text, whatever it holds
        undefined=jinja2.StrictUndefined,
    )
    filters.install(env)
    templates = Jinja2Templates(env=env)
    csrf = Csrf(secret)
    routes = [
        *Pages(app, templates, csrf).routes(),
        *Actions(app, csrf).routes(),
        *Api(app, cache_seconds).routes(),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
    ]
    credentials = Credentials(token, basic, accounts)
    middleware = [Middleware(SecurityMiddleware, credentials=credentials)]
    outage = Outage(app, templates)
    return Starlette(routes=routes, middleware=middleware,
                     exception_handlers={kind: outage for kind in CAUGHT})
