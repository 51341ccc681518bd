"""Reading and steering a stored workflow: :class:`WorkflowHandle`, :class:`WorkflowInfo`,
and :func:`parent_results` for a node that wants its parents' results.

How nodes appear in :class:`~conveyor.JobInfo`: a node waiting for its parents is
``scheduled`` (it runs later and is in no ready list, so no worker can take it); then
``ready``/``active`` and so on like any job. A node cancelled because a parent died or was
cancelled is ``cancelled``, with the reason in ``error``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from .. import keys as keyspace
from .. import untrusted
from .._async.poll import poll as apoll
from .._sync.poll import poll
from ..encryption import open_payload
from ..errors import EncodingError, JobCancelled, JobFailed, JobNotFound
from ..job import JobInfo, JobState
from ..record import STATE, TASK
from ..scripts import calls

if TYPE_CHECKING:
    from ..app import Conveyor

STATES = ("running", "succeeded", "failed", "cancelled")
FINAL = (JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED)
PAUSES = (0.005, 0.2)  # seconds between reads while waiting for the end: first, most


@dataclass(frozen=True, slots=True)
class NodeEntry:
    """One node as the workflow's record lists it."""

    name: str
    job_id: str
    after: tuple[str, ...]
    run_if: str


@dataclass(frozen=True, slots=True)
class WorkflowInfo:
    """A snapshot of a workflow.

    :ivar state: ``running`` while a node has not ended; then ``failed`` if a node is
        dead, else ``cancelled`` if a node was cancelled, else ``succeeded``
    :ivar counts: nodes per job state (``"expired"``: records gone after their retention)
    :ivar nodes: node name -> its job's :class:`~conveyor.JobInfo`, in the order added
    :ivar after: node name -> the names of the nodes it runs after
    """

    id: str
    state: str
    counts: dict[str, int]
    nodes: dict[str, JobInfo]
    after: dict[str, tuple[str, ...]]


def _entries(raw: Any, workflow_id: str) -> list[NodeEntry]:
    if raw is None:
        raise JobNotFound(f"no workflow {workflow_id} (it never existed, or its record expired)")
    try:
        rows = msgspec.json.decode(raw)
        return [NodeEntry(str(r[0]), str(r[1]), tuple(map(str, r[2])), str(r[3])) for r in rows]
    except (msgspec.DecodeError, TypeError, IndexError, ValueError) as exc:
        raise JobNotFound(f"workflow {workflow_id} has an unreadable record: {exc}") from exc


def _summarise(app: Conveyor, workflow_id: str, entries: list[NodeEntry],
               records: list[Mapping[bytes, bytes]]) -> WorkflowInfo:
    nodes: dict[str, JobInfo] = {}
    counts: dict[str, int] = {}
    for entry, record in zip(entries, records, strict=True):
        if not record:
            counts["expired"] = counts.get("expired", 0) + 1
            continue
        queue, short = keyspace.split_job_id(entry.job_id)
        info = JobInfo.from_record(app, queue, short, record)
        nodes[entry.name] = info
        counts[info.state.value] = counts.get(info.state.value, 0) + 1
    states = {i.state for i in nodes.values()}
    if any(s not in FINAL for s in states):
        state = "running"
    elif JobState.DEAD in states:
        state = "failed"
    elif JobState.CANCELLED in states:
        state = "cancelled"
    else:
        state = "succeeded"
    return WorkflowInfo(workflow_id, state, counts, nodes, {e.name: e.after for e in entries})


def _outcome(info: WorkflowInfo) -> tuple[bool, dict[str, Any]]:
    if info.state == "running":
        return False, {}
    for job in info.nodes.values():
        if job.state == JobState.DEAD:
            raise JobFailed(job.id, job.error)
    if info.state == "cancelled":
        raise JobCancelled(info.id)
    return True, {name: job.result for name, job in info.nodes.items()}


class WorkflowHandle:
    """A handle on a stored workflow; every method reads Redis afresh.

    :param app: the application
    :param id: the workflow id, ``"<home queue>~<short id>"``
    """

    def __init__(self, app: Conveyor, id: str) -> None:
        self._app = app
        self.id = id
        self.queue, self.short_id = keyspace.split_job_id(id)

    def __repr__(self) -> str:
        return f"WorkflowHandle({self.id!r})"

    def _record_key(self) -> str:
        return self._app.keys(self.queue).workflow(self.short_id)

    def entries(self) -> list[NodeEntry]:
        """The nodes as the workflow's record lists them.

        :raises JobNotFound: no such workflow (or its record expired)
        """
        return _entries(self._app.redis.hget(self._record_key(), "nodes"), self.id)

    def info(self) -> WorkflowInfo:
        """The workflow and every node's job now (one pipelined read of the records).

        :raises JobNotFound: no such workflow (or its record expired)
        """
        entries = self.entries()
        with self._app.redis.pipeline(transaction=False) as pipe:
            for e in entries:
                pipe.hgetall(_job_key(self._app, e.job_id))
            records = pipe.execute()
        return _summarise(self._app, self.id, entries, records)

    async def ainfo(self) -> WorkflowInfo:
        """Async twin of :meth:`info`."""
        client = self._app.aredis()
        entries = _entries(await client.hget(self._record_key(), "nodes"), self.id)
        async with client.pipeline(transaction=False) as pipe:
            for e in entries:
                pipe.hgetall(_job_key(self._app, e.job_id))
            records = await pipe.execute()
        return _summarise(self._app, self.id, entries, records)

    def result(self, timeout: float | None = 60) -> dict[str, Any]:
        """Wait until every node ended; node name -> result.

        :raises JobFailed: a node is dead (the first one found)
        :raises JobCancelled: nodes were cancelled and none is dead
        :raises ResultTimeout: still running after ``timeout`` seconds
        """
        return poll(self.info, _outcome, f"workflow {self.id}", timeout, *PAUSES)

    async def aresult(self, timeout: float | None = 60) -> dict[str, Any]:
        """Async twin of :meth:`result`."""
        return await apoll(self.ainfo, _outcome, f"workflow {self.id}", timeout, *PAUSES)

    def cancel(self) -> int:
        """Cancel every node that has not ended: a waiting, scheduled or ready node never
        runs, a running one is stopped as :meth:`Job.cancel` stops it; returns how many
        were cancelled. Their hand-overs are queued as for any ended node, so nothing
        waits on them."""
        app = self._app
        pending = [e.job_id for e in self.entries()]
        cancelled = 0
        for queue, shorts in _by_queue(pending).items():
            k = app.keys(queue)
            replies = run_all(app, [calls.cancel(k, s, app.limits) for s in shorts])
            cancelled += sum(r in CANCELLABLE for r in replies)
        return cancelled

    async def acancel(self) -> int:
        """Async twin of :meth:`cancel`."""
        app = self._app
        client = app.aredis()
        entries = _entries(await client.hget(self._record_key(), "nodes"), self.id)
        runner = app.ascripts()
        cancelled = 0
        for queue, shorts in _by_queue([e.job_id for e in entries]).items():
            k = app.keys(queue)
            for s in shorts:
                reply = await runner.run(calls.cancel(k, s, app.limits))
                cancelled += reply in CANCELLABLE
        return cancelled


def _job_key(app: Conveyor, job_id: str) -> str:
    queue, short = keyspace.split_job_id(job_id)
    return app.keys(queue).job(short)


def _by_queue(job_ids: Iterable[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for job_id in job_ids:
        queue, short = keyspace.split_job_id(job_id)
        out.setdefault(queue, []).append(short)
    return out


def run_all(app: Conveyor, script_calls: list[Any]) -> list[Any]:
    """Run calls in one pipeline where the client allows it, else one by one."""
    if not app.scripts.pipelined:
        return [app.scripts.run(c) for c in script_calls]
    with app.redis.pipeline(transaction=False) as pipe:
        for c in script_calls:
            app.scripts.queue(c, pipe)
        replies = pipe.execute()
    return [c.parse(r) for c, r in zip(script_calls, replies, strict=True)]


def _parents(app: Conveyor, raw: Any, job_id: str) -> list[tuple[str, str]]:
    if raw is None:
        return []
    try:
        return [(str(name), str(pid)) for name, pid in msgspec.json.decode(raw)]
    except (msgspec.DecodeError, TypeError, ValueError) as exc:
        raise JobNotFound(f"job {job_id} has an unreadable list of parents: {exc}") from exc


def _results(app: Conveyor, parents: list[tuple[str, str]], replies: list[Any]
             ) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for (name, pid), (state, result, task) in zip(parents, replies, strict=True):
        if state == b"succeeded":
            try:
                if result:  # an encrypted parent's result opens for this job's worker
                    result = open_payload(app.encryption, result, untrusted.text(task) or "",
                                          "result", pid)
                out[name] = app.codec.decode_result(result)
            except (EncodingError, RecursionError, ValueError) as exc:
                out[name] = f"<undecodable result: {type(exc).__name__}: {exc}>"
    return out


CANCELLABLE = ("scheduled", "retrying", "ready", "active")  # states cancel() ends


def parent_results(app: Conveyor, job_id: str) -> dict[str, Any]:
    """``{name: result}`` of the parents (its ``after`` nodes) of workflow node ``job_id``
    that succeeded; a parent that ended otherwise (``run_if="finished"``) is left out.
    A job that is no workflow node has none: ``{}``."""
    raw = app.redis.hget(_job_key(app, job_id), "wfp")
    parents = _parents(app, raw, job_id)
    if not parents:
        return {}
    with app.redis.pipeline(transaction=False) as pipe:
        for _, pid in parents:
            pipe.hmget(_job_key(app, pid), STATE, "result", TASK)
        replies = pipe.execute()
    return _results(app, parents, replies)


async def aparent_results(app: Conveyor, job_id: str) -> dict[str, Any]:
    """Async twin of :func:`parent_results`."""
    client = app.aredis()
    parents = _parents(app, await client.hget(_job_key(app, job_id), "wfp"), job_id)
    if not parents:
        return {}
    async with client.pipeline(transaction=False) as pipe:
        for _, pid in parents:
            pipe.hmget(_job_key(app, pid), STATE, "result", TASK)
        replies = await pipe.execute()
    return _results(app, parents, replies)
