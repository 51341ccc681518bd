"""Hooks around enqueue and runs: meta carried in the payload, and hooks that misbehave."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest

import conveyor
from conveyor import hooks, testing
from conveyor.encoding import Codec
from conveyor.errors import EncodingError
from helpers import running_worker, wait_until


def test_meta_travels_as_a_third_payload_element() -> None:
    codec = Codec()
    plain = codec.encode_args("t", (1,), {})
    assert codec.decode_args(plain) == ([1], {}) and codec.decode_meta(plain) == {}
    carried = codec.encode_args("t", (1,), {}, {"traceparent": "00-abc-def-01"})
    assert carried == b'[[1],{},{"traceparent":"00-abc-def-01"}]'
    assert codec.decode_args(carried) == ([1], {})
    assert codec.decode_meta(carried) == {"traceparent": "00-abc-def-01"}
    # Odd data in the spare field is ignored, never raised on.
    assert codec.decode_meta(b'[[1],{},["not","a","dict"]]') == {}
    assert codec.decode_meta(b'[[1],{},{"n":1,"s":"x"}]') == {"s": "x"}
    with pytest.raises(EncodingError):
        codec.decode_args(b"[[1],{},{},{}]")
    packed = Codec("msgpack")
    data = packed.encode_args("t", (), {"k": 2}, {"m": "v"})
    assert packed.decode_args(data) == ([], {"k": 2}) and packed.decode_meta(data) == {"m": "v"}


class Recorder(hooks.Hook):
    def __init__(self) -> None:
        self.attempts: list[hooks.Attempt] = []

    def enqueue(self, task: conveyor.Task[Any, Any], count: int, meta: dict[str, str]
                ) -> AbstractContextManager[None]:
        meta["origin"] = f"{task.name}x{count}"
        return super().enqueue(task, count, meta)

    def run(self, task: conveyor.Task[Any, Any], attempt: hooks.Attempt
            ) -> AbstractContextManager[None]:
        self.attempts.append(attempt)
        return super().run(task, attempt)


def test_hooks_see_meta_and_attempts_on_a_real_worker(app: conveyor.Conveyor) -> None:
    recorder = Recorder()
    app.hooks.append(recorder)

    @app.task(name="hooked", retries=1, backoff=0.01)
    async def hooked(n: int) -> int:
        if len(recorder.attempts) == 1:
            raise ValueError("first run fails")
        return n

    job = hooked.enqueue(3)
    infos = testing.drain(app, include_scheduled=True, timeout=60)
    assert [i.result for i in infos] == [3]
    assert [(a.job_id, a.attempt, a.max_attempts) for a in recorder.attempts] == [
        (job.id, 1, 2), (job.id, 2, 2)]
    assert all(a.meta == {"origin": "hookedx1"} and a.queue == "default"
               for a in recorder.attempts)


class Broken(hooks.Hook):
    def __init__(self, where: str) -> None:
        self.where = where

    @contextmanager
    def _fail(self) -> Iterator[None]:
        raise RuntimeError(f"hook broke in {self.where}")
        yield

    def enqueue(self, task: conveyor.Task[Any, Any], count: int, meta: dict[str, str]
                ) -> AbstractContextManager[None]:
        return self._fail() if self.where == "enqueue" else super().enqueue(task, count, meta)

    def run(self, task: conveyor.Task[Any, Any], attempt: hooks.Attempt
            ) -> AbstractContextManager[None]:
        return self._fail() if self.where == "run" else super().run(task, attempt)


def test_a_failing_enqueue_hook_writes_nothing(app: conveyor.Conveyor) -> None:
    @app.task
    def noop() -> None:
        return None

    app.hooks.append(Broken("enqueue"))
    with pytest.raises(RuntimeError, match="hook broke"):
        noop.enqueue()
    with pytest.raises(RuntimeError, match="hook broke"):
        noop.enqueue_many([(), ()])
    assert app.monitor.stats(queue="default").backlog.ready == 0


def test_a_failing_run_hook_fails_the_attempt_not_the_worker(app: conveyor.Conveyor) -> None:
    @app.task(retries=0)
    def noop() -> None:
        return None

    @app.task(retries=0)
    async def anoop() -> None:
        return None

    jobs = [noop.enqueue(), anoop.enqueue()]
    app.hooks.append(Broken("run"))
    infos = testing.drain(app, timeout=60)
    assert {i.id for i in infos} == set()  # the collector hook never ran: the broken one
    for job in jobs:                       # came first and raised
        info = job.info()
        assert info.state == conveyor.JobState.DEAD
        assert info.error is not None and "hook broke in run" in info.error


class Mourner(hooks.Hook):
    """Hears of dead jobs (asynchronously), and breaks on the first one."""

    def __init__(self) -> None:
        self.heard: list[str] = []

    async def dead(self, info: conveyor.JobInfo) -> None:
        self.heard.append(info.id)
        if len(self.heard) == 1:
            raise RuntimeError("a dead hook that fails is logged, and the others still hear")


def test_hooks_hear_of_dead_jobs_once_with_the_on_dead_callbacks(app: conveyor.Conveyor) -> None:
    mourner, called = Mourner(), []
    app.hooks.append(mourner)
    app.hooks.append(Recorder())  # does not override dead: not told (no record is read)
    app.on_dead(lambda info: called.append(info.id))

    @app.task(name="doomed", retries=0)
    def doomed(n: int) -> None:
        raise ValueError(f"job {n} fails on purpose")

    jobs = [doomed.enqueue(n) for n in range(2)]
    with running_worker(app, concurrency=2):
        wait_until(lambda: len(called) == 2 and len(mourner.heard) == 2, 10,
                   message="the dead hooks")
    assert sorted(mourner.heard) == sorted(called) == sorted(job.id for job in jobs)
