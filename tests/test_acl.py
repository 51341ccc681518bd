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
# refused command sent by the client has (NoPermissionError in redis-py).
REFUSED_IN_SCRIPT = ("The user executing the script can't", "NOPERM")


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
