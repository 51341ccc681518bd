"""The ACL rules of `conveyor acl`: each role, as a real Redis user, does what it needs and
is refused (NOPERM) what it must not do."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner

import conveyor
from conveyor import acl
from conveyor.cli import main
from conveyor.scripts import calls
from helpers import RedisServer, running_worker, wait_until

PASSWORD = "s3cret-pw"


class Users:
    """A private server on which the default user makes one ACL user per role."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.apps: list[conveyor.Conveyor] = []

    def app(self, role: str, namespace: str = "shop") -> conveyor.Conveyor:
        """An app of ``namespace`` connected as a new user of ``role``."""
        user = f"{role}-{uuid.uuid4().hex[:6]}"
        admin = self.server.client()
        try:
            admin.execute_command(*acl.setuser_command(user, PASSWORD, role, namespace))
        finally:
            admin.close()
        made = conveyor.Conveyor(f"redis://{user}:{PASSWORD}@127.0.0.1:{self.server.port}/0",
                                 namespace=namespace)
        self.apps.append(made)
        return made

    def denials(self) -> list[dict[str, Any]]:
        """What the server refused, newest first (ACL LOG)."""
        admin = self.server.client()
        try:
            return list(admin.acl_log())
        finally:
            admin.close()

    def close(self) -> None:
        for made in self.apps:
            made.close()


@pytest.fixture
def users(make_server: type[RedisServer]) -> Iterator[Users]:
    made = Users(make_server().start())
    yield made
    made.close()


# A command refused inside a script: Redis 7.0 words it without the NOPERM prefix that a
# refused command sent by the client has (NoPermissionError in redis-py); Redis 7.2 and
# Valkey 8 say "ACL failure in script: No permissions to access a key" (or a command).
REFUSED_IN_SCRIPT = ("The user executing the script can't", "NOPERM",
                     "ACL failure in script: No permissions")


def refused(action: Callable[[], Any]) -> str:
    """Run ``action``, which must fail as Redis refuses a command or key to the user (ACL);
    the error text."""
    with pytest.raises(redis.exceptions.ResponseError) as caught:
        action()
    text = str(caught.value)
    assert isinstance(caught.value, redis.exceptions.NoPermissionError) or any(
        words in text for words in REFUSED_IN_SCRIPT), text
    return text


def tasks(app: conveyor.Conveyor) -> dict[str, conveyor.Task[Any, Any]]:
    """The tasks ``double`` and ``boom`` (dead at once) of ``app``, registered once."""
    if "double" in app.tasks:
        return {"double": app.tasks["double"], "boom": app.tasks["boom"]}

    @app.task(name="double")
    def double(x: int) -> int:
        return 2 * x

    @app.task(name="boom", retries=0)
    def boom() -> None:
        raise conveyor.Fail("no")

    return {"double": double, "boom": boom}


def test_unknown_role_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="producer, worker, dashboard-readonly"):
        acl.rules("root", "shop")


def test_producer_enqueues_and_reads_but_cannot_fetch_or_purge(users: Users) -> None:
    admin = users.app("admin")
    producer = users.app("producer")
    t = tasks(producer)
    job = t["double"].enqueue(2)
    many = t["double"].enqueue_many([(i,) for i in range(5)])
    later = t["double"].options(delay=60).enqueue(3)
    keyed = t["double"].options(key="k1").enqueue(4)
    again = t["double"].options(key="k1").enqueue(4)
    debounced = t["double"].options(key="d1", debounce=30).enqueue(5)
    wf = producer.workflow()
    first = wf.add(t["double"], 1, name="a")
    wf.add(t["double"], 2, name="b", after=[first])
    handle = wf.enqueue()
    assert job.info().state == conveyor.JobState.READY
    assert later.info().state == conveyor.JobState.SCHEDULED
    assert again.id == keyed.id and len(many) == 5 and debounced.info() is not None
    assert handle.info().nodes
    k = producer.keys("default")
    refused(lambda: producer.scripts.run(calls.fetch(k, 10, producer.limits)))
    refused(lambda: producer.dead_letters("default").purge())
    refused(lambda: producer.queue("default").purge_ready())
    # The admin's worker runs what the producer stored, and the producer reads the result.
    tasks(admin)
    with running_worker(admin, queues=["default"]):
        assert job.result(timeout=10) == 4


def test_worker_runs_jobs_retries_periodics_and_progress(users: Users,
                                                         caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    producer, worker_app = users.app("producer"), users.app("worker")
    ticks: list[int] = []
    attempts: list[int] = []

    for app in (producer, worker_app):
        @app.task(name="flaky", retries=2, backoff=0)
        def flaky() -> str:
            attempts.append(1)
            if len(attempts) < 2:
                raise RuntimeError("first time fails")
            conveyor.current_job().progress(0.5, "half")
            return "ok"

    @worker_app.periodic("* * * * * *", queue="cron", name="tick")
    def tick() -> None:
        ticks.append(1)

    job = producer.tasks["flaky"].enqueue()
    with caplog.at_level(logging.INFO, logger="conveyor.worker"), \
            running_worker(worker_app, queues=["default", "cron"]):
        assert job.result(timeout=15) == "ok"
        wait_until(lambda: ticks, 10, message="a periodic tick")
    assert job.info().state == conveyor.JobState.SUCCEEDED and len(attempts) == 2
    refused(lambda: worker_app.queue("default").set_limits(concurrency=3))
    refused(lambda: worker_app.queue("default").pause())


def dead_job(producer: conveyor.Conveyor, admin: conveyor.Conveyor) -> conveyor.Job[Any]:
    """A job of the task ``boom`` run to its death by the admin's worker."""
    tasks(admin)
    job = tasks(producer)["boom"].enqueue()
    with running_worker(admin, queues=["default"]):
        wait_until(lambda: job.info().state == conveyor.JobState.DEAD, 10, message="dead")
    return job


def test_dashboard_readonly_reads_every_page_and_writes_nothing(users: Users) -> None:
    from starlette.testclient import TestClient

    from conveyor.web import create_app

    admin, producer, reader = users.app("admin"), users.app("producer"), users.app(
        "dashboard-readonly")
    job = dead_job(producer, admin)
    ready = tasks(producer)["double"].enqueue(1)
    tasks(reader)
    monitor = reader.monitor
    monitor.overview()
    monitor.backlog("default")
    monitor.stats(queue="default")
    monitor.stats_by_task()
    monitor.activity()
    monitor.workers()
    monitor.supervisors()
    monitor.schedules()
    monitor.series("default")
    monitor.flow("default")
    monitor.job_detail(job.id)
    monitor.jobs("default", "dead")
    assert reader.job(ready.id).info().state == conveyor.JobState.READY
    with TestClient(create_app(reader, cache_seconds=0), follow_redirects=False) as web:
        for path in ("/", "/queues/default", "/queues/default/jobs?state=dead", "/tasks",
                     "/jobs", f"/jobs/{job.id}", "/workers", "/schedules", "/api/overview",
                     "/api/tasks", "/api/workers", "/api/supervisors", "/api/schedules",
                     "/api/queues/default", "/api/queues/default/series",
                     "/api/queues/default/jobs?state=dead", f"/api/jobs/{job.id}"):
            assert web.get(path).status_code == 200, path
    refused(lambda: tasks(reader)["double"].enqueue(1))
    refused(lambda: reader.dead_letters("default").purge())
    refused(lambda: reader.job(ready.id).cancel())
    refused(lambda: reader.redis.set(reader.keys("default").paused, 1))
    refused(lambda: reader.redis.set(f"{reader.namespace}:queues", 1))


def test_operator_requeues_cancels_pauses_but_cannot_purge(users: Users) -> None:
    admin, producer, operator = (users.app("admin"), users.app("producer"),
                                 users.app("operator"))
    job = dead_job(producer, admin)
    dead = operator.dead_letters("default")
    refused(dead.purge)
    assert [info.id for info in dead.list()] == [job.id]  # the refused purge deleted nothing
    assert dead.requeue(job.id) == 1
    assert job.info().state == conveyor.JobState.READY
    assert operator.job(job.id).cancel() is True
    assert job.info().state == conveyor.JobState.CANCELLED
    queue = operator.queue("default")
    queue.pause()
    assert queue.is_paused()
    queue.resume()
    assert not queue.is_paused()
    refused(lambda: queue.set_limits(concurrency=2))


def test_admin_purges_and_sets_limits(users: Users) -> None:
    admin, producer = users.app("admin"), users.app("producer")
    dead_job(producer, admin)
    assert admin.dead_letters("default").purge() == 1
    assert admin.queue("default").set_limits(concurrency=2).concurrency == 2
    tasks(producer)["double"].enqueue(1)
    assert admin.queue("default").purge_ready() == 1


@pytest.mark.parametrize("role", acl.ROLES)
def test_a_namespace_user_cannot_read_another_namespace(users: Users, role: str) -> None:
    other = users.app("admin", namespace="b")
    job = tasks(other)["double"].enqueue(1)
    mine = users.app(role, namespace="a")
    refused(lambda: mine.redis.hgetall(other.keys("default").job_prefix + job.id.split("~")[1]))
    refused(lambda: mine.redis.smembers("b:queues"))
    refused(lambda: mine.redis.keys("*"))


def test_the_cli_prints_rules_and_a_setuser_line_without_the_password(
        monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    out = runner.invoke(main, ["acl", "--role", "operator", "--namespace", "shop"])
    assert out.exit_code == 0, out.output
    assert out.output.splitlines() == acl.rules("operator", "shop")
    line = runner.invoke(main, ["acl", "--role", "producer", "--namespace", "shop",
                                "--user", "shop-producer"])
    assert line.output.startswith("ACL SETUSER shop-producer reset on >PASSWORD ")
    monkeypatch.setenv("SHOP_PW", "hunter2")
    given = runner.invoke(main, ["acl", "--role", "worker", "--user", "w",
                                 "--password-env", "SHOP_PW", "--format", "command"])
    assert ">hunter2" in given.output and "~{conveyor:*}:leases" in given.output
    bad = runner.invoke(main, ["acl", "--role", "root"])
    assert bad.exit_code != 0 and "dashboard-readonly" in bad.output
