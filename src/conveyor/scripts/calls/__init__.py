"""Typed wrappers: one function per script, building the :class:`ScriptCall` to send.

Each script's KEYS, fixed ARGV and items are typed tuples in
:mod:`conveyor.scripts.signatures`, the one source of the bindings the loader gives every
script and of the arguments every call here is built from. Callers pass a
:class:`~conveyor.keys.QueueKeys` and typed values; they never build key lists by hand.

The builders live by script family, and every name is importable from here:

- :mod:`.enqueue`: ``enqueue`` (the producer's)
- :mod:`.worker`: ``fetch``, ``register_waiter``, ``finish``, ``heartbeat``, ``release``
- :mod:`.running`: ``cancel``, ``progress``, ``step`` (about a running job)
- :mod:`.dead`: ``requeue_dead``, ``purge_dead``
- :mod:`.workflow`: ``workflow_enqueue``, ``workflow_release``, ``workflow_settle``
- :mod:`.limits`: ``set_limits``, ``shard_allot`` (flow control)
- :mod:`.waits`: ``wait``, ``signal``, ``resume`` (durable waits)
"""

from ...bounds import Limits
from .. import Arg, ScriptCall
from ..signatures import ARGV, ITEMS, KEYS
from .dead import purge_dead, requeue_dead
from .enqueue import Claim, JobSpec, enqueue
from .limits import Share, set_limits, shard_allot
from .running import (
    CANCELLABLE,
    STEP_CANCELLING,
    STEP_KEPT,
    STEP_RECORDED,
    STEP_REFUSED,
    cancel,
    progress,
    step,
)
from .waits import (
    SIGNAL_DELIVERED,
    SIGNAL_KEPT,
    SIGNAL_REFUSED,
    WAIT_CANCELLING,
    WAIT_RECORDED,
    WAIT_REFUSED,
    WAIT_SUSPEND,
    resume,
    signal,
    wait,
)
from .worker import (
    BEAT_CANCEL,
    BEAT_KEPT,
    BEAT_LOST,
    CONTINUED,
    FINISH_CANCELLED,
    FINISH_DEAD,
    FINISH_EXPIRED,
    FINISH_REFUSED,
    FINISH_RETRYING,
    FINISH_SNOOZED,
    FINISH_SUCCEEDED,
    FINISH_SUSPENDED,
    STARTED,
    Fetched,
    Finished,
    Leased,
    Outcome,
    fetch,
    finish,
    heartbeat,
    parse_handoff,
    register_waiter,
    release,
)
from .worker import _leased as _leased
from .worker import _leased_checked as _leased_checked
from .workflow import NodeSpec, WorkflowHome, workflow_enqueue, workflow_release, workflow_settle

__all__ = [
    "ARGV",
    "BEAT_CANCEL",
    "BEAT_KEPT",
    "BEAT_LOST",
    "CANCELLABLE",
    "CONTINUED",
    "FINISH_CANCELLED",
    "FINISH_DEAD",
    "FINISH_EXPIRED",
    "FINISH_REFUSED",
    "FINISH_RETRYING",
    "FINISH_SNOOZED",
    "FINISH_SUCCEEDED",
    "FINISH_SUSPENDED",
    "ITEMS",
    "KEYS",
    "SIGNAL_DELIVERED",
    "SIGNAL_KEPT",
    "SIGNAL_REFUSED",
    "STARTED",
    "STEP_CANCELLING",
    "STEP_KEPT",
    "STEP_RECORDED",
    "STEP_REFUSED",
    "WAIT_CANCELLING",
    "WAIT_RECORDED",
    "WAIT_REFUSED",
    "WAIT_SUSPEND",
    "Arg",
    "Claim",
    "Fetched",
    "Finished",
    "JobSpec",
    "Leased",
    "Limits",
    "NodeSpec",
    "Outcome",
    "ScriptCall",
    "Share",
    "WorkflowHome",
    "cancel",
    "enqueue",
    "fetch",
    "finish",
    "heartbeat",
    "parse_handoff",
    "progress",
    "purge_dead",
    "register_waiter",
    "release",
    "requeue_dead",
    "resume",
    "set_limits",
    "shard_allot",
    "signal",
    "step",
    "wait",
    "workflow_enqueue",
    "workflow_release",
    "workflow_settle",
]
