"""Tasks: functions registered with ``@app.task``, and how their jobs are enqueued.

Task arguments never share a namespace with job options: ``task.enqueue(*args, **kwargs)``
passes everything to the function, and options go through ``task.options(...)``, which
returns a frozen copy.
"""

from __future__ import annotations

import base64
import dataclasses
import inspect
import os
import random
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Self, TypeVar

from . import keys as keyspace
from .errors import ConfigurationError
from .hooks import enqueueing, take_trace_id
from .job import Job
from .scripts import calls

if TYPE_CHECKING:
    from .app import Conveyor

P = ParamSpec("P")
R = TypeVar("R")

MAX_RETRY_DELAY = 3600.0


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
                f"unknown job option(s) {', '.join(sorted(unknown))}: expected delay, at,"
                " priority, tenant, key, durable, debounce, debounce_max or throttle"
            )
        values = dict(changes)
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


def new_short_id() -> str:
    """A random 96-bit job id, 16 URL-safe characters: short, so queued jobs cost little
    memory."""
    return base64.urlsafe_b64encode(os.urandom(12)).decode()


def new_short_ids(n: int) -> list[str]:
    """``n`` ids as :func:`new_short_id` makes them, from one read of the OS's randomness
    (12 bytes encode to 16 characters without padding, so each id is a slice)."""
    text = base64.urlsafe_b64encode(os.urandom(12 * n)).decode()
    return [text[i:i + 16] for i in range(0, 16 * n, 16)]


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
    ) -> None:
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
        self.is_async = inspect.iscoroutinefunction(fn)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue!r}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = self.fn(*args, **kwargs)
        return result

    @property
    def max_attempts(self) -> int:
        return self.retries + 1

    def retry_delay(self, attempts: int) -> float:
        """Seconds before the next attempt: exponential in ``attempts``, jittered, capped."""
        exp = float(self.backoff) * 2.0 ** max(0, attempts - 1)
        return min(MAX_RETRY_DELAY, exp) * random.uniform(0.5, 1.0)

    def options(self, **changes: Any) -> Self:
        """A copy of this task whose jobs are enqueued with other options.

        :param changes: any of ``delay``, ``at``, ``priority``, ``tenant``, ``key``,
            ``durable``, ``debounce``, ``debounce_max``, ``throttle``
        """
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__)
        copy.__dict__.pop("_spec_cache", None)
        copy.job_options = self.job_options.merged(changes)
        return copy

    def _spec(self) -> calls.JobSpec:
        """What every job enqueued through this task (and its options) shares (made once:
        the options of a task object never change)."""
        spec: calls.JobSpec | None = self.__dict__.get("_spec_cache")
        if spec is None:
            spec = self.__dict__["_spec_cache"] = self._make_spec()
        return spec

    def _make_spec(self) -> calls.JobSpec:
        o = self.job_options
        return calls.JobSpec(
            task=self.name,
            priority=o.priority,
            tenant=o.tenant or "",
            delay_ms=None if o.delay is None else o.delay * 1000,
            at_ms=None if o.at is None else o.at * 1000,
            max_attempts=self.max_attempts,
            key=o.key or "",
            visibility_ms=max(1, int(self.visibility_timeout * 1000)),
            debounce_ms=None if o.debounce is None else o.debounce * 1000,
            debounce_max_ms=None if o.debounce_max is None else o.debounce_max * 1000,
            throttle_ms=None if o.throttle is None else o.throttle * 1000,
        )

    def _call_spec(self, meta: dict[str, str] | None) -> calls.JobSpec:
        """The spec of one enqueue call: the task's, with the call's trace id if a hook
        gave one (taken out of ``meta``: call before encoding the jobs)."""
        trace_id = take_trace_id(meta)
        return self._spec()._replace(trace=trace_id) if trace_id else self._spec()

    def _new_job(self, args: Sequence[Any], kwargs: dict[str, Any],
                 meta: dict[str, str] | None = None) -> tuple[str, bytes]:
        return new_short_id(), self.app.codec.encode_args(self.name, tuple(args), kwargs, meta)

    def _batch(self, items: Iterable[Any], meta: dict[str, str] | None = None
               ) -> list[tuple[str, bytes]]:
        encode, name = self.app.codec.encode_args, self.name
        items = list(items)
        jobs = []
        for short_id, item in zip(new_short_ids(len(items)), items, strict=True):
            if isinstance(item, Mapping):
                jobs.append((short_id, encode(name, (), dict(item), meta)))
            elif isinstance(item, tuple | list):
                jobs.append((short_id, encode(name, tuple(item), {}, meta)))
            else:
                jobs.append((short_id, encode(name, (item,), {}, meta)))
        if self.job_options.key is not None and len(jobs) > 1:
            raise ConfigurationError(
                "a dedupe key names one job: use it with enqueue, not enqueue_many"
            )
        return jobs

    def _jobs(self, replies: list[tuple[str, bool]]) -> list[Job[R]]:
        return [Job._of(self.app, self.queue, short) for short, _ in replies]

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job[R]:
        """Store a job that calls this task with these arguments; it is in Redis on return.

        :raises SerializationError: an argument cannot be encoded (nothing is written)
        :raises PayloadTooLarge: the encoded arguments are over the limit
        """
        with enqueueing(self.app, self, 1) as meta:
            spec = self._call_spec(meta)
            stored = self.app.store(self.queue, spec, [self._new_job(args, kwargs, meta)],
                                    durable=self.job_options.durable)
        return self._jobs(stored)[0]

    def enqueue_many(self, items: Iterable[Any]) -> list[Job[R]]:
        """Store many jobs in one round trip; each item is a tuple of positional arguments,
        a dict of keyword arguments, or a single argument. The options apply to every job."""
        items = list(items)
        if not items:
            return []
        with enqueueing(self.app, self, len(items)) as meta:
            spec = self._call_spec(meta)
            jobs = self._batch(items, meta)
            return self._jobs(self.app.store(self.queue, spec, jobs,
                                             durable=self.job_options.durable))

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job[R]:
        """Async twin of :meth:`enqueue`."""
        with enqueueing(self.app, self, 1) as meta:
            spec = self._call_spec(meta)
            stored = await self.app.astore(self.queue, spec,
                                           [self._new_job(args, kwargs, meta)],
                                           durable=self.job_options.durable)
        return self._jobs(stored)[0]

    async def aenqueue_many(self, items: Iterable[Any]) -> list[Job[R]]:
        """Async twin of :meth:`enqueue_many`."""
        items = list(items)
        if not items:
            return []
        with enqueueing(self.app, self, len(items)) as meta:
            spec = self._call_spec(meta)
            jobs = self._batch(items, meta)
            return self._jobs(await self.app.astore(self.queue, spec, jobs,
                                                    durable=self.job_options.durable))


class AsyncTask(Task[P, R]):
    """A task whose function is a coroutine function: calling it here gives a coroutine,
    and its jobs' results are what that coroutine returns (``R``)."""

    def __call__(  # type: ignore[override]
        self, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, R]:
        coroutine: Coroutine[Any, Any, R] = self.fn(*args, **kwargs)
        return coroutine
