"""Dead-job alerts against a local HTTP server: batching, rate limit, retries, end to end."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import conveyor
from conveyor.alerts import Alerter, Webhook
from conveyor.scripts import calls
from helpers import RedisServer, running_worker, wait_until


class Hook:
    """A local webhook endpoint that records messages and can fail on purpose."""

    def __init__(self) -> None:
        self.messages: list[dict[str, str]] = []
        self.attempts: list[float] = []
        self.fail_next = 0
        self.fail_status = 500
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.attempts.append(time.monotonic())
                if hook.fail_next > 0:
                    hook.fail_next -= 1
                    self.send_response(hook.fail_status)
                    self.send_header("Retry-After", "1")
                    self.end_headers()
                    return
                hook.messages.append(json.loads(body))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def counted(self) -> int:
        return sum(int(re.search(r"(\d+) job\(s\) went dead", m["text"]).group(1))  # type: ignore[union-attr]
                   for m in self.messages)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook() -> Iterator[Hook]:
    endpoint = Hook()
    yield endpoint
    endpoint.close()


def dead_info(n: int, task: str = "emails.send") -> conveyor.JobInfo:
    return conveyor.JobInfo(
        id=f"emails~{n}", task=task, queue="emails", tenant=None, priority=5,
        state=conveyor.JobState.DEAD, attempts=3, max_attempts=3, enqueued_at=1.0, run_at=1.0,
        started_at=2.0, finished_at=3.0, wait_time=1.0, run_time=1.0,
        error="Traceback (most recent call last):\nValueError: smtp said no", result=None)


async def test_a_storm_of_10000_dead_jobs_gives_a_few_messages_with_counts(hook: Hook) -> None:
    alerter = Alerter(Webhook(hook.url, gather=0.2, min_interval=0.5))
    started = time.monotonic()
    for n in range(10_000):  # spread over about 1.5 s, as a worker records them
        alerter.add(dead_info(n, task="emails.send" if n % 10 else "billing.charge"))
        if n % 500 == 0:
            await asyncio.sleep(0.07)
    await asyncio.to_thread(wait_until, lambda: hook.counted() == 10_000, 10)
    assert 1 <= len(hook.messages) <= 5, len(hook.messages)
    first = hook.messages[0]["text"]
    assert "emails.send (queue emails): ValueError: smtp said no" in first
    assert "billing.charge" in first and "e.g. emails~" in first
    gaps = [b - a for a, b in zip(hook.attempts, hook.attempts[1:], strict=False)]
    assert all(gap >= 0.45 for gap in gaps), gaps  # rate limit between messages
    assert hook.attempts[0] - started >= 0.2  # the first message gathers the storm's start


async def test_a_failing_endpoint_is_retried_with_backoff_and_loses_no_count(
    hook: Hook,
) -> None:
    hook.fail_next = 2
    alerter = Alerter(Webhook(hook.url, gather=0.05, min_interval=0.1))
    alerter.add(dead_info(1))
    await asyncio.sleep(0.3)
    alerter.add(dead_info(2))  # arrives while the endpoint is failing: merged, not separate
    await asyncio.to_thread(wait_until, lambda: hook.messages, 15)
    assert alerter.failures == 2 and len(hook.attempts) == 3
    assert hook.counted() == 2 and len(hook.messages) == 1
    assert hook.attempts[1] - hook.attempts[0] >= 0.9  # back-off (and Retry-After: 1)
    assert hook.attempts[2] - hook.attempts[1] >= 1.0


async def test_flush_posts_what_is_left_at_once(hook: Hook) -> None:
    alerter = Alerter(Webhook(hook.url, gather=60))
    alerter.add(dead_info(1))
    await alerter.flush()
    assert hook.counted() == 1 and alerter.pending == 0


@pytest.mark.slow
def test_worker_alerts_a_dead_storm_in_a_few_messages(app: conveyor.Conveyor, hook: Hook) -> None:
    app.alert_webhook = Webhook(hook.url, gather=0.3, min_interval=3.0)
    hooked: list[str] = []
    app.on_dead(lambda info: hooked.append(info.id))

    @app.task(name="doomed", retries=0)
    def doomed(n: int) -> None:
        raise RuntimeError(f"job {n} failed on purpose")

    doomed.enqueue_many([(n,) for n in range(10_000)])
    with running_worker(app, concurrency=64):
        wait_until(lambda: len(hooked) == 10_000, 60, 0.1, "10,000 dead hooks")
    wait_until(lambda: hook.counted() == 10_000, 10, message="every death counted")
    print(f"{len(hook.messages)} message(s) for 10,000 dead jobs")
    # One message per rate-limit interval while the storm lasts, plus the final flush.
    storm = hook.attempts[-1] - hook.attempts[0]
    assert len(hook.messages) <= storm / 3.0 + 2, (len(hook.messages), storm)
    assert len(hook.messages) <= 15
    assert "doomed (queue default): RuntimeError: job" in hook.messages[0]["text"]
    assert app.dead_letters("default").list(limit=1)


def test_dead_letters_trimmed_by_the_cap_raise_an_alert(redis_server: RedisServer,
                                                        namespace: str, hook: Hook) -> None:
    app = conveyor.Conveyor(redis_server.url, namespace=namespace,
                            limits=calls.Limits(dead_cap=2),
                            alert_webhook=Webhook(hook.url, gather=0.2, min_interval=1.0))

    @app.task(name="doomed", retries=0)
    def doomed(n: int) -> None:
        raise RuntimeError(f"job {n} failed on purpose")

    jobs = doomed.enqueue_many([(n,) for n in range(5)])
    try:
        with running_worker(app, concurrency=1):
            wait_until(lambda: _all_dead_or_trimmed(jobs), 20, message="every job dead or trimmed")
            wait_until(lambda: any("deleted by the cap" in m["text"] for m in hook.messages),
                       10, message="an alert about the trimmed dead letters")
    finally:
        app.close()
    text = next(m["text"] for m in hook.messages if "deleted by the cap" in m["text"])
    assert "dead-letter set is full (cap 2)" in text
    assert len(app.dead_letters("default")) <= 2


def _all_dead_or_trimmed(jobs: list[conveyor.Job]) -> bool:
    """Each job is dead, or gone (trimmed by the cap): read once each, so a job trimmed
    between two reads cannot fail the check."""
    for job in jobs:
        try:
            if job.info().state != "dead":
                return False
        except conveyor.JobNotFound:
            continue
    return True


def test_the_alerter_hears_of_dead_jobs_as_a_hook() -> None:
    alerter = Alerter(Webhook("http://127.0.0.1:9/never", gather=60))
    assert isinstance(alerter, conveyor.hooks.Hook)

    async def tell() -> None:
        assert alerter.dead(dead_info(1)) is None
        assert alerter._task is not None
        alerter._task.cancel()

    asyncio.run(tell())
    assert alerter.pending == 1
