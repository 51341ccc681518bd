from __future__ import annotations

import gc
import os
import uuid
from collections.abc import Iterator

import pytest

import conveyor
from helpers import RedisCluster, RedisServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One private redis-server for the session; tests isolate by namespace."""
    server = RedisServer().start()
    yield server
    server.cleanup()


@pytest.fixture
def make_server() -> Iterator[type[RedisServer]]:
    """Start private servers a test may kill and restart; all are removed afterwards."""
    made: list[RedisServer] = []

    class Tracked(RedisServer):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            made.append(self)

    yield Tracked
    for server in made:
        server.cleanup()


@pytest.fixture
def namespace() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def app(redis_server: RedisServer, namespace: str) -> Iterator[conveyor.Conveyor]:
    application = conveyor.Conveyor(redis_server.url, namespace=namespace)
    yield application
    application.close()


@pytest.fixture(autouse=True)
def _no_env_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONVEYOR_REDIS_URL", raising=False)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")


# Tests on a Redis Cluster, where redis-py's asyncio Cluster client is known to leave
# sockets open: a topology refresh drops nodes and disconnects them in background tasks
# that nothing waits for (``NodesManager.set_nodes``). Warnings are errors everywhere else;
# in these tests unclosed sockets are not, and what they leave is collected as each ends,
# so that it cannot surface as an error in whichever test runs next.
CLUSTER_FIXTURES = frozenset({"cluster", "session_cluster", "capp", "tls_cluster"})


def _uses_cluster(item: pytest.Item) -> bool:
    if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("app_on_each") == "cluster"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _uses_cluster(item):
            item.add_marker(pytest.mark.filterwarnings("ignore::ResourceWarning"))
            item.add_marker(pytest.mark.filterwarnings(
                "ignore::pytest.PytestUnraisableExceptionWarning"))


@pytest.fixture(autouse=True)
def _collect_cluster_leftovers(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if _uses_cluster(request.node):
        gc.collect()  # under the test's own filters: see CLUSTER_FIXTURES


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    """A real 3-node Redis Cluster, one per test module that asks for it."""
    made = RedisCluster().start()
    yield made
    made.cleanup()


@pytest.fixture(scope="session")
def session_cluster() -> Iterator[RedisCluster]:
    """One 3-primary Cluster for the whole session, for tests that isolate by namespace."""
    made = RedisCluster().start()
    yield made
    made.cleanup()


@pytest.fixture(params=["server", "cluster"])
def app_on_each(request: pytest.FixtureRequest, redis_server: RedisServer,
                namespace: str) -> Iterator[conveyor.Conveyor]:
    """An app on the session's plain server, then on the session's Cluster: a test that
    takes it runs on both, and on the Cluster a script that touches a key outside its
    queue's hash slot fails (Redis refuses a cross-slot key in a script)."""
    url = (redis_server.url if request.param == "server"
           else request.getfixturevalue("session_cluster").url)
    application = conveyor.Conveyor(url, namespace=namespace)
    yield application
    application.close()


@pytest.fixture
def capp(cluster: RedisCluster) -> Iterator[conveyor.Conveyor]:
    """An app on the module's cluster, with a namespace of its own."""
    application = conveyor.Conveyor(cluster.url, namespace=f"t{uuid.uuid4().hex[:10]}")
    yield application
    application.close()
