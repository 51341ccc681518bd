"""conveyor: a Python task queue on Redis that never loses a job.

>>> app = Conveyor("redis://127.0.0.1:6379/0")
>>> @app.task
... def add(x, y):
...     return x + y
>>> add.enqueue(1, 2).result(timeout=10)   # with a worker running
3
"""

from .app import Conveyor
from .deadletters import DeadLetters
from .encoding import Codec
from .errors import (
    ConfigurationError,
    ConveyorError,
    EncodingError,
    JobCancelled,
    JobFailed,
    JobNotFound,
    NotReplicated,
    PartialEnqueue,
    PayloadTooLarge,
    ResultTimeout,
    SerializationError,
)
from .flow import Queue, QueueLimits, TenantLimits
from .job import Job, JobInfo, JobState
from .monitor import Advice, Backlog, Monitor, Stats, TaskActivity, Timing
from .scripts.calls import Limits
from .task import JobOptions, Task
from .worker import Worker

__version__ = "0.1.0"

__all__ = [
    "Advice",
    "Backlog",
    "Codec",
    "ConfigurationError",
    "Conveyor",
    "ConveyorError",
    "DeadLetters",
    "EncodingError",
    "Job",
    "JobCancelled",
    "JobFailed",
    "JobInfo",
    "JobNotFound",
    "JobOptions",
    "JobState",
    "Limits",
    "Monitor",
    "NotReplicated",
    "PartialEnqueue",
    "PayloadTooLarge",
    "Queue",
    "QueueLimits",
    "ResultTimeout",
    "SerializationError",
    "Stats",
    "Task",
    "TaskActivity",
    "TenantLimits",
    "Timing",
    "Worker",
    "__version__",
]
