from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

import conveyor
from helpers import RedisServer


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
