"""The only place where Redis key names are formatted.

Every key of a queue starts with the queue's hash tag ``{<namespace>:<queue>}``, so all of
them live in one Redis Cluster slot and every Lua script touches a single slot. Scripts
receive these names through KEYS; where a script must derive a key (a tenant's ready
list, a job record), it is given a prefix from here and appends only an id to it.

Keys that span queues (the set of known queues, the worker registry) carry no hash tag
and are never touched by scripts.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

JOB_ID_SEPARATOR = "~"


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """Key names of one queue; attribute names match the KEYS names in script headers."""

    queue: str
    tag: str
    job_prefix: str  # + short id -> hash: the job record
    ready_prefix: str  # + "<priority>:<tenant>" -> list of short ids, FIFO; + "in": inbox
    ring_prefix: str  # + "<priority>" -> list of tenants with ready jobs (round robin)
    priorities: str  # zset of priorities that have ready jobs
    delayed: str  # zset short id -> due time (ms)
    suspended: str  # set of short ids of jobs suspended at a durable wait
    expiring: str  # zset short id -> its start-by time, or, running, its deadline (ms)
    leases: str  # zset short id -> lease deadline (ms)
    dead: str  # zset short id -> time it died (ms)
    wake: str  # list holding at most one marker: "there may be work"
    # hash: ready (jobs waiting in ready lists), running (jobs leased now), handed (jobs
    # ever leased by an enqueue straight to an idle worker, scripts/include/handoff.lua)
    counts: str
    active: str  # hash task -> jobs leased now
    idle: str  # hash task -> when a job of that task last finished (epoch s)
    seq: str  # counter for fencing tokens
    dedupe_prefix: str  # + user key -> short id of the unfinished job holding the key
    events: str  # capped stream of finished jobs, read by the analytics sink
    events_on: str  # exists once a sink has read the queue: only then are events written
    paused: str  # exists while the queue is paused
    metrics_prefix: str  # + bucket start (s) -> zset of counters and histograms (score: value)
    # + periodic name -> the latest tick claimed (ms): the scheduler's cursor, written by
    # every firing and by a first start that records the current tick without firing
    schedule_prefix: str
    fired_prefix: str  # + periodic name -> the latest tick that stored a job (ms)
    cancelling: str  # zset short id -> when a cancel of the running job was asked (ms)
    handover: str  # list of short ids of workflow nodes that ended, children not yet told
    workflow_prefix: str  # + workflow short id -> hash: the workflow's nodes (home queue)
    waiting_prefix: str  # + node short id -> hash parent id -> '' (succeeded) | reason
    throttle_prefix: str  # + user key -> short id of the job holding a throttle window
    limits: str  # hash: flow-control limits (queue and per-tenant fields, see flow.lua)
    buckets: str  # hash: token-bucket state, '' the queue's, 't:' + tenant a tenant's
    running: str  # hash tenant -> jobs of that tenant leased now (the queue's in counts)
    parked: str  # zset '<priority>:<tenant>' -> when to look at it again (ms)
    waiters: str  # zset worker id -> when its registration as a waiter lapses (ms)
    waiter_offers: str  # hash worker id -> '<free slots>:<nonce>' it offers
    handoff_prefix: str  # + worker id -> list of jobs handed to that idle worker
    # + request id -> a script call's reply, kept a while so that a re-sent call (its first
    # reply lost) answers it again instead of applying twice (see conveyor.scripts)
    replies_prefix: str
    # Sharded queues (conveyor.sharding): on the queue itself, a hash of its layout and
    # global limits, the lock and counter of the rebalancing of its concurrency cap; on
    # every shard, the latest rebalancing round (epoch) that wrote its allotment.
    shards: str
    shards_lock: str
    shards_epoch: str
    shard_epoch: str

    def job(self, short_id: str) -> str:
        return self.job_prefix + short_id

    def workflow(self, short_id: str) -> str:
        return self.workflow_prefix + short_id

    def workflow_ended(self, short_id: str) -> str:
        """Set of the workflow's nodes whose end was handed over (``workflow_settle``)."""
        return self.workflow_prefix + short_id + ":ended"

    def waiting(self, short_id: str) -> str:
        return self.waiting_prefix + short_id

    def handoff(self, worker_id: str) -> str:
        """List of jobs an enqueue handed to the idle worker ``worker_id``."""
        return self.handoff_prefix + worker_id

    def metrics(self, bucket: int) -> str:
        return f"{self.metrics_prefix}{bucket}"

    def ring(self, priority: str) -> str:
        """List of the tenants with ready jobs at ``priority``, in turn order."""
        return self.ring_prefix + priority

    def ready(self, member: str) -> str:
        """Ready list of ``'<priority>:<tenant>'``."""
        return self.ready_prefix + member

    @property
    def inbox(self) -> str:
        """List of jobs a plain enqueue queued, not yet on their priority's ready list
        (``scripts/plain.py``; ``include/ready.lua`` derives the same name)."""
        return self.ready_prefix + "in"

    def schedule(self, name: str) -> str:
        """The latest tick claimed for the periodic job ``name`` (fired or not)."""
        return self.schedule_prefix + name

    def fired(self, name: str) -> str:
        """The latest tick of the periodic job ``name`` that fired (stored its job)."""
        return self.fired_prefix + name


@cache
def queue_keys(namespace: str, queue: str) -> QueueKeys:
    """Key names of ``queue`` in ``namespace`` (cached: queues are few, calls are many)."""
    tag = "{" + f"{namespace}:{queue}" + "}"
    return QueueKeys(
        queue=queue,
        tag=tag,
        job_prefix=f"{tag}:j:",
        ready_prefix=f"{tag}:ready:",
        ring_prefix=f"{tag}:ring:",
        priorities=f"{tag}:priorities",
        delayed=f"{tag}:delayed",
        suspended=f"{tag}:suspended",
        expiring=f"{tag}:expiring",
        leases=f"{tag}:leases",
        dead=f"{tag}:dead",
        wake=f"{tag}:wake",
        counts=f"{tag}:counts",
        active=f"{tag}:active",
        idle=f"{tag}:idle",
        seq=f"{tag}:seq",
        dedupe_prefix=f"{tag}:key:",
        events=f"{tag}:events",
        # include/finish.lua (streaming) derives this name from events: keep them in step.
        events_on=f"{tag}:events:on",
        paused=f"{tag}:paused",
        # A sorted set since buckets are summed by ZUNION; named apart from the hashes that
        # older versions wrote, so a mixed deploy never meets a key of the wrong type.
        metrics_prefix=f"{tag}:mz:",
        schedule_prefix=f"{tag}:schedule:",
        fired_prefix=f"{tag}:fired:",
        cancelling=f"{tag}:cancelling",
        # Scripts that end jobs derive this name from the hash tag of their job_prefix
        # (include/finish.lua, handover_key): keep the two in step.
        handover=f"{tag}:wf:handover",
        workflow_prefix=f"{tag}:wf:",
        waiting_prefix=f"{tag}:wf:wait:",
        throttle_prefix=f"{tag}:throttle:",
        limits=f"{tag}:limits",
        buckets=f"{tag}:buckets",
        running=f"{tag}:running",
        parked=f"{tag}:parked",
        waiters=f"{tag}:waiters",
        waiter_offers=f"{tag}:offers",
        handoff_prefix=f"{tag}:handoff:",
        replies_prefix=f"{tag}:reply:",
        shards=f"{tag}:shards",
        shards_lock=f"{tag}:shards:lock",
        shards_epoch=f"{tag}:shards:epoch",
        shard_epoch=f"{tag}:shard:epoch",
    )


def queues_key(namespace: str) -> str:
    """Set of every queue that has seen a job (kept outside scripts)."""
    return f"{namespace}:queues"


def redactions_key(namespace: str) -> str:
    """Hash task name -> its redacted parameters as JSON ``[[name, position], ...]``
    (position -1: keyword-only), written by workers at start (:mod:`conveyor.redaction`)."""
    return f"{namespace}:redact"


def workers_key(namespace: str) -> str:
    """Sorted set of live workers, scored by their last heartbeat (ms)."""
    return f"{namespace}:workers"


def worker_key(namespace: str, worker_id: str) -> str:
    """Hash describing one live worker; expires when it stops heartbeating."""
    return f"{namespace}:worker:{worker_id}"


def supervisors_key(namespace: str) -> str:
    """Sorted set of live worker supervisors, scored by their last heartbeat (ms)."""
    return f"{namespace}:supervisors"


def supervisor_key(namespace: str, supervisor_id: str) -> str:
    """Hash describing one supervisor (children, scaling bounds); expires with it."""
    return f"{namespace}:supervisor:{supervisor_id}"


def supervisor_decisions_key(namespace: str, supervisor_id: str) -> str:
    """Capped list of a supervisor's latest scaling decisions, newest first (JSON)."""
    return f"{namespace}:supervisor:{supervisor_id}:decisions"


def job_id(queue: str, short_id: str) -> str:
    """Public job id: the queue travels inside it so a job is found by id in O(1)."""
    return f"{queue}{JOB_ID_SEPARATOR}{short_id}"


def split_job_id(public_id: str) -> tuple[str, str]:
    """Split a public job id into (queue, short id).

    :raises ValueError: the id does not name a queue
    """
    queue, sep, short = public_id.rpartition(JOB_ID_SEPARATOR)
    if not sep or not queue or not short:
        raise ValueError(f"not a conveyor job id: {public_id!r} (expected '<queue>~<id>')")
    return queue, short
