"""conveyor: a Python task queue on Redis that never loses a job.

>>> app = Conveyor("redis://127.0.0.1:6379/0")
>>> @app.task
... def add(x, y):
...     return x + y
>>> add.enqueue(1, 2).result(timeout=10)   # with a worker running
3
"""

from .app import Conveyor
from .batch import Batch, BatchItem
from .bounds import Limits
from .context import JobContext, current_job
from .deadletters import DeadLetters
from .encoding import Codec
from .encryption import Encryption, Unsealable
from .errors import (
    ConfigurationError,
    ConveyorError,
    EncodingError,
    Fail,
    JobCancelled,
    JobFailed,
    JobNotFound,
    LeaseLost,
    NotReplicated,
    PartialEnqueue,
    PayloadTooLarge,
    ResultTimeout,
    SerializationError,
    Snooze,
    WaitTimeout,
)
from .job import Job, JobInfo, JobState
from .limits import Queue, QueueLimits, TenantLimits
from .monitor import Advice, Backlog, Monitor, Stats, TaskActivity, Timing
from .task import JobOptions, Task
from .worker import Worker
from .workflow import Node, Workflow, WorkflowHandle, WorkflowInfo, chain

__version__ = "0.1.0"

__all__ = [
    "Advice",
    "Backlog",
    "Batch",
    "BatchItem",
    "Codec",
    "ConfigurationError",
    "Conveyor",
    "ConveyorError",
    "DeadLetters",
    "EncodingError",
    "Encryption",
    "Fail",
    "Job",
    "JobCancelled",
    "JobContext",
    "JobFailed",
    "JobInfo",
    "JobNotFound",
    "JobOptions",
    "JobState",
    "LeaseLost",
    "Limits",
    "Monitor",
    "Node",
    "NotReplicated",
    "PartialEnqueue",
    "PayloadTooLarge",
    "Queue",
    "QueueLimits",
    "ResultTimeout",
    "SerializationError",
    "Snooze",
    "Stats",
    "Task",
    "TaskActivity",
    "TenantLimits",
    "Timing",
    "Unsealable",
    "WaitTimeout",
    "Worker",
    "Workflow",
    "WorkflowHandle",
    "WorkflowInfo",
    "__version__",
    "chain",
    "current_job",
]
