"""The durable-wait scripts alone (``wait``, ``signal``, ``resume``, and ``finish``'s
'suspend'), through their typed wrappers, against a real redis-server; time is the
scripts' ``now`` override, so a day-long sleep takes no time."""

from __future__ import annotations

import dataclasses

import pytest
import redis

import conveyor
from conveyor.scripts import calls

Q = "q"
DAY_MS = 86_400_000
T0 = 1_800_000_000_000.0  # ms


@pytest.fixture
def app(app_on_each: conveyor.Conveyor) -> conveyor.Conveyor:
    """Every test here runs on a plain server and on a 3-primary Cluster, where a script
    that reaches a key outside its queue's hash slot fails."""
    return app_on_each


def _enqueue(app: conveyor.Conveyor, short: str, now: float = T0, **spec: object) -> list:
    job_spec = calls.JobSpec(task="t", **spec)  # type: ignore[arg-type]
    return app.scripts.run(calls.enqueue(app.keys(Q), job_spec, [(short, b"[[]]")],
                                         app.limits, now=now))


def _lease(app: conveyor.Conveyor, now: float) -> calls.Leased:
    fetched = app.scripts.run(calls.fetch(app.keys(Q), 1, app.limits, now=now))
    assert len(fetched.jobs) == 1, fetched
    return fetched.jobs[0]


def _wait(app: conveyor.Conveyor, held: calls.Leased, kind: str, name: str,
          ms: float | None, now: float, child: str = "") -> tuple[int, bytes]:
    return app.scripts.run(calls.wait(app.keys(Q), held.short_id, held.token, kind, name, ms,
                                      child, now=now))


def _suspend(app: conveyor.Conveyor, held: calls.Leased, now: float) -> list[int]:
    outcome = calls.Outcome(held.short_id, held.token, "suspend", now / 1000, "")
    return app.scripts.run(calls.finish(app.keys(Q), [outcome], app.limits, now=now)).codes


def _record(app: conveyor.Conveyor, short: str) -> dict[bytes, bytes]:
    return app.redis.hgetall(app.keys(Q).job(short))


def test_a_day_long_sleep_wakes_when_the_day_has_passed_and_not_before(
        app: conveyor.Conveyor) -> None:
    k = app.keys(Q)
    _enqueue(app, "a")
    held = _lease(app, T0)
    assert _wait(app, held, "time", "day", DAY_MS, T0) == (calls.WAIT_SUSPEND, b"")
    assert _suspend(app, held, T0 + 5) == [6]
    record = _record(app, "a")
    assert record[b"s"] == b"suspended" and b"attempts" not in record  # none used
    assert b"token" not in record and b"w" not in record  # no lease, no holder
    assert app.redis.zscore(k.delayed, "a") == T0 + DAY_MS
    assert app.redis.zscore(k.leases, "a") is None and app.redis.sismember(k.suspended, "a")
    empty = app.scripts.run(calls.fetch(k, 1, app.limits, now=T0 + DAY_MS - 1))
    assert empty.jobs == []
    held = _lease(app, T0 + DAY_MS)
    assert held.attempts == 1
    # The run that takes it finds the sleep over, and records it.
    assert _wait(app, held, "time", "day", DAY_MS, T0 + DAY_MS) == (calls.WAIT_RECORDED, b"t")
    assert _record(app, "a")[b"w:day"] == b"t" and b"wt" not in _record(app, "a")
    assert app.redis.hmget(k.counts, "suspended", "suspended_timed") == [b"0", b"0"]


def test_a_wait_reached_again_keeps_its_first_deadline(app: conveyor.Conveyor) -> None:
    """A run cut short (its lease lapsed) reaches the sleep again later: the sleep still
    ends one hour after the first run reached it, not one hour after the second."""
    _enqueue(app, "a")
    held = _lease(app, T0)
    assert _wait(app, held, "time", "nap", 3_600_000, T0)[0] == calls.WAIT_SUSPEND
    # No finish: the worker died. The lease lapses and the job runs again.
    again = _lease(app, T0 + 60_000)
    assert _wait(app, again, "time", "nap", 3_600_000, T0 + 60_000)[0] == calls.WAIT_SUSPEND
    assert _suspend(app, again, T0 + 60_000) == [6]
    assert app.redis.zscore(app.keys(Q).delayed, "a") == T0 + 3_600_000


def test_a_signal_consumed_by_a_wait_is_recorded_once_and_others_stay_kept(
        app: conveyor.Conveyor) -> None:
    k = app.keys(Q)
    _enqueue(app, "a")
    assert app.scripts.run(calls.signal(k, "a", "go", b"one")) == calls.SIGNAL_KEPT
    assert app.scripts.run(calls.signal(k, "a", "go", b"two")) == calls.SIGNAL_KEPT
    held = _lease(app, T0)
    assert _wait(app, held, "signal", "go", None, T0) == (calls.WAIT_RECORDED, b"sone")
    # Asked again (a lost reply, a second run): the same outcome, nothing consumed again.
    assert _wait(app, held, "signal", "go", None, T0) == (calls.WAIT_RECORDED, b"sone")
    assert b"sig:go" in _record(app, "a")  # 'two' is kept
    outcome = calls.Outcome("a", held.token, "ok", T0 / 1000, b"\x90")
    app.scripts.run(calls.finish(k, [outcome], app.limits, now=T0))
    assert app.scripts.run(calls.signal(k, "a", "go", b"three")) == calls.SIGNAL_REFUSED
    assert app.scripts.run(calls.signal(k, "nobody", "go", b"x")) == calls.SIGNAL_REFUSED


def test_a_signal_that_arrives_between_the_wait_and_the_finish_is_not_missed(
        app: conveyor.Conveyor) -> None:
    k = app.keys(Q)
    _enqueue(app, "a")
    held = _lease(app, T0)
    assert _wait(app, held, "signal", "go", 10_000, T0)[0] == calls.WAIT_SUSPEND
    assert app.scripts.run(calls.signal(k, "a", "go", b"now")) == calls.SIGNAL_DELIVERED
    assert _suspend(app, held, T0 + 1) == [7]  # ready at once: its wait is over
    assert _record(app, "a")[b"s"] == b"ready"
    again = _lease(app, T0 + 2)
    assert _wait(app, again, "signal", "go", 10_000, T0 + 2) == (calls.WAIT_RECORDED, b"snow")


def test_a_timeout_and_a_signal_race_and_exactly_one_is_recorded(
        app: conveyor.Conveyor) -> None:
    k = app.keys(Q)
    _enqueue(app, "a")
    held = _lease(app, T0)
    _wait(app, held, "signal", "go", 1000, T0)
    assert _suspend(app, held, T0) == [6]
    again = _lease(app, T0 + 1000)  # the timeout woke it; it has not run yet
    # The signal comes first: it is recorded, and the run gets it, not the timeout.
    assert app.scripts.run(calls.signal(k, "a", "go", b"late")) == calls.SIGNAL_DELIVERED
    assert _wait(app, again, "signal", "go", 1000, T0 + 1001) == (calls.WAIT_RECORDED,
                                                                  b"slate")
    # A wait whose timeout is recorded first: a signal after it is kept, not consumed.
    _enqueue(app, "b")
    held = _lease(app, T0)
    _wait(app, held, "signal", "go", 1000, T0)
    _suspend(app, held, T0)
    again = _lease(app, T0 + 1000)
    assert _wait(app, again, "signal", "go", 1000, T0 + 1000) == (calls.WAIT_RECORDED, b"x")
    assert app.scripts.run(calls.signal(k, "b", "go", b"late")) == calls.SIGNAL_KEPT
    assert _record(app, "b")[b"w:go"] == b"x"


def test_a_stale_token_or_a_cancel_refuses_the_wait(app: conveyor.Conveyor) -> None:
    _enqueue(app, "a")
    held = _lease(app, T0)
    stale = dataclasses.replace(held, token="0")
    assert _wait(app, stale, "time", "nap", 10, T0)[0] == calls.WAIT_REFUSED
    app.scripts.run(calls.cancel(app.keys(Q), "a", app.limits, "stop"))
    assert _wait(app, held, "time", "nap", 10, T0)[0] == calls.WAIT_CANCELLING


def test_a_child_is_stored_once_under_its_planned_id(app: conveyor.Conveyor) -> None:
    """The parent plans the child's id with the wait; the child's enqueue is sent as often
    as runs of the parent reach the wait, and stores it once."""
    k = app.keys(Q)
    _enqueue(app, "p")
    held = _lease(app, T0)
    code, planned = _wait(app, held, "child", "kid", None, T0, child=f"{Q}~c1")
    assert (code, planned) == (calls.WAIT_SUSPEND, f"{Q}~c1".encode())
    # The worker died before the child was stored; the next run plans another id, but the
    # wait names the first.
    again = _lease(app, T0 + 60_000)
    code, planned = _wait(app, again, "child", "kid", None, T0 + 60_000, child=f"{Q}~c2")
    assert planned == f"{Q}~c1".encode()
    parent = f"{Q}~p"
    assert _enqueue(app, "c1", parent=parent) == [("c1", True)]
    assert _enqueue(app, "c1", parent=parent) == [("c1", False)]  # sent again: not stored
    assert _record(app, "c1")[b"pw"] == parent.encode()
    assert _suspend(app, again, T0 + 60_001) == [6]
    ends = [("p", f"{Q}~c1", b"oRESULT")]
    assert app.scripts.run(calls.resume(k, ends)) == 1
    assert app.scripts.run(calls.resume(k, ends)) == 0  # told twice: nothing more
    assert _record(app, "p")[b"s"] == b"ready" and _record(app, "p")[b"w:kid"] == b"oRESULT"


def test_the_wait_checks_its_arguments(app: conveyor.Conveyor) -> None:
    _enqueue(app, "a")
    held = _lease(app, T0)
    with pytest.raises(redis.ResponseError, match="wait: id, token"):
        _wait(app, held, "time", "nap", None, T0)  # a sleep needs a length
    with pytest.raises(redis.ResponseError, match="wait: id, token"):
        _wait(app, held, "nap", "x", 10, T0)
    with pytest.raises(redis.ResponseError, match="wait: id, token"):
        _wait(app, held, "time", "x" * 201, 10, T0)


def test_a_wait_over_the_moment_it_is_reached_is_recorded_without_a_suspension(
        app: conveyor.Conveyor) -> None:
    _enqueue(app, "a")
    held = _lease(app, T0)
    assert _wait(app, held, "signal", "go", 0, T0) == (calls.WAIT_RECORDED, b"x")
    assert _wait(app, held, "time", "nap", 0, T0) == (calls.WAIT_RECORDED, b"t")


def test_a_parent_cancelled_while_it_waited_learns_nothing_of_its_child(
        app: conveyor.Conveyor) -> None:
    k = app.keys(Q)
    _enqueue(app, "p")
    held = _lease(app, T0)
    _wait(app, held, "child", "kid", None, T0, child=f"{Q}~c1")
    _suspend(app, held, T0)
    assert app.scripts.run(calls.cancel(k, "p", app.limits, "no longer needed")) == "suspended"
    assert app.scripts.run(calls.resume(k, [("p", f"{Q}~c1", b"olate")])) == 0
    record = _record(app, "p")
    assert record[b"s"] == b"cancelled" and b"w:kid" not in record


def test_a_resume_or_signal_refused_by_a_key_written_over_changes_nothing(
        app: conveyor.Conveyor) -> None:
    """The delayed set written over by hand: the child's end and a signal are refused
    whole (the wait stays open, the job suspended) until the key is put back, then both
    go through; none leaves a wait recorded on a job that stays suspended."""
    k = app.keys(Q)
    _enqueue(app, "p")
    held = _lease(app, T0)
    _wait(app, held, "child", "kid", None, T0, child=f"{Q}~c1")
    _suspend(app, held, T0)
    app.redis.set(k.delayed, "written over")
    with pytest.raises(redis.ResponseError, match="resume"):
        app.scripts.run(calls.resume(k, [("p", f"{Q}~c1", b"odone")]))
    with pytest.raises(redis.ResponseError, match="signal"):
        app.scripts.run(calls.signal(k, "p", "go", b"x"))
    record = _record(app, "p")
    assert record[b"s"] == b"suspended" and b"w:kid" not in record and b"wt" in record
    app.redis.delete(k.delayed)
    assert app.scripts.run(calls.resume(k, [("p", f"{Q}~c1", b"odone")])) == 1
    assert _record(app, "p")[b"s"] == b"ready"
