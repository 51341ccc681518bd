"""Untrusted records and fencing tokens, against a real redis-server.

A record mangled by hand, by a bug elsewhere or by a partial restore dead-letters its own
job with a reason naming the field; it never stops a worker, wedges a queue or breaks the
listing of dead letters. Fencing tokens never repeat, also after Redis rolls back.
"""

from __future__ import annotations

from typing import Any

import pytest

import conveyor
from conveyor.scripts import calls
from helpers import running_worker, wait_until

BAD_FIELDS = {
    "max_attempts": ({"m": "x"}, "field 'max_attempts' is not an integer"),
    "vt": ({"v": "soon"}, "field 'vt' is not a positive number"),
    "priority": ({"p": "high"}, "field 'priority' is not an integer 0-9"),
    "state": ({"s": "limbo"}, "field 'state' is not a job state"),
    "task": ({"t": b"\xff\xfe"}, "field 'task' is not valid UTF-8"),
}


@pytest.mark.parametrize("field", sorted(BAD_FIELDS))
def test_a_mangled_ready_job_is_dead_lettered_naming_the_field(app: conveyor.Conveyor,
                                                               field: str) -> None:
    @app.task(name="ok", queue="q")
    def ok(x: int) -> int:
        return x

    mangled = ok.enqueue(1)
    change, reason = BAD_FIELDS[field]
    app.redis.hset(app.keys("q").job(mangled.short_id), mapping=change)  # type: ignore[arg-type]
    fine = ok.enqueue_many([(i,) for i in range(10)])
    with running_worker(app, queues=["q"], concurrency=2):
        assert [j.result(timeout=10) for j in fine] == list(range(10))
        wait_until(lambda: mangled.info().state == "dead", 10, message="the mangled job dead")
    assert reason in (mangled.info().error or "")
    listed = app.dead_letters("q").list()
    assert [info.id for info in listed] == [mangled.id]
    assert reason in (listed[0].error or "")
    active = app.redis.hgetall(app.keys("q").active)
    assert all(int(v) == 0 for v in active.values()), active
    assert int(app.redis.hget(app.keys("q").counts, "ready") or 0) == 0


def test_a_mangled_delayed_job_does_not_wedge_the_queue(app: conveyor.Conveyor) -> None:
    @app.task(name="ok", queue="q")
    def ok(x: int) -> int:
        return x

    mangled = ok.options(delay=0.2).enqueue(1)
    app.redis.hset(app.keys("q").job(mangled.short_id), "p", "urgent")
    with running_worker(app, queues=["q"], concurrency=2):
        wait_until(lambda: mangled.info().state == "dead", 10, message="the mangled job dead")
        assert ok.enqueue(2).result(timeout=10) == 2  # promotion did not fail the fetch
    assert "field 'priority'" in (mangled.info().error or "")


def test_job_info_of_a_mangled_record_never_raises(app: conveyor.Conveyor) -> None:
    record: dict[Any, Any] = {b"s": b"\xff", b"t": b"\xfe", b"p": b"p",
                              b"attempts": b"?", b"e": b"then", b"tenant": b"\x80"}
    info = conveyor.JobInfo.from_record(app, "q", "x", record)
    assert info.state == "dead" and "field 'state'" in (info.error or "")
    assert (info.priority, info.attempts, info.enqueued_at) == (5, 0, None)
    record = {b"s": b"succeeded", b"result": b"[" * 100_000}
    assert "undecodable" in str(conveyor.JobInfo.from_record(app, "q", "y", record).result)


def _snapshot(client: Any, pattern: str) -> dict[bytes, bytes]:
    return {key: client.dump(key) for key in client.scan_iter(match=pattern)}


def _restore(client: Any, pattern: str, snapshot: dict[bytes, bytes]) -> None:
    for key in client.scan_iter(match=pattern):
        client.delete(key)
    for key, value in snapshot.items():
        client.restore(key, 0, value)


def test_tokens_never_repeat_after_redis_rolls_back(app: conveyor.Conveyor) -> None:
    """Worker A leases the job; Redis rolls back to before that lease (a failover to a
    lagging replica); worker B leases the job again. A's token must not be B's, so A's
    heartbeat and acknowledgement are refused and B's accepted."""
    @app.task(name="job", queue="q")
    def job() -> None: ...

    job.enqueue()
    k, client, pattern = app.keys("q"), app.redis, "{" + app.namespace + ":q}*"
    before = _snapshot(client, pattern)
    a = app.scripts.run(calls.fetch(k, 1, app.limits)).jobs[0]
    _restore(client, pattern, before)
    b = app.scripts.run(calls.fetch(k, 1, app.limits)).jobs[0]
    assert a.short_id == b.short_id and a.token != b.token
    assert app.scripts.run(calls.heartbeat(k, [(a.short_id, a.token, 30_000)])) == [0]
    stale = calls.Outcome(a.short_id, a.token, "ok", 0.0, b"null")
    assert app.scripts.run(calls.finish(k, [stale], app.limits)).codes == [0]
    assert app.scripts.run(calls.heartbeat(k, [(b.short_id, b.token, 30_000)])) == [1]
    current = calls.Outcome(b.short_id, b.token, "ok", 0.0, b"null")
    assert app.scripts.run(calls.finish(k, [current], app.limits)).codes == [1]
