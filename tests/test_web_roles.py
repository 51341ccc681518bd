"""Dashboard roles through the ASGI app against a real Redis: every state-changing route
for every role as the rule table says, deny by default, queue limits, the forms each role
sees, and the checks of a ``users=`` mapping."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from starlette.applications import Starlette
from starlette.routing import Mount, Route

with warnings.catch_warnings():  # starlette nudges towards httpx2; httpx is what we have
    warnings.filterwarnings("ignore", "Using `httpx`")
    from starlette.testclient import TestClient

import conveyor
from conveyor import testing
from conveyor.cli import main
from conveyor.cli.dashboard import read_users_file
from conveyor.web import create_app
from conveyor.web.actions import Actions
from conveyor.web.filters import segment
from conveyor.web.roles import ROLES, RULES
from conveyor.web.security import CSRF_COOKIE

SECRET = b"k" * 32  # the CSRF key, so that a test can sign a token for any browser
PASSWORDS = {"ann": "ann-pw", "ola": "ola-pw", "rob": "rob-pw", "lim": "lim-pw"}
USERS: dict[str, Any] = {
    "ann": (PASSWORDS["ann"], "admin"),
    "ola": (PASSWORDS["ola"], "operator"),
    "rob": (PASSWORDS["rob"], "readonly"),
    "lim": (PASSWORDS["lim"], "operator", ["mail"]),
}
BY_ROLE = {"admin": "ann", "operator": "ola", "readonly": "rob"}
SAME = {"origin": "http://testserver"}


class Jobs:
    """The tasks a test makes jobs of, registered once per app."""

    def __init__(self, app: conveyor.Conveyor) -> None:
        self.app = app

        @app.task(name="roles.bounce", retries=0)
        def bounce() -> None:
            raise RuntimeError("relay said no")

        @app.task(name="roles.later")
        def later() -> None: ...

        self.bounce, self.later = bounce, later

    def dead(self, queue: str = "mail") -> conveyor.Job[Any]:
        job = self.bounce.options(queue=queue).enqueue()
        testing.drain(self.app, queues=[queue])
        assert job.info().state == conveyor.JobState.DEAD
        return job

    def waiting(self, queue: str = "mail") -> conveyor.Job[Any]:
        return self.later.options(queue=queue, delay=600).enqueue()

    def workflow(self, *queues: str) -> conveyor.WorkflowHandle:
        wf = self.app.workflow()
        previous = None
        for i, queue in enumerate(queues):
            node = self.later.options(queue=queue, delay=600)
            previous = wf.add(node, name=f"n{i}", after=[previous] if previous else [])
        return wf.enqueue()


@pytest.fixture
def web(app: conveyor.Conveyor) -> Starlette:
    return create_app(app, users=USERS, secret=SECRET, cache_seconds=0)


@pytest.fixture
def jobs(app: conveyor.Conveyor) -> Jobs:
    return Jobs(app)


@pytest.fixture
def as_user(web: Starlette) -> Iterator[Callable[[str], TestClient]]:
    """``as_user(name)``: a browser of its own, logged in as that user."""
    clients: list[TestClient] = []

    def make(name: str) -> TestClient:
        client = TestClient(web, follow_redirects=False)
        client.auth = (name, PASSWORDS[name])
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def post(client: TestClient, action: str, **form: str) -> Any:
    """POST an action as the dashboard's own form would, with a valid CSRF token even when
    the user's pages show no form: what is tried here is the role check alone."""
    if CSRF_COOKIE not in client.cookies:
        assert client.get("/").status_code == 200
    nonce = client.cookies[CSRF_COOKIE]
    token = hmac.new(SECRET, nonce.encode(), hashlib.sha256).hexdigest()
    return client.post(f"/actions/{action}", data={"csrf": token, "next": "/", **form},
                       headers=SAME)


# -- every state-changing route, every role ----------------------------------------------


def state_changing_routes(web: Starlette) -> list[Route]:
    """Every route of the app that accepts a method other than GET and HEAD."""
    found: list[Route] = []
    for route in web.routes:
        if isinstance(route, Mount):
            assert not isinstance(route.app, Starlette), f"{route.path}: look inside it too"
            continue
        assert isinstance(route, Route), route
        if set(route.methods or ()) - {"GET", "HEAD"}:
            found.append(route)
    return found


def action_names(web: Starlette) -> list[str]:
    """Every action the app's state-changing routes serve: the names of the action
    endpoint, and a path of any other such route (which has no rule, and so must be
    refused)."""
    names: list[str] = []
    for route in state_changing_routes(web):
        endpoint = route.endpoint
        owner = getattr(endpoint, "__self__", None)
        if route.path == "/actions/{action}" and isinstance(owner, Actions):
            names.extend(owner.handlers)
        else:
            names.append(route.path)
    return names


Prepared = tuple[dict[str, str], Callable[[], bool]]  # the form, and "did it happen?"


def prepare(app: conveyor.Conveyor, jobs: Jobs, action: str) -> Prepared:
    """A form for ``action`` on queue mail, and how to tell it took effect."""
    if action == "requeue":
        dead = jobs.dead()
        return ({"queue": "mail", "job_id": dead.id},
                lambda: dead.info().state == conveyor.JobState.READY)
    if action == "purge":
        jobs.dead()
        return {"queue": "mail"}, lambda: len(app.dead_letters("mail")) == 0
    if action == "cancel":
        job = jobs.waiting()
        return {"job_id": job.id}, lambda: job.info().state == conveyor.JobState.CANCELLED
    if action == "cancel_workflow":
        handle = jobs.workflow("mail", "mail")
        return {"job_id": handle.id}, lambda: handle.info().state == "cancelled"
    if action == "pause":
        app.resume("mail")
        return {"queue": "mail"}, lambda: app.is_paused("mail")
    if action == "resume":
        app.pause("mail")
        return {"queue": "mail"}, lambda: not app.is_paused("mail")
    if action == "signal":
        job = jobs.waiting()
        record = app.keys("mail").job(job.short_id)
        return ({"job_id": job.id, "name": "go", "data": "1"},
                lambda: bool(app.redis.hexists(record, "sig:go")))  # kept in its mailbox
    if action == "limits":
        app.queue("mail").set_limits(concurrency=None)
        return ({"queue": "mail", "concurrency": "3"},
                lambda: app.queue("mail").limits().concurrency == 3)
    raise AssertionError(f"this test does not know how to try action {action!r}: teach it")


def test_every_state_changing_route_has_a_rule(web: Starlette) -> None:
    names = action_names(web)
    assert names, "no state-changing route found: did the router change shape?"
    missing = [n for n in names if n not in RULES]
    assert not missing, f"state-changing routes without a rule in roles.RULES: {missing}"
    assert set(RULES) == set(names), "a rule for an action that does not exist"


@pytest.mark.parametrize("role", ROLES)
def test_each_role_may_do_what_the_table_says(app: conveyor.Conveyor, web: Starlette,
                                              jobs: Jobs, as_user: Any, role: str) -> None:
    client = as_user(BY_ROLE[role])
    for action in action_names(web):
        form, happened = prepare(app, jobs, action)
        answer = post(client, action, **form)
        allowed = ROLES.index(role) >= ROLES.index(RULES[action])
        if allowed:
            assert answer.status_code == 303, (action, answer.text)
            assert "bad-" not in answer.headers["location"], (action, answer.headers)
            assert happened(), f"{role} {action}: answered {answer.headers['location']}"
        else:
            assert answer.status_code == 403, (action, answer.status_code)
            assert f"needs role {RULES[action]}" in answer.text, answer.text
            assert not happened(), f"{role} was refused {action}, yet it happened"


def test_an_action_without_a_rule_is_refused_even_to_an_admin(app: conveyor.Conveyor,
                                                              web: Starlette,
                                                              as_user: Any) -> None:
    (route,) = [r for r in state_changing_routes(web) if r.path == "/actions/{action}"]
    actions = route.endpoint.__self__  # type: ignore[attr-defined]
    ran: list[dict[str, str]] = []
    actions.handlers["explode"] = lambda form: (ran.append(form), ("paused", 1))[1]
    answer = post(as_user("ann"), "explode", queue="mail")
    assert answer.status_code == 403 and "no permission rule" in answer.text
    assert not ran
    unknown = post(as_user("ann"), "nonesuch", queue="mail")
    assert unknown.status_code == 403


# -- queue limits ------------------------------------------------------------------------


def test_a_queue_limited_operator_acts_only_on_its_queues(app: conveyor.Conveyor,
                                                          jobs: Jobs, as_user: Any) -> None:
    lim = as_user("lim")
    mine, theirs = jobs.waiting("mail"), jobs.waiting("billing")
    assert post(lim, "cancel", job_id=mine.id).status_code == 303
    assert mine.info().state == conveyor.JobState.CANCELLED
    refused = post(lim, "cancel", job_id=theirs.id)
    assert refused.status_code == 403 and "billing" in refused.text
    assert theirs.info().state == conveyor.JobState.SCHEDULED
    assert post(lim, "pause", queue="billing").status_code == 403
    assert not app.is_paused("billing")
    assert post(lim, "pause", queue="mail").status_code == 303 and app.is_paused("mail")
    # a job id naming another queue than the form's: both must be the user's
    dead = jobs.dead("billing")
    assert post(lim, "requeue", queue="mail", job_id=dead.id).status_code == 403
    # a request naming no queue at all is refused, not guessed
    assert post(lim, "pause").status_code == 403
    # its role still bounds it: no purge on its own queue either
    assert "needs role admin" in post(lim, "purge", queue="mail").text
    # a workflow is the user's only when every node's queue is
    spread, home = jobs.workflow("mail", "billing"), jobs.workflow("mail", "mail")
    assert post(lim, "cancel_workflow", job_id=spread.id).status_code == 403
    assert spread.info().state == "running"
    assert post(lim, "cancel_workflow", job_id=home.id).status_code == 303
    assert home.info().state == "cancelled"
    # reading is not limited
    assert lim.get("/queues/billing").status_code == 200
    assert lim.get(f"/api/jobs/{theirs.id}").status_code == 200


# -- what each role sees -----------------------------------------------------------------


def forms_on(client: TestClient, path: str) -> set[str]:
    """The actions of the POST forms on a page."""
    page = client.get(path)
    assert page.status_code == 200, path
    return set(re.findall(r'<form method="post" action="/actions/([a-z_]+)"', page.text))


def test_pages_show_only_the_forms_a_role_may_post(app: conveyor.Conveyor, jobs: Jobs,
                                                   as_user: Any) -> None:
    dead, waiting = jobs.dead(), jobs.waiting()
    handle = jobs.workflow("mail", "billing")
    other = jobs.waiting("billing")
    pages = ["/queues/mail", "/queues/mail/jobs?state=dead", "/queues/mail/jobs?state=scheduled",
             f"/jobs/{dead.id}", f"/jobs/{waiting.id}", f"/workflows/{segment(handle.id)}",
             "/", "/jobs", "/tasks", "/workers", "/schedules"]
    rob = as_user("rob")
    for path in pages:
        assert forms_on(rob, path) == set(), path
    assert 'id="role"' in rob.get("/").text and "rob: readonly" in rob.get("/").text

    ola, ann = as_user("ola"), as_user("ann")
    assert forms_on(ola, "/queues/mail") == {"pause", "requeue"}
    assert forms_on(ann, "/queues/mail") == {"pause", "requeue", "purge", "limits"}
    assert forms_on(ola, "/queues/mail/jobs?state=dead") == {"requeue"}
    assert forms_on(ann, "/queues/mail/jobs?state=dead") == {"requeue", "purge"}
    assert forms_on(ola, f"/jobs/{waiting.id}") == {"cancel", "signal"}
    assert forms_on(ola, f"/workflows/{segment(handle.id)}") == {"cancel_workflow"}

    lim = as_user("lim")
    assert forms_on(lim, "/queues/mail") == {"pause", "requeue"}
    assert forms_on(lim, "/queues/billing") == set()
    assert forms_on(lim, f"/jobs/{other.id}") == set()
    assert forms_on(lim, f"/jobs/{waiting.id}") == {"cancel", "signal"}
    assert forms_on(lim, f"/workflows/{segment(handle.id)}") == set()  # it spans billing
    assert "lim: operator on mail" in lim.get("/").text


# -- authentication ----------------------------------------------------------------------


def test_users_authenticate_by_basic_auth(web: Starlette) -> None:
    with TestClient(web) as client:
        refused = client.get("/")
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Basic")
        assert client.get("/", auth=("ann", "wrong")).status_code == 401
        assert client.get("/", auth=("ann", PASSWORDS["rob"])).status_code == 401
        assert client.get("/", auth=("nobody", "ann-pw")).status_code == 401
        assert client.get("/api/overview", auth=("nobody", "x")).status_code == 401
        assert client.get("/", auth=("rob", PASSWORDS["rob"])).status_code == 200
        assert client.get("/api/overview", auth=("rob", PASSWORDS["rob"])).status_code == 200


def test_token_and_username_still_mean_admin_beside_users(app: conveyor.Conveyor,
                                                          jobs: Jobs) -> None:
    web = create_app(app, token="t0k", username="ops", password="pa:ss",
                     users={"rob": ("rob-pw", "readonly")}, secret=SECRET)
    jobs.dead()
    with TestClient(web, follow_redirects=False) as client:
        client.auth = ("ops", "pa:ss")
        assert post(client, "purge", queue="mail").status_code == 303
        assert len(app.dead_letters("mail")) == 0
        client.auth = ("rob", "rob-pw")
        assert post(client, "pause", queue="mail").status_code == 403
    with TestClient(web, follow_redirects=False,
                    headers={"authorization": "Bearer t0k"}) as client:
        assert post(client, "pause", queue="mail").status_code == 303
    with pytest.raises(ValueError, match="'ops'"):
        create_app(app, username="ops", password="x", users={"ops": ("y", "admin")})


@pytest.mark.parametrize(("users", "words"), [
    ({"ann": ("pw", "root")}, ["'ann'", "unknown role 'root'"]),
    ({"ann": ("", "admin")}, ["'ann'", "password"]),
    ({"ann": (None, "admin")}, ["'ann'", "password"]),
    ({"ann": ("pw",)}, ["'ann'", "(password, role)"]),
    ({"ann": ("pw", "admin", ["a"], "x")}, ["'ann'", "(password, role)"]),
    ({"ann": "pw"}, ["'ann'", "(password, role)"]),
    ({"ann": ("pw", "operator", "emails")}, ["'ann'", "queues"]),
    ({"ann": ("pw", "operator", [])}, ["'ann'", "queues"]),
    ({"ann": ("pw", "operator", ["ok", ""])}, ["'ann'", "queues"]),
    ({"a:b": ("pw", "admin")}, ["'a:b'", "user name"]),
    ({"": ("pw", "admin")}, ["''", "user name"]),
    ({}, ["empty"]),
    ([("ann", ("pw", "admin"))], ["mapping"]),
])
def test_a_bad_users_mapping_is_refused_at_construction(app: conveyor.Conveyor, users: Any,
                                                        words: list[str]) -> None:
    with pytest.raises(ValueError) as caught:
        create_app(app, users=users)
    for word in words:
        assert word in str(caught.value)


# -- the CLI's users file ----------------------------------------------------------------


def test_cli_users_file_json_and_toml(app: conveyor.Conveyor, tmp_path: Path) -> None:
    as_json = tmp_path / "users.json"
    as_json.write_text(json.dumps({"ann": {"password": "a", "role": "admin"},
                                   "lim": {"password": "l", "role": "operator",
                                           "queues": ["mail"]}}))
    as_json.chmod(0o600)
    users = read_users_file(as_json)
    assert users == {"ann": ("a", "admin"), "lim": ("l", "operator", ["mail"])}
    web = create_app(app, users=users)
    with TestClient(web) as client:
        assert client.get("/", auth=("lim", "l")).status_code == 200
    as_toml = tmp_path / "users.toml"
    as_toml.write_text('[rob]\npassword = "r"\nrole = "readonly"\n')
    as_toml.chmod(0o600)
    assert read_users_file(as_toml) == {"rob": ("r", "readonly")}


@pytest.mark.parametrize(("text", "says"), [
    ('{"ann": {"password": "a", "role": "root"}}', "unknown role 'root'"),
    ('{"ann": {"password": "a", "role": "admin", "pw": "x"}}', "user 'ann' must be"),
    ('{"ann": {"role": "admin"}}', "user 'ann': the password"),
    ('["ann"]', "expected an object"),
    ("{nope", "cannot read users file"),
])
def test_cli_refuses_a_bad_users_file(app: conveyor.Conveyor, tmp_path: Path, text: str,
                                      says: str) -> None:
    path = tmp_path / "users.json"
    path.write_text(text)
    path.chmod(0o600)
    result = CliRunner().invoke(main, ["dashboard", "--url", app.url, "--users-file",
                                       str(path)])
    assert result.exit_code == 2 and says in result.output, result.output


def test_cli_warns_of_a_users_file_others_may_read(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    path.write_text('{"ann": {"password": "a", "role": "admin"}}')
    path.chmod(0o644)
    result = CliRunner().invoke(click.Command("read", callback=lambda: read_users_file(path)))
    assert result.exit_code == 0 and "others may read it" in result.output
