"""Which failures are retried: ``retry_on``, ``no_retry_on`` and ``conveyor.Fail``.

Each case runs a real worker on a real redis-server: a job whose failure the policy
refuses ends dead at that attempt (not after its retries), with the reason, and the
``on_dead`` callbacks hear of it once.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import conveyor
from conveyor import testing
from helpers import running_worker, wait_until


class _Script:
    """What a task raises on each attempt, counted (the task may run on a thread)."""

    def __init__(self, *raises: BaseException | None) -> None:
        self.raises = raises
        self.runs = 0
        self._lock = threading.Lock()

    def step(self) -> str:
        with self._lock:
            self.runs += 1
            exc = self.raises[min(self.runs, len(self.raises)) - 1]
        if exc is not None:
            raise exc
        return "done"


def _run_to_end(app: conveyor.Conveyor, task: Any) -> tuple[conveyor.JobInfo, Counter[str]]:
    """Enqueue one job of ``task``, run a worker until it is finished and its ``on_dead``
    callbacks (if any) have run; the final record and how often each job was heard dead."""
    dead: Counter[str] = Counter()
    app.on_dead(lambda info: dead.update([info.id]))
    with running_worker(app, queues=["q"], concurrency=2):
        job = task.enqueue()
        info = wait_until(lambda: (i := job.info()).state.finished and i, 20,
                          message="the job to finish")
        if info.state == "dead":
            wait_until(lambda: dead[job.id], 10, message="on_dead")
    return info, dead  # the worker has stopped: no callback can come later


def _task(app: conveyor.Conveyor, script: _Script, is_async: bool, **options: Any) -> Any:
    if is_async:
        async def run_async() -> str:
            await asyncio.sleep(0)
            return script.step()
        fn: Callable[[], Any] = run_async
    else:
        def run_sync() -> str:
            return script.step()
        fn = run_sync
    return app.task(name="policy", queue="q", backoff=0.01, **options)(fn)


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_retry_on_retries_those_and_their_subclasses_and_nothing_else(
        app: conveyor.Conveyor, is_async: bool) -> None:
    script = _Script(ConnectionResetError("reset"), TimeoutError("slow"), KeyError("gone"))
    task = _task(app, script, is_async, retries=5, retry_on=(TimeoutError, ConnectionError))
    info, dead = _run_to_end(app, task)
    assert info.state == "dead" and info.attempts == 3 and script.runs == 3
    assert info.error is not None and info.error.startswith("KeyError: 'gone'")
    assert dead == {info.id: 1}


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_no_retry_on_ends_the_job_at_the_first_such_failure(
        app: conveyor.Conveyor, is_async: bool) -> None:
    script = _Script(RuntimeError("flaky"), UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"))
    task = _task(app, script, is_async, retries=5, no_retry_on=(ValueError,))
    info, dead = _run_to_end(app, task)
    assert info.state == "dead" and info.attempts == 2 and script.runs == 2
    assert info.error is not None and info.error.startswith("UnicodeDecodeError")
    assert dead == {info.id: 1}


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_fail_ends_the_job_dead_now_with_its_reason(
        app: conveyor.Conveyor, is_async: bool) -> None:
    script = _Script(OSError("blip"), conveyor.Fail("card declined"))
    task = _task(app, script, is_async, retries=5)
    info, dead = _run_to_end(app, task)
    assert info.state == "dead" and info.attempts == 2 and script.runs == 2
    assert info.error == "card declined"
    assert dead == {info.id: 1}


def test_fail_wins_over_retry_on(app: conveyor.Conveyor) -> None:
    script = _Script(conveyor.Fail("no such order"))
    task = _task(app, script, True, retries=5, retry_on=(Exception,))
    info, _ = _run_to_end(app, task)
    assert (info.state, info.attempts, info.error) == ("dead", 1, "no such order")


def test_a_timeout_is_retried_only_when_retry_on_names_timeout_error(
        app: conveyor.Conveyor) -> None:
    @app.task(name="stuck", queue="q", retries=3, backoff=0.01, timeout=0.2,
              retry_on=(ConnectionError,))
    async def stuck() -> None:
        await asyncio.sleep(30)

    @app.task(name="slow", queue="q", retries=1, backoff=0.01, timeout=0.2,
              retry_on=(TimeoutError,))
    async def slow() -> None:
        await asyncio.sleep(30)

    with running_worker(app, queues=["q"], concurrency=2):
        a, b = stuck.enqueue(), slow.enqueue()
        with pytest.raises(conveyor.JobFailed):
            a.result(timeout=20)
        with pytest.raises(conveyor.JobFailed):
            b.result(timeout=20)
    assert a.info().attempts == 1 and (a.info().error or "").startswith("timeout")
    assert b.info().attempts == 2


def test_a_run_that_succeeds_after_a_retried_failure_succeeds(app: conveyor.Conveyor) -> None:
    script = _Script(ConnectionError("down"), None)
    task = _task(app, script, False, retries=1, retry_on=ConnectionError)
    info, dead = _run_to_end(app, task)
    assert (info.state, info.attempts, info.result) == ("succeeded", 2, "done")
    assert not dead


def test_inline_mode_applies_the_same_policy(app: conveyor.Conveyor) -> None:
    fail, refused = _Script(conveyor.Fail("declined")), _Script(KeyError("x"), ValueError("v"))
    dead: list[str] = []
    app.on_dead(lambda info: dead.append(info.id))
    a = _task(app, fail, False, retries=3)
    b = app.task(name="refused", queue="q", retries=3, no_retry_on=ValueError)(refused.step)
    with testing.inline(app):
        ja, jb = a.enqueue(), b.enqueue()
        ia, ib = ja.info(), jb.info()
    assert (ia.state, ia.attempts, ia.error, fail.runs) == ("dead", 1, "declined", 1)
    assert (ib.state, ib.attempts, refused.runs) == ("dead", 2, 2)
    assert dead == [ja.id, jb.id]


def test_policy_options_are_checked(app: conveyor.Conveyor) -> None:
    def f() -> None:
        pass

    with pytest.raises(ValueError, match="retry_on= or no_retry_on=, not both"):
        app.task(name="both", retry_on=(OSError,), no_retry_on=(ValueError,))(f)
    with pytest.raises(TypeError, match=r"retry_on takes exception classes.*'OSError'"):
        app.task(name="strings", retry_on=("OSError",))(f)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"no_retry_on takes exception classes.*int"):
        app.task(name="not_exc", no_retry_on=(ValueError, int))(f)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Fail needs a reason"):
        conveyor.Fail("")
    assert "both" not in app.tasks and "strings" not in app.tasks


def test_options_keep_the_policy(app: conveyor.Conveyor) -> None:
    script = _Script(ValueError("bad"))
    task = _task(app, script, False, retries=4, no_retry_on=(ValueError,))
    copy = task.options(priority=9)
    assert copy.no_retry_on == (ValueError,) and copy.retry_on is None
    with running_worker(app, queues=["q"]):
        job = copy.enqueue()
        with pytest.raises(conveyor.JobFailed):
            job.result(timeout=20)
    assert job.info().attempts == 1
