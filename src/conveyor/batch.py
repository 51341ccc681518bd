"""Batch tasks: one call of the function for many jobs (``@app.task(batch=Batch(...))``).

Each item is still a job of its own (its id, attempts, retries, dead letter, cancel,
limits and tenant turn); only the call is shared. :class:`Batch` says how many jobs one
call takes and how long a worker gathers them; :class:`BatchItem` is one job as the
function sees it, and how the function settles that job alone. The worker's side is
:mod:`conveyor.worker.batches`; the semantics are in ``docs/batches.md``.
"""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .errors import ConfigurationError

__all__ = ["Batch", "BatchItem", "check_batch_function"]

_UNSET: Any = object()  # no result recorded: the item succeeds with None


@dataclass(frozen=True, slots=True)
class Batch:
    """How a worker gathers the jobs of a batch task into calls.

    :param max: most items in one call; a call is made as soon as this many are gathered
    :param min: once this many are gathered, a call is made as soon as the queue has no
        more ready jobs (a lone job under low load does not wait ``wait`` seconds)
    :param wait: seconds after the first gathered item that a call is made, however few
        items there are
    :param by: ``"tenant"``: one call never mixes jobs of different tenants
    :raises ConfigurationError: a value out of range, naming it
    """

    max: int = 100
    min: int = 1
    wait: float = 2.0
    by: Literal["tenant"] | None = None

    def __post_init__(self) -> None:
        for name in ("max", "min"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"Batch {name} must be an integer >= 1, got {value!r}")
        if self.min > self.max:
            raise ConfigurationError(
                f"Batch min must be at most max, got min={self.min} max={self.max}")
        wait = self.wait
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not wait > 0 \
                or not math.isfinite(wait):
            raise ConfigurationError(f"Batch wait must be a number of seconds > 0, got {wait!r}")
        if self.by not in (None, "tenant"):
            raise ConfigurationError(f"Batch by must be None or 'tenant', got {self.by!r}")


class BatchItem:
    """One job of a batch call, as the batch function sees it.

    Leave an item alone and it succeeds when the function returns (or is retried when the
    function raises); mark it to settle it alone, whatever the function does next:
    :meth:`fail`, :meth:`retry`, or set :attr:`result` (it succeeds with that result, also
    when the function raises afterwards).

    :ivar id: the job's public id (``job.id`` of what ``enqueue`` returned)
    :ivar args: the positional arguments ``enqueue`` got
    :ivar kwargs: the keyword arguments ``enqueue`` got
    :ivar tenant: the job's tenant (None for none)
    :ivar attempt: 1 on the first run, 2 on the first retry, ...
    :ivar max_attempts: runs allowed in all
    """

    __slots__ = ("_lease", "_mark", "_progress", "_result", "args", "attempt", "id",
                 "kwargs", "max_attempts", "tenant")

    def __init__(self, id: str, args: list[Any], kwargs: dict[str, Any], tenant: str | None,
                 attempt: int, max_attempts: int, *, lease: Any = None,
                 progress: Any = None) -> None:
        self.id = id
        self.args = args
        self.kwargs = kwargs
        self.tenant = tenant
        self.attempt = attempt
        self.max_attempts = max_attempts
        self._lease = lease  # the worker's hold on the job: its cancel flag, its progress
        self._progress = progress
        self._mark: tuple[str, str] | None = None
        self._result: Any = _UNSET

    def __repr__(self) -> str:
        return f"<BatchItem {self.id} attempt {self.attempt}/{self.max_attempts}>"

    def fail(self, reason: str) -> None:
        """End this item dead now, with ``reason`` as its error (no retry)."""
        self._mark = ("dead", _reason("fail", reason))

    def retry(self, reason: str) -> None:
        """Retry this item alone (after its backoff; dead once its attempts are spent)."""
        self._mark = ("retry", _reason("retry", reason))

    @property
    def result(self) -> Any:
        """The result recorded for this job (``job.result()``); None until set."""
        return None if self._result is _UNSET else self._result

    @result.setter
    def result(self, value: Any) -> None:
        self._result = value

    @property
    def marked(self) -> tuple[str, str] | None:
        """How this item was settled by the function: ``("dead" | "retry", reason)`` after
        :meth:`fail` or :meth:`retry` (which win over a result), ``("ok", "")`` once
        :attr:`result` was set; None when it was left alone."""
        if self._mark is not None:
            return self._mark
        return None if self._result is _UNSET else ("ok", "")

    @property
    def cancelled(self) -> bool:
        """True once someone cancelled this job during the call: it has ended cancelled
        already, and whatever the call records for it is dropped."""
        return bool(getattr(self._lease, "cancel_requested", False))

    def progress(self, fraction: float, note: str | None = None) -> None:
        """Report how far this job has got (as ``current_job().progress``); never blocks.

        :raises ValueError: ``fraction`` is not a number from 0 to 1
        """
        value = float(fraction)
        if math.isnan(value) or not 0.0 <= value <= 1.0:
            raise ValueError(f"progress must be a number from 0 to 1, got {fraction!r}")
        if self._progress is not None and self._lease is not None:
            self._progress.report(self._lease, value, (note or "")[:1000])


def _reason(method: str, reason: Any) -> str:
    if not isinstance(reason, str) or not reason:
        raise TypeError(f"BatchItem.{method} needs a reason: a non-empty string, got {reason!r}")
    return reason


def check_batch_function(fn: Callable[..., Any], task: str) -> None:
    """Refuse, at registration, a batch function that cannot take the list of items: it
    must take one positional argument, and an annotation on it, if any, must be a list
    (or sequence) of :class:`BatchItem`.

    :raises ConfigurationError: naming the task and what is wrong
    """
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"task {task!r}: batch= needs a function: {exc}") from None
    positional = [p for p in parameters if p.kind in (
        inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.VAR_POSITIONAL)]
    required = [p for p in parameters if p.default is inspect.Parameter.empty
                and p.kind not in (inspect.Parameter.VAR_POSITIONAL,
                                   inspect.Parameter.VAR_KEYWORD)]
    if not positional or len(required) > 1:
        raise ConfigurationError(
            f"task {task!r}: a batch function takes one argument, the list of items"
            f" (def {getattr(fn, '__name__', 'fn')}(items: list[conveyor.BatchItem])),"
            f" got {len(required)} required parameter(s)")
    annotation = _annotation(fn, positional[0].name)
    if annotation is not None and not _is_item_list(annotation):
        raise ConfigurationError(
            f"task {task!r}: the first parameter of a batch function receives the list of"
            f" items: annotate it list[conveyor.BatchItem], not {annotation!r}")


def _annotation(fn: Callable[..., Any], name: str) -> Any:
    """The resolved annotation of parameter ``name``; None when absent or unresolvable
    (a name imported only under ``TYPE_CHECKING``: nothing to check against)."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        return None
    return hints.get(name)


def _is_item_list(annotation: Any) -> bool:
    if annotation is Any or annotation is object:
        return True
    origin = typing.get_origin(annotation)
    if origin is None or not isinstance(origin, type):
        return False
    if not issubclass(origin, Sequence):
        return False
    args = typing.get_args(annotation)
    return not args or args[0] is BatchItem or args[0] is Any
