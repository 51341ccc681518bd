"""Tasks: functions registered with ``@app.task``, and how their jobs are enqueued.

Task arguments never share a namespace with job options: ``task.enqueue(*args, **kwargs)``
passes everything to the function, and options go through ``task.options(...)``, which
returns a frozen copy. The jobs are stored by :mod:`conveyor.producer`, as every
producer's are.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import random
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, Self, TypeVar, overload

from . import keys as keyspace
from . import producer
from .batch import Batch, BatchItem, check_batch_function
from .errors import ConfigurationError, Fail
from .hints import NO_HINTS, Hints, hints_of
from .job import Job
from .producer import new_short_id as new_short_id  # made by the producer; named here too
from .producer import new_short_ids as new_short_ids

if TYPE_CHECKING:
    from .app import Conveyor

P = ParamSpec("P")
R = TypeVar("R")

MAX_RETRY_DELAY = 3600.0

# What ``retry_on=`` and ``no_retry_on=`` take: an exception class or a tuple of them.
ExceptionClasses = type[BaseException] | tuple[type[BaseException], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class JobOptions:
    """How a job is enqueued (not what it is called with).

    :param delay: run no sooner than this many seconds (or this timedelta) from now
    :param at: run no sooner than this aware datetime or epoch seconds
    :param priority: 0-9, larger runs first
    :param tenant: fairness group: tenants take turns within a priority
    :param key: dedupe key: while a job with this key is unfinished, enqueue returns it
    :param durable: return only once a replica has the job (``WAIT``); see
        :attr:`Conveyor.durable_replicas` and :class:`~conveyor.errors.NotReplicated`
    :param debounce: with ``key``: run once, this many seconds after the latest enqueue
        with the key, with the latest arguments (each enqueue returns the same job)
    :param debounce_max: with ``debounce``: but no later than this many seconds after the
        first enqueue
    :param throttle: with ``key``: the key stays taken this many seconds from the first
        enqueue, even after that job finished; enqueues in the window return that job
    :param expires: the job must start within this many seconds of its enqueue (or a
        timedelta, or by this aware datetime / epoch seconds); past it, it never starts and
        ends ``expired`` at that time, wherever it waits
    :param deadline: the job must finish within this many seconds of its enqueue (or by
        that time): past it, a run is cancelled as a running job is, and the job ends
        ``expired``; it never starts once the deadline passed
    """

    delay: float | None = None
    at: float | None = None
    priority: int = 5
    tenant: str | None = None
    key: str | None = None
    durable: bool = False
    debounce: float | None = None
    debounce_max: float | None = None
    throttle: float | None = None
    expires: float | datetime | None = None
    deadline: float | datetime | None = None

    def __post_init__(self) -> None:
        if self.delay is not None and self.at is not None:
            raise ConfigurationError("give either delay= or at=, not both")
        p = self.priority
        if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p <= 9:
            raise ConfigurationError(f"priority must be an integer from 0 to 9, got {p!r}")
        if self.tenant is not None and not isinstance(self.tenant, str):
            raise ConfigurationError(f"tenant must be a string, got {type(self.tenant).__name__}")
        if self.key is not None and (not isinstance(self.key, str) or not self.key):
            raise ConfigurationError("key must be a non-empty string")
        self._check_keyed()
        for name in ("expires", "deadline"):
            value = getattr(self, name)
            if value is None or isinstance(value, datetime):
                if isinstance(value, datetime) and value.tzinfo is None:
                    raise ConfigurationError(f"{name}= needs an aware datetime, or seconds")
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigurationError(f"{name} must be seconds > 0 (or a timedelta, or an"
                                         f" aware datetime), got {value!r}")

    def _check_keyed(self) -> None:
        for name in ("debounce", "debounce_max", "throttle"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not value > 0):
                raise ConfigurationError(f"{name} must be a number of seconds > 0, got {value!r}")
        if (self.debounce is not None or self.throttle is not None) and self.key is None:
            raise ConfigurationError("debounce= and throttle= need key= (what to debounce by)")
        if self.debounce_max is not None and self.debounce is None:
            raise ConfigurationError("debounce_max= needs debounce=")
        if self.debounce is not None and self.throttle is not None:
            raise ConfigurationError("give either debounce= or throttle=, not both")
        if self.debounce is not None and (self.delay is not None or self.at is not None):
            raise ConfigurationError("debounce= sets when the job runs: leave out delay= and at=")
        if self.debounce_max is not None and self.debounce is not None \
                and self.debounce_max < self.debounce:
            raise ConfigurationError("debounce_max must be at least debounce")

    def merged(self, changes: Mapping[str, Any]) -> JobOptions:
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigurationError(
                f"unknown job option(s) {', '.join(sorted(unknown))}: expected queue, delay,"
                " at, priority, tenant, key, durable, debounce, debounce_max, throttle,"
                " expires or deadline"
            )
        values = dict(changes)
        for name in ("expires", "deadline"):
            if isinstance(values.get(name), timedelta):
                values[name] = values[name].total_seconds()
        if "delay" in values:
            values["delay"] = _seconds(values["delay"])
            if values["delay"] is not None and "at" not in changes:
                values["at"] = None
        if "at" in values:
            values["at"] = _epoch(values["at"])
            if values["at"] is not None and "delay" not in changes:
                values["delay"] = None
        return dataclasses.replace(self, **values)


def _seconds(delay: Any) -> float | None:
    if delay is None:
        return None
    if isinstance(delay, timedelta):
        return delay.total_seconds()
    if isinstance(delay, int | float) and not isinstance(delay, bool):
        return float(delay)
    raise ConfigurationError(f"delay must be seconds or a timedelta, got {type(delay).__name__}")


def _epoch(at: Any) -> float | None:
    if at is None:
        return None
    if isinstance(at, datetime):
        if at.tzinfo is None:
            raise ConfigurationError(
                "at= needs an aware datetime (e.g. datetime.now(timezone.utc)); a naive one"
                " is ambiguous"
            )
        return float(at.timestamp())
    if isinstance(at, int | float) and not isinstance(at, bool):
        return float(at)
    raise ConfigurationError(f"at must be an aware datetime or epoch seconds, got {at!r}")


def _flag(task: str, option: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"task {task!r}: {option}= takes True or False, got {value!r}")
    return value


def _redacted(fn: Callable[..., Any], task: str, names: Sequence[str]) -> frozenset[str]:
    """The parameter names of ``redact=``, each checked against the function's signature."""
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise ConfigurationError(f"task {task!r}: redact= takes a tuple of parameter names,"
                                 f" got {names!r}")
    try:
        known = set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a callable without a signature: take the names
        return frozenset(names)
    unknown = sorted(set(names) - known)
    if unknown:
        raise ConfigurationError(f"task {task!r}: redact= names {', '.join(unknown)}, not"
                                 f" parameters of the function ({', '.join(known) or 'none'})")
    return frozenset(names)


class Task(Generic[P, R]):
    """A registered task. Call it to run the function here; ``enqueue`` to run it on a worker.

    Made by :meth:`conveyor.Conveyor.task`; see there for the settings. ``P`` is the
    function's parameters and ``R`` what its jobs return: ``enqueue`` checks its arguments
    against ``P`` and gives a :class:`~conveyor.Job` whose ``result()`` is an ``R``.
    """

    def __init__(
        self,
        app: Conveyor,
        fn: Callable[P, Any],
        *,
        name: str,
        queue: str,
        retries: int,
        backoff: float,
        timeout: float | None,
        visibility_timeout: float,
        idle_threshold: float,
        job_options: JobOptions | None = None,
        retry_on: ExceptionClasses | None = None,
        no_retry_on: ExceptionClasses | None = None,
        batch: Batch | None = None,
        encrypt: bool = False,
        redact: Sequence[str] = (),
    ) -> None:
        if batch is not None:
            if not isinstance(batch, Batch):
                raise ConfigurationError(
                    f"task {name!r}: batch= takes a conveyor.Batch, got {batch!r}")
            check_batch_function(fn, name)
        if retries < 0:
            raise ConfigurationError(f"task {name!r}: retries must be >= 0, got {retries}")
        if visibility_timeout <= 0:
            raise ConfigurationError(f"task {name!r}: visibility_timeout must be > 0")
        if timeout is not None and timeout <= 0:
            raise ConfigurationError(f"task {name!r}: timeout must be > 0 or None")
        if not queue or keyspace.JOB_ID_SEPARATOR in queue:
            raise ConfigurationError(
                f"task {name!r}: queue name must be non-empty and free of"
                f" {keyspace.JOB_ID_SEPARATOR!r}"
            )
        self.app = app
        self.fn = fn
        self.name = name
        self.queue = queue
        self.retries = retries
        self.backoff = backoff
        self.timeout = timeout
        self.visibility_timeout = visibility_timeout
        self.idle_threshold = idle_threshold
        self.job_options = job_options or JobOptions()
        if retry_on is not None and no_retry_on is not None:
            raise ConfigurationError(
                f"task {name!r}: give either retry_on= or no_retry_on=, not both")
        self.retry_on = _exception_classes(name, "retry_on", retry_on)
        self.no_retry_on = _exception_classes(name, "no_retry_on", no_retry_on)
        self.batch = batch  # None: one call per job
        self.encrypt = _flag(name, "encrypt", encrypt)  # arguments and results sealed
        self.redact = _redacted(fn, name, redact)  # parameter names shown as [redacted]
        self.is_async = inspect.iscoroutinefunction(fn)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue!r}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = self.fn(*args, **kwargs)
        return result

    @functools.cached_property
    def hints(self) -> Hints:
        """The types its jobs' arguments and result are converted to on decoding (see
        :mod:`conveyor.hints`): read at the first job, once every name they use exists.
        A batch task's hints describe the list of items, not a job's arguments: its jobs
        are passed as decoded."""
        if self.batch is not None:
            return NO_HINTS
        return hints_of(self.fn, self.name)

    @property
    def max_attempts(self) -> int:
        return self.retries + 1

    def retry_delay(self, attempts: int) -> float:
        """Seconds before the next attempt: exponential in ``attempts``, jittered, capped."""
        exp = float(self.backoff) * 2.0 ** max(0, attempts - 1)
        return min(MAX_RETRY_DELAY, exp) * random.uniform(0.5, 1.0)

    def retries_after(self, exc: BaseException) -> bool:
        """Whether a run that raised ``exc`` may be retried (attempts allowing): never
        after :class:`~conveyor.Fail`; with ``retry_on``, only after those classes (and
        their subclasses); with ``no_retry_on``, after anything but those."""
        if isinstance(exc, Fail):
            return False
        if self.retry_on is not None:
            return isinstance(exc, self.retry_on)
        return self.no_retry_on is None or not isinstance(exc, self.no_retry_on)

    def options(self, **changes: Any) -> Self:
        """A copy of this task whose jobs are enqueued with other options.

        :param changes: any of ``queue`` (the jobs go to that queue; a worker serving it
            runs them), ``delay``, ``at``, ``priority``, ``tenant``, ``key``, ``durable``,
            ``debounce``, ``debounce_max``, ``throttle``, ``expires``, ``deadline``
        """
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__)
        if "queue" in changes:
            queue = changes.pop("queue")
            if not isinstance(queue, str) or not queue or keyspace.JOB_ID_SEPARATOR in queue:
                raise ConfigurationError(
                    f"task {self.name!r}: option queue must be a non-empty str free of"
                    f" {keyspace.JOB_ID_SEPARATOR!r}, got {queue!r}")
            copy.queue = queue
        copy.job_options = self.job_options.merged(changes)
        return copy

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job[R]:
        """Store a job that calls this task with these arguments; it is in Redis on return.

        :raises SerializationError: an argument cannot be encoded (nothing is written)
        :raises PayloadTooLarge: the encoded arguments are over the limit
        """
        return producer.enqueue(self, [(args, kwargs)])[0]

    def enqueue_many(self, items: Iterable[Any]) -> list[Job[R]]:
        """Store many jobs in one round trip; each item is a tuple of positional arguments,
        a dict of keyword arguments, or a single argument. The options apply to every job.

        With a dedupe ``key`` (and ``debounce`` or ``throttle``), which names one job, each
        item is enqueued in turn, as ``enqueue`` would be: the first stores the job and the
        others return it (a debounce takes each item's arguments, the last one's win) —
        one call per item, in order."""
        arguments = [_arguments(item) for item in items]
        if self.job_options.key is not None:
            return [producer.enqueue(self, [one])[0] for one in arguments]
        return producer.enqueue(self, arguments) if arguments else []

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job[R]:
        """Async twin of :meth:`enqueue`."""
        return (await producer.aenqueue(self, [(args, kwargs)]))[0]

    async def aenqueue_many(self, items: Iterable[Any]) -> list[Job[R]]:
        """Async twin of :meth:`enqueue_many`."""
        arguments = [_arguments(item) for item in items]
        if self.job_options.key is not None:  # one job per key: see enqueue_many
            return [(await producer.aenqueue(self, [one]))[0] for one in arguments]
        return await producer.aenqueue(self, arguments) if arguments else []


def _exception_classes(task: str, option: str, value: ExceptionClasses | None
                       ) -> tuple[type[BaseException], ...] | None:
    """``retry_on``/``no_retry_on`` as a tuple of exception classes (None: not given).

    :raises TypeError: an entry is no exception class (an instance, a string, ...)
    """
    if value is None:
        return None
    classes = value if isinstance(value, tuple) else (value,)
    for entry in classes:
        if not (isinstance(entry, type) and issubclass(entry, BaseException)):
            raise TypeError(
                f"task {task!r}: {option} takes exception classes (e.g. ({option}="
                f"(TimeoutError, ConnectionError)), got {entry!r}"
            )
    return classes


def _arguments(item: Any) -> producer.Arguments:
    """One item of ``enqueue_many`` as (args, kwargs): a dict is keyword arguments, a
    tuple or list positional ones, anything else the one positional argument."""
    if isinstance(item, Mapping):
        return (), dict(item)
    if isinstance(item, tuple | list):
        return tuple(item), {}
    return (item,), {}


class AsyncTask(Task[P, R]):
    """A task whose function is a coroutine function: calling it here gives a coroutine,
    and its jobs' results are what that coroutine returns (``R``)."""

    def __call__(  # type: ignore[override]
        self, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, R]:
        coroutine: Coroutine[Any, Any, R] = self.fn(*args, **kwargs)
        return coroutine


class TaskDecorator(Protocol):
    """What ``@app.task(...)`` with arguments returns: a decorator that keeps the
    function's parameters and return type (the awaited one for a coroutine function)."""

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]]) -> AsyncTask[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R]) -> Task[P, R]: ...


class BatchTaskDecorator(Protocol):
    """What ``@app.task(batch=...)`` returns: the function takes the list of items, and
    the task's ``enqueue`` takes one item's arguments (whatever they are)."""

    def __call__(self, fn: Callable[[list[BatchItem]], Any]) -> Task[..., Any]: ...
