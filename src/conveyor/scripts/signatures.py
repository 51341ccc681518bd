"""What each Lua script receives, named: the one source of every position.

``KEYS`` names each script's KEYS, ``ARGV`` gives the typed tuple of its fixed ARGV entries
and ``ITEMS`` the typed tuple of one item of the list that follows them (the jobs, outcomes,
leases ... a call carries), all in the order of the script's header. The loader turns them
into the bindings each script starts with (``K``, ``A`` and ``ITEM``, see
:func:`conveyor.scripts.bindings`), and the call builders (:mod:`conveyor.scripts.calls`)
build every call's arguments as these tuples: neither side writes a position by hand.

This module imports nothing from the package, so the loader can read it while
:mod:`conveyor.scripts` is itself being imported.
"""

from __future__ import annotations

from typing import Any, NamedTuple

Arg = str | bytes | int | float

KEYS: dict[str, tuple[str, ...]] = {
    "enqueue": ("job_prefix", "ready_prefix", "ring_prefix", "priorities", "delayed", "counts",
                "dedupe_prefix", "wake", "metrics_prefix", "schedule_prefix", "fired_prefix",
                "throttle_prefix", "leases", "dead", "active", "seq", "events", "paused",
                "limits", "buckets", "running", "parked", "waiters", "waiter_offers",
                "handoff_prefix", "expiring"),
    "fetch": ("job_prefix", "ready_prefix", "ring_prefix", "priorities", "delayed", "leases",
              "dead", "counts", "active", "seq", "dedupe_prefix", "events", "metrics_prefix",
              "wake", "paused", "limits", "buckets", "running", "parked", "waiters",
              "waiter_offers", "suspended", "expiring", "cancelling"),
    "finish": ("job_prefix", "leases", "delayed", "dead", "active", "idle", "dedupe_prefix",
               "events", "metrics_prefix", "wake", "counts", "running", "parked", "limits",
               "ready_prefix", "ring_prefix", "priorities", "suspended", "expiring"),
    "heartbeat": ("job_prefix", "leases", "cancelling"),
    "release": ("job_prefix", "ready_prefix", "ring_prefix", "priorities", "leases", "counts",
                "active", "wake", "running", "parked", "limits", "expiring"),
    "cancel": ("job_prefix", "delayed", "counts", "dedupe_prefix", "cancelling", "suspended"),
    "requeue_dead": ("job_prefix", "ready_prefix", "ring_prefix", "priorities", "dead",
                     "counts", "wake", "dedupe_prefix"),
    "purge_dead": ("job_prefix", "dead"),
    "progress": ("job_prefix",),
    "step": ("job_prefix",),
    "workflow_enqueue": ("job_prefix", "ready_prefix", "ring_prefix", "priorities", "delayed",
                         "counts", "wake", "metrics_prefix", "handover", "waiting_prefix",
                         "workflow_prefix", "expiring"),
    "workflow_release": ("job_prefix", "ready_prefix", "ring_prefix", "priorities", "delayed",
                         "counts", "wake", "handover", "waiting_prefix"),
    "workflow_settle": ("workflow_prefix",),
    "set_limits": ("limits", "buckets", "parked", "ready_prefix", "ring_prefix", "priorities",
                   "wake", "counts"),
    "register_waiter": ("waiters", "waiter_offers"),
    "wait": ("job_prefix",),
    "signal": ("job_prefix", "delayed", "counts", "ready_prefix", "ring_prefix", "priorities",
               "wake", "suspended"),
    "resume": ("job_prefix", "delayed", "counts", "ready_prefix", "ring_prefix", "priorities",
               "wake", "suspended"),
    "shard_allot": ("limits", "parked", "ready_prefix", "ring_prefix", "priorities", "wake",
                    "counts", "shard_epoch"),
}


# The fixed ARGV of each script, in the order of its header (a test compares the fields
# with the .lua files); the items a call carries (jobs, outcomes, ...) follow them.
class EnqueueArgv(NamedTuple):
    now: str
    bucket_seconds: int
    bucket_ttl: int
    claim: str
    claim_tick: Arg
    claim_mode: str
    task: str
    priority: int
    tenant: str
    delay_ms: str
    at_ms: str
    max_attempts: int
    key: str
    visibility_ms: int
    debounce_ms: str
    debounce_max_ms: str
    throttle_ms: str
    trace: str
    parent: str
    expires: str
    deadline: str
    dead_cap: int
    events_maxlen: int
    jobs: int


class FetchArgv(NamedTuple):
    now: str
    want: int
    dead_cap: int
    events_maxlen: int
    bucket_seconds: int
    bucket_ttl: int
    nonce: str
    worker: str
    waiter_ttl_ms: int
    retention: int


class FinishArgv(NamedTuple):
    now: str
    retention: int
    dead_cap: int
    events_maxlen: int
    bucket_seconds: int
    bucket_ttl: int
    snooze_cap: int
    outcomes: int


class HeartbeatArgv(NamedTuple):
    now: str
    leases: int


class ReleaseArgv(NamedTuple):
    jobs: int


class CancelArgv(NamedTuple):
    now: str
    retention: int
    id: str
    reason: str


class RequeueDeadArgv(NamedTuple):
    limit: int


class PurgeDeadArgv(NamedTuple):
    limit: int


class ProgressArgv(NamedTuple):
    reports: int


class StepArgv(NamedTuple):
    id: str
    token: str
    name: str
    value: bytes


class WaitArgv(NamedTuple):
    now: str
    id: str
    token: str
    kind: str
    name: str
    ms: Arg
    child: str


class SignalArgv(NamedTuple):
    id: str
    name: str
    payload: bytes


class ResumeArgv(NamedTuple):
    ends: int


class WorkflowEnqueueArgv(NamedTuple):
    now: str
    bucket_seconds: int
    bucket_ttl: int
    retention: int
    workflow: str
    home: str
    nodes: bytes | str
    total: int
    node_count: int


class WorkflowReleaseArgv(NamedTuple):
    now: str
    retention: int
    handovers: int


class WorkflowSettleArgv(NamedTuple):
    retention: int
    workflow: str
    ended: int


class SetLimitsArgv(NamedTuple):
    clear: str
    changes: int


class ShardAllotArgv(NamedTuple):
    epoch: int
    share: str


class RegisterWaiterArgv(NamedTuple):
    now: str
    worker: str
    slots: int
    nonce: str
    ttl_ms: int


ARGV: dict[str, type[tuple[Any, ...]]] = {
    "enqueue": EnqueueArgv,
    "fetch": FetchArgv,
    "finish": FinishArgv,
    "heartbeat": HeartbeatArgv,
    "release": ReleaseArgv,
    "cancel": CancelArgv,
    "requeue_dead": RequeueDeadArgv,
    "purge_dead": PurgeDeadArgv,
    "progress": ProgressArgv,
    "step": StepArgv,
    "workflow_enqueue": WorkflowEnqueueArgv,
    "workflow_release": WorkflowReleaseArgv,
    "workflow_settle": WorkflowSettleArgv,
    "set_limits": SetLimitsArgv,
    "register_waiter": RegisterWaiterArgv,
    "wait": WaitArgv,
    "signal": SignalArgv,
    "resume": ResumeArgv,
    "shard_allot": ShardAllotArgv,
}


# One item of the list a call carries after its fixed arguments; the count of items is the
# last fixed argument. Fields are sent in this order, each item right after the one before.
class EnqueueItem(NamedTuple):
    short_id: str
    args: bytes


class FinishItem(NamedTuple):
    short_id: str
    token: str
    outcome: str  # 'ok' | 'retry' | 'dead' | 'snooze' | 'cancelled' | 'suspend'
    started_at: str  # epoch seconds, 6 decimals
    payload: bytes | str
    retry_delay_ms: int


class HeartbeatItem(NamedTuple):
    short_id: str
    token: str
    extend_ms: int
    # '1' once the lease's run has begun (told once); '2' the run goes on from an earlier
    # lease whose start was told (this lease's attempt is given back); else ''
    started: str


class ReleaseItem(NamedTuple):
    short_id: str
    token: str
    reason: str  # '' for a job that never started


class ProgressItem(NamedTuple):
    short_id: str
    token: str
    fraction: str
    note: str


class RequeueDeadItem(NamedTuple):
    short_id: str


class WorkflowEnqueueItem(NamedTuple):
    short_id: str
    task: str
    priority: int
    tenant: str
    delay_ms: str
    at_ms: str
    max_attempts: int
    visibility_ms: int
    args: bytes
    name: str
    waits_for: int
    run_if: str
    parents: bytes
    children: bytes
    expires: str
    deadline: str


class WorkflowReleaseItem(NamedTuple):
    child: str
    parent: str
    outcome: str  # '' succeeded, else the reason


class WorkflowSettleItem(NamedTuple):
    node: str


class SetLimitsItem(NamedTuple):
    field: str
    value: str


class ResumeItem(NamedTuple):
    parent: str
    child: str
    outcome: bytes


ITEMS: dict[str, type[tuple[Any, ...]]] = {
    "enqueue": EnqueueItem,
    "finish": FinishItem,
    "heartbeat": HeartbeatItem,
    "release": ReleaseItem,
    "requeue_dead": RequeueDeadItem,
    "progress": ProgressItem,
    "workflow_enqueue": WorkflowEnqueueItem,
    "workflow_release": WorkflowReleaseItem,
    "workflow_settle": WorkflowSettleItem,
    "set_limits": SetLimitsItem,
    "resume": ResumeItem,
}
