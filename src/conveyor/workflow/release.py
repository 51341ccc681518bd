"""The hand-over: telling a workflow node's children that it ended, exactly once (and a
child job of a durable wait, ``ctx.child``, its parent: the same steps, with ``resume``
in the parent's slot for step 2).

Parents and children may live on different queues, so on different Redis Cluster slots,
and no script may span two slots. The hand-over is therefore split in steps, each atomic
in one slot, each safe to repeat:

1. **Outbox, with the acknowledgement.** The script that ends a node (``finish`` on
   success or death, ``fetch`` when a lost lease or a bad record kills it, ``cancel``)
   pushes ``"<node id> <server time>"`` on its queue's hand-over list in the same script,
   so an ended node is always in its queue's outbox; a fenced acknowledgement is recorded
   once, so it is pushed once (a retried acknowledgement after a lost reply is refused,
   not re-pushed).
2. **Release, in each child's slot.** A drainer reads the outbox and the node's record
   (its children, its state) and calls ``workflow_release`` per child queue. The script
   records the parent in the child's waiting hash with HSETNX — a parent counts once,
   however often it is handed over — and releases a child only while its record is still
   waiting; so a child is made ready (or cancelled, when a parent failed) exactly once.
3. **Settle, in the workflow's home slot**: the ended node joins the workflow's set of
   ended nodes; once all ended, the workflow's record starts to expire.
4. **Done**: the entry leaves the outbox (``LREM`` of that exact entry) only after steps
   2 and 3 succeeded; a later end of the same node (requeued from the dead letters) has an
   entry of its own, so removing one never takes away the other.

How it recovers: a worker SIGKILLed after its acknowledgement but before step 4 leaves the
entry in the outbox. Every worker drains the outboxes of the queues it serves right after
each acknowledgement that queued a hand-over, and sweeps them all every
:data:`SWEEP_SECONDS`; the next drainer repeats steps 2-4, which change nothing that was
already done. Two drainers at once are harmless for the same reason. A child cancelled in
step 2 is itself pushed on its own queue's outbox, so cancellations cascade the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from .. import keys as keyspace
from ..record import STATE
from ..scripts import calls
from ..waits import child_outcome

if TYPE_CHECKING:
    from ..app import Conveyor

log = logging.getLogger("conveyor.workflow")
SWEEP_SECONDS = 20.0  # idle cost: one LRANGE per served queue per sweep (as long as a
# wake-up block, so an idle worker stays under half a command a second)
BATCH = 500  # outbox entries per drain step
RELEASE_CHUNK = 1000  # hand-overs per release call
ENDED = (b"succeeded", b"dead", b"cancelled", b"expired")


def _reason(name: str, job_id: str, state: bytes, error: bytes | None) -> str:
    """What a 'succeeded' child of a parent that did not succeed is cancelled with."""
    detail = (error or b"").decode(errors="replace")
    if state == b"dead":
        return f"parent {name!r} ({job_id}) is dead: {detail or 'no reason recorded'}"
    if state == b"expired":
        return f"parent {name!r} ({job_id}) expired: {detail}"
    return f"parent {name!r} ({job_id}) was cancelled" + (f": {detail}" if detail else "")


def _children(raw: bytes | None) -> list[str]:
    if not raw:
        return []
    try:
        return [str(c) for c in msgspec.json.decode(raw)]
    except (msgspec.DecodeError, TypeError, ValueError):
        return []


class Steps:
    """What one drain step of one queue's outbox has to send, from what it read."""

    def __init__(self, app: Conveyor, queue: str) -> None:
        self.app, self.queue, self.k = app, queue, app.keys(queue)
        self.releases: dict[str, list[tuple[str, str, str]]] = {}
        self.ended: dict[str, list[str]] = {}  # workflow id -> ended node ids
        self.resumes: dict[str, list[tuple[str, str, bytes]]] = {}  # parents, by queue

    def read(self, shorts: list[str], records: list[list[Any]]) -> None:
        for short, (state, wf, name, children, error, parent, result) in zip(
                shorts, records, strict=True):
            if state not in ENDED:
                continue  # gone, or requeued from the dead letters: nothing to tell
            job_id = keyspace.job_id(self.queue, short)
            if parent:
                self._parent(parent.decode(errors="replace"), job_id,
                             child_outcome(state, result, error, job_id))
            if not wf:
                continue
            outcome = "" if state == b"succeeded" else _reason(
                (name or b"").decode(errors="replace"), job_id, state, error)
            for child in _children(children):
                try:
                    child_queue, child_short = keyspace.split_job_id(child)
                except ValueError:
                    continue
                self.releases.setdefault(child_queue, []).append((child_short, job_id, outcome))
            self.ended.setdefault(wf.decode(errors="replace"), []).append(job_id)

    def _parent(self, parent: str, job_id: str, outcome: bytes) -> None:
        """A child job (``ctx.child``) ended: its parent is to learn of it."""
        try:
            queue, short = keyspace.split_job_id(parent)
        except ValueError:
            return
        self.resumes.setdefault(queue, []).append((short, job_id, outcome))

    def resume_calls(self) -> list[tuple[str, Any]]:
        return [(queue, calls.resume(self.app.keys(queue), ends[i:i + RELEASE_CHUNK]))
                for queue, ends in self.resumes.items()
                for i in range(0, len(ends), RELEASE_CHUNK)]

    def release_calls(self) -> list[tuple[str, Any]]:
        out = []
        for queue, items in self.releases.items():
            for i in range(0, len(items), RELEASE_CHUNK):
                out.append((queue, calls.workflow_release(
                    self.app.keys(queue), items[i:i + RELEASE_CHUNK], self.app.limits)))
        return out

    def settle_calls(self) -> list[Any]:
        out = []
        for wf, ended in self.ended.items():
            try:
                home, short = keyspace.split_job_id(wf)
            except ValueError:
                continue
            out.append(calls.workflow_settle(self.app.keys(home), short, ended, self.app.limits))
        return out


FIELDS = (STATE, "wf", "wfn", "wfc", "error", "pw")


async def _child_results(client: Any, k: keyspace.QueueKeys, shorts: list[str],
                         records: list[list[Any]]) -> None:
    """Fill in the result of each child job (``pw``) that succeeded: its parent records
    it. Read apart, and only for those, so a workflow node's result (any size) is never
    read for a hand-over that does not need it."""
    wanted = [i for i, record in enumerate(records) if record[5] and record[0] == b"succeeded"]
    if not wanted:
        return
    async with client.pipeline(transaction=False) as pipe:
        for i in wanted:
            pipe.hget(k.job(shorts[i]), "result")
        for i, result in zip(wanted, await pipe.execute(), strict=True):
            records[i][6] = result


async def drain_queue(app: Conveyor, queue: str) -> tuple[int, set[str], set[str]]:
    """Hand over up to :data:`BATCH` ended nodes of ``queue``'s outbox.

    :returns: entries handled, queues where nodes became ready, queues where nodes were
        cancelled (their own hand-overs are now due)
    """
    client, runner = app.aredis(), app.ascripts()
    k = app.keys(queue)
    raw = await client.lrange(k.handover, 0, BATCH - 1)
    if not raw:
        return 0, set(), set()
    shorts = [r.decode(errors="replace").split(" ", 1)[0] for r in raw]  # "<id> <when>"
    async with client.pipeline(transaction=False) as pipe:
        for short in shorts:
            pipe.hmget(k.job(short), *FIELDS)
        records = [[*record, None] for record in await pipe.execute()]
    await _child_results(client, k, shorts, records)
    steps = Steps(app, queue)
    steps.read(shorts, records)
    ready: set[str] = set()
    cancelled: set[str] = set()
    for child_queue, call in steps.release_calls():
        released, dropped = await runner.run(call)
        if released:
            ready.add(child_queue)
        if dropped:
            cancelled.add(child_queue)
    for parent_queue, call in steps.resume_calls():
        if await runner.run(call):
            ready.add(parent_queue)
    for call in steps.settle_calls():
        await runner.run(call)
    async with client.pipeline(transaction=False) as pipe:
        for short, entry in zip(shorts, raw, strict=True):
            pipe.delete(k.waiting(short))  # left by a node cancelled while it waited
            pipe.lrem(k.handover, 1, entry)
        await pipe.execute()
    return len(shorts), ready, cancelled


async def drain(app: Conveyor, queues: Iterable[str], rounds: int = 100) -> set[str]:
    """Drain the outboxes of ``queues`` and of every queue a cancellation cascades to;
    returns the queues where nodes became ready."""
    todo = list(dict.fromkeys(queues))
    ready: set[str] = set()
    for _ in range(rounds):
        if not todo:
            break
        again: list[str] = []
        for queue in todo:
            handled, became_ready, cancelled = await drain_queue(app, queue)
            ready |= became_ready
            if handled >= BATCH:
                again.append(queue)
            again.extend(cancelled)
        todo = list(dict.fromkeys(again))
    return ready


def drain_sync(app: Conveyor, queues: Iterable[str]) -> set[str]:
    """:func:`drain` from synchronous code (tests, the CLI), on a private event loop."""
    async def run() -> set[str]:
        try:
            return await drain(app, queues)
        finally:
            await app.aclose()

    return asyncio.run(run())


class HandOvers:
    """A worker's hand-over loop: drains a queue's outbox when told that an acknowledgement
    queued hand-overs there, and sweeps every served queue every :data:`SWEEP_SECONDS` (for
    hand-overs a killed worker left behind).

    :param on_ready: called with each queue where nodes became ready
    """

    def __init__(self, app: Conveyor, queues: list[str],
                 on_ready: Callable[[str], None]) -> None:
        self.app = app
        self.queues = queues
        self.on_ready = on_ready
        self._due: set[str] = set()
        self._event = asyncio.Event()

    def notify(self, queue: str) -> None:
        """An acknowledgement in ``queue`` queued hand-overs."""
        self._due.add(queue)
        self._event.set()

    async def now(self, queue: str) -> None:
        """Drain ``queue`` at once (after an acknowledgement); on a Redis error leave it
        to the loop, which tries again."""
        try:
            await self._drain([queue])
        except Exception as exc:
            log.warning("hand-over in %s failed (%s: %s); the loop tries again", queue,
                        type(exc).__name__, exc)
            self.notify(queue)

    async def _drain(self, queues: list[str]) -> None:
        for queue in await drain(self.app, queues):
            self.on_ready(queue)

    async def run(self) -> None:
        """Run for the worker's life (under its loop supervisor: an error restarts it, and
        the restart begins with a sweep)."""
        queues = list(self.queues)  # first a sweep: a worker that died may have left some
        while True:
            self._event.clear()
            self._due.clear()
            try:
                await self._drain(queues)
            except BaseException:
                self._due.update(queues)  # keep them for the next try
                raise
            try:
                await asyncio.wait_for(self._event.wait(), SWEEP_SECONDS)
                queues = list(self._due)
            except TimeoutError:
                queues = list(self.queues)
