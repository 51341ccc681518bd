"""Durable waits on a real redis-server and a real worker: ``ctx.sleep``, ``ctx.wait_for``
and ``ctx.child`` suspend the job (no slot, no lease, no attempt), and the task runs again
from the top once the wait is over, with what ran before the wait not repeated when it
was a step, and what comes after it run once."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

import conveyor
from conveyor import JobState
from helpers import running_worker, wait_until


class Runs:
    """What the tasks of a test did, counted by label (tasks run on worker threads)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, label: str) -> None:
        with self.lock:
            self.counts[label] += 1

    def __getitem__(self, label: str) -> int:
        with self.lock:
            return self.counts[label]


def _state(job: conveyor.Job) -> JobState:
    return job.info().state


def test_a_sleep_suspends_the_job_frees_its_slot_and_runs_the_rest_once(
        app: conveyor.Conveyor) -> None:
    runs = Runs()

    @app.task(name="napper", queue="w")
    def napper(n: int) -> int:
        ctx = conveyor.current_job()
        runs("top")
        ctx.sleep("nap", 1.0)
        runs("after")
        return n * 2

    @app.task(name="quick", queue="w")
    def quick() -> str:
        runs("quick")
        return "done"

    with running_worker(app, queues=["w"], concurrency=1):
        job = napper.enqueue(21)
        wait_until(lambda: _state(job) == JobState.SUSPENDED, 10, message="suspended")
        info = job.info()
        assert info.waiting_for is not None and info.waiting_for.startswith("time 20")
        assert info.attempts == 0  # the attempt was given back
        # The one slot is free while the job sleeps: another job runs meanwhile.
        assert quick.enqueue().result(timeout=5) == "done"
        assert _state(job) == JobState.SUSPENDED
        assert job.result(timeout=10) == 42
    assert runs["top"] == 2 and runs["after"] == 1
    info = job.info()
    assert info.attempts == 1 and info.waiting_for is None


def test_a_signal_resumes_the_wait_with_its_payload(app: conveyor.Conveyor) -> None:
    runs = Runs()

    @app.task(name="approval", queue="w")
    def approval(order: str) -> str:
        ctx = conveyor.current_job()
        runs("top")
        decision = ctx.wait_for("approved")
        runs("after")
        return f"{order} approved by {decision['by']}"

    with running_worker(app, queues=["w"], concurrency=2):
        job = approval.enqueue("o-1")
        wait_until(lambda: _state(job) == JobState.SUSPENDED, 10, message="suspended")
        assert job.info().waiting_for == "signal 'approved'"
        assert app.signal(job.id, "approved", {"by": "ann"}) is True
        assert job.result(timeout=10) == "o-1 approved by ann"
        # The job ended: a signal now is refused, and says so.
        assert job.signal("approved", {"by": "bob"}) is False
    assert runs["top"] == 2 and runs["after"] == 1


def test_a_signal_sent_before_the_wait_is_kept_and_consumed_once(
        app: conveyor.Conveyor) -> None:
    runs = Runs()

    @app.task(name="two_waits", queue="w")
    def two_waits() -> list[object]:
        ctx = conveyor.current_job()
        runs("top")
        first = ctx.wait_for("go")
        try:
            second = ctx.wait_for("later", timeout=0.5)
        except conveyor.WaitTimeout:
            second = "timed out"
        runs("end")
        return [first, second]

    job = two_waits.enqueue()
    assert job.signal("go", 1) is True  # not running yet: kept in the mailbox
    assert job.signal("go", 2) is True  # a second one of the same name is kept as well
    with running_worker(app, queues=["w"]):
        assert job.result(timeout=15) == [1, "timed out"]
    # Run 1 consumed "go" and suspended at "later"; its timeout woke run 2, which ended.
    assert runs["top"] == 2 and runs["end"] == 1
    record = app.redis.hgetall(app.keys("w").job(job.short_id))
    assert record[b"w:go"] == b"s" + app.codec.encode_result(1)
    assert record[b"w:later"] == b"x"
    assert b"sig:go" in record  # the second signal: kept, never consumed


def test_a_wait_name_reached_twice_in_one_run_is_an_error(app: conveyor.Conveyor) -> None:
    @app.task(name="twice", queue="w", retries=0)
    def twice() -> None:
        ctx = conveyor.current_job()
        ctx.sleep("same", 0)
        ctx.sleep("same", 0)

    with running_worker(app, queues=["w"]):
        job = twice.enqueue()
        with pytest.raises(conveyor.JobFailed, match="reached twice"):
            job.result(timeout=10)


def test_a_parent_waits_for_a_child_on_another_queue(app: conveyor.Conveyor) -> None:
    runs = Runs()

    @app.task(name="resize", queue="images")
    def resize(image: str) -> str:
        runs("child")
        return image + "@small"

    @app.task(name="publish", queue="posts")
    def publish(image: str) -> str:
        ctx = conveyor.current_job()
        runs("parent")
        small = ctx.child("resize", resize, image)
        return "published " + small

    with running_worker(app, queues=["posts", "images"], concurrency=2):
        job = publish.enqueue("cat.png")
        assert job.result(timeout=20) == "published cat.png@small"
    assert runs["child"] == 1 and runs["parent"] == 2


def test_a_dead_child_raises_in_its_parent(app: conveyor.Conveyor) -> None:
    @app.task(name="flaky", queue="w", retries=0)
    def flaky() -> None:
        raise RuntimeError("card declined")

    @app.task(name="checkout", queue="w", retries=0)
    def checkout() -> str:
        try:
            conveyor.current_job().child("pay", flaky.options(queue="payments"))
        except conveyor.JobFailed as exc:
            return f"payment failed: {exc.error}"
        return "paid"

    with running_worker(app, queues=["w", "payments"], concurrency=2):
        job = checkout.enqueue()
        result = job.result(timeout=20)
    assert result.startswith("payment failed: RuntimeError: card declined"), result


def test_a_suspended_job_can_be_cancelled(app: conveyor.Conveyor) -> None:
    @app.task(name="patient", queue="w")
    def patient() -> None:
        conveyor.current_job().wait_for("never")

    with running_worker(app, queues=["w"]):
        job = patient.enqueue()
        wait_until(lambda: _state(job) == JobState.SUSPENDED, 10, message="suspended")
        assert job.cancel("not needed") is True
        assert _state(job) == JobState.CANCELLED
        assert job.signal("never") is False
        with pytest.raises(conveyor.JobCancelled):
            job.result(timeout=1)


def test_suspended_jobs_are_counted_and_listed_apart_from_scheduled_ones(
        app: conveyor.Conveyor) -> None:
    @app.task(name="waiter", queue="w")
    def waiter(timeout: float | None) -> object:
        return conveyor.current_job().wait_for("go", timeout=timeout)

    @app.task(name="later", queue="w")
    def later() -> None:
        return None

    later.options(delay=600).enqueue()
    with running_worker(app, queues=["w"], concurrency=2):
        timed, untimed = waiter.enqueue(3600.0), waiter.enqueue(None)
        wait_until(lambda: app.monitor.backlog("w").suspended == 2, 10, message="2 suspended")
        backlog = app.monitor.backlog("w")
        # The timed wait's timer is in the delayed set, but it is no scheduled job.
        assert (backlog.scheduled, backlog.suspended, backlog.ready) == (1, 2, 0)
        page = app.monitor.jobs("w", "suspended", 0, 10)
        assert {info.id for info, _ in page.jobs} == {timed.id, untimed.id}
        assert timed.info().waiting_for.startswith("signal 'go' until 20")
        assert untimed.signal("go", "now") and timed.signal("go", "too")
        assert untimed.result(timeout=10) == "now" and timed.result(timeout=10) == "too"
        backlog = app.monitor.backlog("w")
        assert (backlog.scheduled, backlog.suspended) == (1, 0)


def test_drain_with_scheduled_jobs_ends_sleeps_and_timeouts_at_once(
        app: conveyor.Conveyor) -> None:
    """A test of a task that sleeps a day needs no day: ``testing.drain`` with
    ``include_scheduled`` ends durable sleeps and wait timeouts now."""
    from conveyor import testing

    @app.task(name="reminder", queue="w")
    async def reminder(user: str) -> str:
        ctx = conveyor.current_job()
        ctx.sleep("a day", 86_400)
        try:
            ctx.wait_for("clicked", timeout=3600)
        except conveyor.WaitTimeout:
            return f"{user} never clicked"
        return f"{user} clicked"

    job = reminder.enqueue("ann")
    infos = testing.drain(app, queues=["w"], include_scheduled=True, timeout=20)
    assert job.result(timeout=1) == "ann never clicked"
    assert [i.id for i in infos] == [job.id]


def test_the_events_stream_records_each_suspension_for_the_sink(
        app: conveyor.Conveyor) -> None:
    from conveyor.sink import schema, stream_events

    @app.task(name="sleepy", queue="w")
    def sleepy() -> str:
        conveyor.current_job().sleep("nap", 0.3)
        return "rested"

    stream_events(app, "w")
    with running_worker(app, queues=["w"]):
        job = sleepy.enqueue()
        assert job.result(timeout=10) == "rested"
    rows = [schema.row_from_event("w", sid.decode(), fields)
            for sid, fields in app.redis.xrange(app.keys("w").events)]
    assert [(r["job_id"], r["state"]) for r in rows] == [(job.id, "suspended"),
                                                          (job.id, "succeeded")]
    assert rows[0]["error"].startswith("waits: t ") and rows[0]["error"].endswith(" nap")


def test_lost_replies_of_the_wait_and_signal_calls_change_nothing(
        app: conveyor.Conveyor) -> None:
    """The wait call, the finish that suspends and the signal each lose their first reply
    (applied by Redis, the client sees a reset): each is sent again as the same request,
    and the job waits once, gets its signal once, and keeps no second copy of it."""
    from lost_reply import LoseReplies, script

    runs = Runs()

    @app.task(name="lossy", queue="w")
    def lossy() -> object:
        runs("top")
        got = conveyor.current_job().wait_for("go")
        runs("after")
        return got

    waits, signals = LoseReplies(script("wait")), LoseReplies(script("signal"))
    with waits, signals, running_worker(app, queues=["w"]):
        job = lossy.enqueue()
        wait_until(lambda: _state(job) == JobState.SUSPENDED, 10, message="suspended")
        assert job.signal("go", "once") is True
        assert job.result(timeout=10) == "once"
    assert (waits.lost, signals.lost) == (1, 1)
    assert runs["top"] == 2 and runs["after"] == 1
    record = app.redis.hgetall(app.keys("w").job(job.short_id))
    assert b"sig:go" not in record  # the re-sent signal was not kept a second time


def test_a_queue_capped_at_one_running_job_runs_others_while_one_is_suspended(
        app: conveyor.Conveyor) -> None:
    @app.task(name="held", queue="w")
    def held() -> object:
        return conveyor.current_job().wait_for("go")

    @app.task(name="other", queue="w")
    def other() -> str:
        return "ran"

    app.queue("w").set_limits(concurrency=1)
    with running_worker(app, queues=["w"], concurrency=4):
        job = held.enqueue()
        wait_until(lambda: _state(job) == JobState.SUSPENDED, 10, message="suspended")
        assert [j.result(timeout=10) for j in other.enqueue_many([(), ()])] == ["ran", "ran"]
        assert app.monitor.flow("w").running == 0
        job.signal("go", 1)
        assert job.result(timeout=10) == 1
