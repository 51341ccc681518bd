"""Task arguments and results decoded against the task function's type hints.

JSON carries a dataclass as an object, a ``datetime``, ``UUID`` or ``Decimal`` as a string,
``bytes`` as base64, a ``set`` or ``tuple`` as an array and an ``int`` dict key as a string
(MessagePack keeps a few more of these). Decoded as they are, a task annotated ``o: Order``
would receive a ``dict``. So the worker converts each argument to what its parameter is
annotated with (``msgspec.convert``), and a result to the return annotation: the function
sees the types it declared, as a direct call would give it. A parameter without an
annotation, or annotated ``Any`` or ``object``, receives what was decoded.

An argument that does not fit its annotation cannot be run as it stands, however often
it is retried: :class:`ArgumentMismatch` names the parameter, and the job ends dead.
"""

from __future__ import annotations

import inspect
import logging
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

log = logging.getLogger("conveyor")

_PASS = (Any, object, inspect.Parameter.empty)  # annotations that keep the decoded value
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class ArgumentMismatch(ValueError):
    """An argument of a job does not fit the annotation of its parameter."""


@dataclass(frozen=True, slots=True)
class Hints:
    """The types a task's arguments and result are converted to; ``None`` converts nothing.

    :param positional: (name, type) of each parameter a positional argument may fill, in
        order
    :param extra_positional: (name, type) of ``*args``, which every further positional
        argument is converted to, or None when there is no ``*args``
    :param keyword: type of each parameter a keyword argument may name
    :param extra_keyword: (name, type) of ``**kwargs``, for keywords naming no parameter
    :param result: the return annotation
    """

    positional: tuple[tuple[str, Any], ...] = ()
    extra_positional: tuple[str, Any] | None = None
    keyword: Mapping[str, Any] = field(default_factory=dict)
    extra_keyword: tuple[str, Any] | None = None
    result: Any = None
    any_argument: bool = False  # whether any argument is converted at all


NO_HINTS = Hints()


def _type(annotation: Any) -> Any:
    """The type to convert to, or None for an annotation that keeps the decoded value."""
    # By identity: an annotation object may define == as something else than equality.
    if any(annotation is kept for kept in _PASS) or isinstance(annotation, typing.TypeVar):
        return None
    return annotation


def hints_of(fn: Callable[..., Any], task: str) -> Hints:
    """Read the hints of ``fn`` once (at its first job). Annotations that cannot be
    resolved (a name imported only under ``TYPE_CHECKING``) convert nothing: the task gets
    what was decoded, as when it has no annotations, and a warning says why."""
    try:
        # Annotated[int, msgspec.Meta(ge=0)] keeps its constraints: convert checks them.
        resolved = typing.get_type_hints(fn, include_extras=True)
        parameters = inspect.signature(fn).parameters.values()
    except Exception as exc:  # NameError, TypeError, ValueError from odd callables
        log.warning("task %s: its type hints cannot be resolved (%s: %s); its arguments"
                    " and result are passed as decoded", task, type(exc).__name__, exc)
        return NO_HINTS
    positional: list[tuple[str, Any]] = []
    keyword: dict[str, Any] = {}
    extra_positional = extra_keyword = None
    for p in parameters:
        hint = _type(resolved.get(p.name, inspect.Parameter.empty))
        if p.kind in _POSITIONAL:
            positional.append((p.name, hint))
        if p.kind == inspect.Parameter.VAR_POSITIONAL:
            extra_positional = (p.name, hint)
        elif p.kind == inspect.Parameter.VAR_KEYWORD:
            extra_keyword = (p.name, hint)
        elif p.kind != inspect.Parameter.POSITIONAL_ONLY:
            keyword[p.name] = hint
    returns = _type(resolved.get("return", inspect.Parameter.empty))
    types = [t for _, t in positional] + list(keyword.values()) + [
        extra[1] for extra in (extra_positional, extra_keyword) if extra is not None]
    return Hints(tuple(positional), extra_positional, keyword, extra_keyword, returns,
                 any(t is not None for t in types))


_SCALARS = (int, str, float, bool)


def _convert(value: Any, to: Any, task: str, name: str) -> Any:
    if to is None or (to in _SCALARS and type(value) is to):
        return value  # nothing to convert: the common case, without a call into msgspec
    try:
        return msgspec.convert(value, to, str_keys=True)
    except (msgspec.ValidationError, TypeError) as exc:
        # msgspec says "Expected `int`, got `str` - at `$.id`": the path starts at `name`.
        text = str(exc).replace("`$", f"`{name}")
        text = text[:1].lower() + text[1:]
        raise ArgumentMismatch(f"argument {name!r} of task {task!r}: {text}") from exc


def _as_they_are(hints: Hints, args: Sequence[Any]) -> bool:
    """Whether positional ``args`` already have their parameters' types (scalars, or no
    annotation): nothing to convert, the path of most jobs."""
    if len(args) > len(hints.positional):
        return False
    for value, (_, to) in zip(args, hints.positional):  # noqa: B905 (fewer args than hints)
        if to is not None and not (to in _SCALARS and type(value) is to):
            return False
    return True


def convert_arguments(hints: Hints, task: str, args: Sequence[Any],
                      kwargs: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """``args`` and ``kwargs`` converted to the types of their parameters (each argument
    ``*args`` takes to its annotation, as each keyword ``**kwargs`` takes). Arguments that
    fill no parameter are left as they are: the call then fails as a direct call would.

    :raises ArgumentMismatch: an argument does not fit its parameter's annotation
    """
    if not hints.any_argument:
        return list(args), dict(kwargs)
    if not kwargs and _as_they_are(hints, args):
        return list(args), {}
    n = len(hints.positional)
    out_args = []
    for i, value in enumerate(args):
        if i < n:
            name, to = hints.positional[i]
        elif hints.extra_positional is not None:
            name, to = f"{hints.extra_positional[0]}[{i - n}]", hints.extra_positional[1]
        else:
            name, to = "", None
        out_args.append(_convert(value, to, task, name))
    extra = hints.extra_keyword[1] if hints.extra_keyword is not None else None
    out_kwargs = {key: _convert(value, hints.keyword.get(key, extra), task, key)
                  for key, value in kwargs.items()}
    return out_args, out_kwargs


def convert_result(hints: Hints, value: Any) -> Any:
    """A decoded result as its task's return annotation says; as decoded when it does not
    fit (the task was changed since the job ran): the value is kept, never lost."""
    if hints.result is None or value is None:
        return value
    try:
        return msgspec.convert(value, hints.result, str_keys=True)
    except (msgspec.ValidationError, TypeError):
        return value
