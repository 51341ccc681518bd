"""No command of more than MAX_COMMAND_ARGS (3,999) words: the batches conveyor builds are
measured on a real server (its slow log records every command with its argument count),
the transport refuses a larger call before sending it, and a bulk enqueue of 10,000 jobs
and a workflow of 2,000 nodes on one queue work in calls under the limit."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

import conveyor
from conveyor.scripts import MAX_COMMAND_ARGS, CommandTooLong, ScriptCall, calls, max_items
from conveyor.scripts.calls.enqueue import JobSpec
from helpers import RedisServer, run_async, running_worker, wait_until

MORE = re.compile(rb"^\.\.\. \((\d+) more arguments\)$")


@pytest.fixture
def logged(make_server: type[RedisServer]) -> Iterator[conveyor.Conveyor]:
    """An app on a private server whose slow log keeps every command."""
    server = make_server(extra=["--slowlog-log-slower-than", "0",
                                "--slowlog-max-len", "100000"]).start()
    app = conveyor.Conveyor(server.url, namespace="limit")
    yield app
    app.close()


def longest_command(app: conveyor.Conveyor) -> int:
    """The most words any logged command carried (the slow log keeps 32 of them and counts
    the rest in its last entry)."""
    most = 0
    for entry in app.redis.execute_command("SLOWLOG", "GET", "-1"):
        args = entry[3]
        more = MORE.match(args[-1]) if args else None
        most = max(most, len(args) - 1 + int(more.group(1)) if more else len(args))
    return most


def test_a_bulk_enqueue_of_10000_jobs_stays_under_the_limit(logged: conveyor.Conveyor
                                                            ) -> None:
    @logged.task
    def add(x: int) -> int:
        return x

    jobs = add.enqueue_many(range(10_000))
    assert len({j.id for j in jobs}) == 10_000
    assert int(logged.redis.hget(logged.keys("default").counts, "ready")) == 10_000
    longest = longest_command(logged)
    assert MAX_COMMAND_ARGS - 10 < longest <= MAX_COMMAND_ARGS  # chunks as full as allowed


def test_a_workflow_of_2000_nodes_on_one_queue_is_stored_in_calls_under_the_limit(
        logged: conveyor.Conveyor) -> None:
    @logged.task
    def node(i: int) -> int:
        return i

    wf = logged.workflow()
    root = wf.add(node, -1, name="root")
    middle = [wf.add(node, i, name=f"n{i}", after=[root]) for i in range(1998)]
    wf.add(node, -2, name="fanin", after=middle)
    handle = wf.enqueue()
    assert MAX_COMMAND_ARGS - 20 < longest_command(logged) <= MAX_COMMAND_ARGS
    assert len(handle.info().nodes) == 2000
    with running_worker(logged, concurrency=16):
        wait_until(lambda: handle.info().state != "running", 120, 0.2, "the workflow's end")
    assert handle.info().counts == {"succeeded": 2000}  # the fan-in waited on every chunk


def test_largest_batches_of_each_caller_run_under_the_guard(logged: conveyor.Conveyor
                                                            ) -> None:
    """The largest call each batching caller builds (dead-letter requeue, a workflow's
    release, settle and a durable wait's resume) runs; the longest was measured."""
    k, limits = logged.keys("default"), logged.limits
    run = logged.scripts.run
    assert run(calls.requeue_dead(k, [f"d{i}" for i in range(1000)])) == 0
    released = run(calls.workflow_release(
        k, [(f"c{i}", f"default~p{i}", "") for i in range(1000)], limits))
    assert released == (0, 0)
    assert run(calls.resume(k, [(f"p{i}", f"default~c{i}", b"") for i in range(500)])) == 0
    run(calls.workflow_settle(k, "wf", [f"default~n{i}" for i in range(500)], limits))
    assert 3000 < longest_command(logged) <= MAX_COMMAND_ARGS


def oversized() -> tuple[ScriptCall[Any], ScriptCall[Any]]:
    """The largest enqueue call the producer may build, and one with a job more."""
    k = conveyor.Conveyor("redis://127.0.0.1:1/0", namespace="limit").keys("default")
    jobs = [(f"j{i}", b"[]") for i in range(max_items("enqueue") + 1)]
    spec, limits = JobSpec(task="t"), conveyor.Conveyor("redis://127.0.0.1:1/0").limits
    return calls.enqueue(k, spec, jobs[:-1], limits), calls.enqueue(k, spec, jobs, limits)


@pytest.mark.parametrize("how", ["run", "send_all", "arun"])
def test_a_call_over_the_limit_is_refused_before_it_is_sent(logged: conveyor.Conveyor,
                                                           how: str) -> None:

    largest, too_long = oversized()
    sent_before = logged.redis.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    message = r"script 'enqueue' called with 4,\d{3} arguments .* over the limit of 3,999"
    with pytest.raises(CommandTooLong, match=message):
        if how == "run":
            logged.scripts.run(too_long)
        elif how == "send_all":
            logged.scripts.send_all([largest, too_long])
        else:
            async def arun() -> None:
                await logged.ascripts().run(too_long)

            run_async(logged, arun())
    stats = logged.redis.info("commandstats")
    assert stats.get("cmdstat_evalsha", {}).get("calls", 0) == sent_before
    assert logged.scripts.run(largest) == [(f"j{i}", True) for i in range(max_items("enqueue"))]


def test_each_script_with_items_has_a_positive_limit() -> None:
    from conveyor.scripts import signatures

    assert {name: max_items(name) > 0 for name in signatures.ITEMS} == \
        dict.fromkeys(signatures.ITEMS, True)
    assert conveyor.producer.ENQUEUE_CHUNK == max_items("enqueue") == 1971


def test_a_queue_whose_later_call_fails_is_named_and_its_stored_part_cancelled(
        app: conveyor.Conveyor) -> None:
    import dataclasses

    from conveyor.scripts.signatures import WorkflowEnqueueArgv, WorkflowEnqueueItem
    from conveyor.workflow.store import Plan, partly_stored, plan

    @app.task
    def node(i: int) -> int:
        return i

    wf = app.workflow()
    root = wf.add(node, 0, name="root")
    for i in range(1, 300):
        wf.add(node, i, name=f"n{i}", after=[root])
    planned = plan(app, wf)
    assert [len(shorts) for _, _, shorts in planned.calls] == [248, 52]
    # A priority out of range: the second call is refused before its first write.
    queue, call, shorts = planned.calls[1]
    args = list(call.args)
    args[len(WorkflowEnqueueArgv._fields) + WorkflowEnqueueItem._fields.index("priority")] = 12
    spoiled = Plan(planned.id, [planned.calls[0],
                                (queue, dataclasses.replace(call, args=tuple(args)), shorts)])
    sent = app._sender.send_together([(q, c) for q, c, _ in spoiled.calls])
    assert sent.stored == [0] and sent.unsure == []
    assert sent.error is not None
    error = partly_stored(app, spoiled, sent.stored, sent.error, sent.unsure)
    assert isinstance(error, conveyor.PartialEnqueue)
    assert "queue(s) default (1 of 2 calls) were stored" in str(error)
    assert len(error.jobs) == 248 and error.jobs[0].id == root.id
    assert {job.info().state for job in error.jobs} == {conveyor.JobState.CANCELLED}


def test_a_workers_call_over_the_limit_is_sent_with_a_warning(
        logged: conveyor.Conveyor, caplog: pytest.LogCaptureFixture) -> None:
    """A worker's batch grows with its concurrency: over the limit (past ~660 jobs held),
    Redis still takes it, so it is sent, with a warning naming the engines that do not."""
    k = logged.keys("q")
    outcomes = [calls.Outcome(f"j{i}", "1.x", "ok", 1.0, b"\\x90")
                for i in range(max_items("finish") + 1)]
    with caplog.at_level("WARNING", logger="conveyor.worker"):
        done = logged.scripts.run(calls.finish(k, outcomes, logged.limits))
    assert done.codes == [calls.FINISH_REFUSED] * len(outcomes)  # no such leases: refused
    assert "need a lower worker concurrency" in caplog.text
