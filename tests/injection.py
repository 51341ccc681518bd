"""Fault injection: make chosen Redis calls of this process's asyncio clients fail.

A :class:`FaultPlan` patches redis-py's asyncio ``Redis.execute_command`` and
``Pipeline.execute`` while it is active. Each rule names a command (``"BLPOP"``), a
script (``"script:fetch"``, matched by its SHA; a plain enqueue, ``scripts/plain.py``, counts
as ``"script:enqueue"``) or ``"pipeline"`` (any pipeline), the error
to raise, and how many times; the call then fails before it reaches the server, exactly as
a client sees a refused or broken call. The errors are the ones a production Redis gives:
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis.asyncio.client
import redis.exceptions

from conveyor.scripts import SCRIPT_NAMES, AsyncScriptRunner, source

ERRORS: dict[str, Callable[[], BaseException]] = {
    "connection": lambda: redis.exceptions.ConnectionError("injected: connection reset by peer"),
    "timeout": lambda: redis.exceptions.TimeoutError("injected: timeout reading from socket"),
    "oom": lambda: redis.exceptions.OutOfMemoryError(
        "OOM command not allowed when used memory > 'maxmemory'."),
    "readonly": lambda: redis.exceptions.ReadOnlyError(
        "READONLY You can't write against a read only replica."),
    "unblocked": lambda: redis.exceptions.ResponseError(
        "UNBLOCKED force unblock from blocking operation, instance state changed"
        " (master -> replica?)"),
    "loading": lambda: redis.exceptions.BusyLoadingError(
        "LOADING Redis is loading the dataset in memory"),
    "busy": lambda: redis.exceptions.ResponseError(
        "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."),
    "noscript": lambda: redis.exceptions.NoScriptError("No matching script. Please use EVAL."),
    "clusterdown": lambda: redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"),
    "moved": lambda: redis.exceptions.MovedError("3999 127.0.0.1:6381"),
}


def _script_names() -> dict[str, str]:
    names = {}
    for name in SCRIPT_NAMES:
        sha = hashlib.sha1(source(name).encode()).hexdigest()  # as EVALSHA names it
        names[sha] = f"script:{name}"
    return names


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class FaultPlan:
    """Rules for failing calls; use as a context manager."""

    def __init__(self) -> None:
        self._rules: list[list[Any]] = []  # [target, make_error, remaining]
        self._lock = threading.Lock()
        self.injected: Counter[str] = Counter()
        self._scripts = _script_names()

    def fail(self, target: str, error: str | Callable[[], BaseException], times: int = 1
             ) -> FaultPlan:
        """Fail the next ``times`` calls of ``target`` with ``error`` (a key of ERRORS)."""
        make = ERRORS[error] if isinstance(error, str) else error
        with self._lock:
            self._rules.append([target, make, times])
        return self

    def clear(self) -> None:
        """Fail nothing more: every rule's remaining failures are dropped."""
        with self._lock:
            for rule in self._rules:
                rule[2] = 0

    def pending(self) -> int:
        with self._lock:
            return sum(rule[2] for rule in self._rules)

    def _name(self, args: tuple[Any, ...]) -> str:
        command = _text(args[0]).upper()
        if command == "EVALSHA" and len(args) > 1:
            return self._scripts.get(_text(args[1]).lower(), "script:?")
        return command

    def _take(self, names: list[str]) -> BaseException | None:
        with self._lock:
            for rule in self._rules:
                if rule[2] > 0 and rule[0] in names:
                    rule[2] -= 1
                    self.injected[rule[0]] += 1
                    return rule[1]()  # type: ignore[no-any-return]
        return None

    def __enter__(self) -> FaultPlan:
        plan = self
        self._execute_command = redis.asyncio.client.Redis.execute_command
        self._pipeline_execute = redis.asyncio.client.Pipeline.execute
        original_command, original_execute = self._execute_command, self._pipeline_execute

        async def execute_command(client: Any, *args: Any, **options: Any) -> Any:
            if not isinstance(client, redis.asyncio.client.Pipeline):
                error = plan._take([plan._name(args)])
                if error is not None:
                    raise error
            return await original_command(client, *args, **options)

        async def execute(pipe: Any, raise_on_error: bool = True) -> Any:
            names = ["pipeline"] + [plan._name(c[0]) for c in pipe.command_stack]
            error = plan._take(names)
            if error is not None:
                await pipe.reset()
                raise error
            return await original_execute(pipe, raise_on_error)

        self._send = AsyncScriptRunner._send
        self._plain = AsyncScriptRunner.enqueue_plain
        original_send, original_plain = self._send, self._plain

        async def send(runner: Any, call: Any, pool: Any, *args: Any) -> Any:  # direct path
            error = plan._take([f"script:{call.name}"])
            if error is not None:
                raise error
            return await original_send(runner, call, pool, *args)

        async def enqueue_plain(runner: Any, *args: Any, **options: Any) -> None:
            # A plain enqueue (scripts/plain.py) stands in for the enqueue script.
            error = plan._take(["script:enqueue", "plain:enqueue"])
            if error is not None:
                raise error
            await original_plain(runner, *args, **options)

        redis.asyncio.client.Redis.execute_command = execute_command  # type: ignore[method-assign]
        redis.asyncio.client.Pipeline.execute = execute  # type: ignore[method-assign]
        AsyncScriptRunner._send = send  # type: ignore[method-assign]
        AsyncScriptRunner.enqueue_plain = enqueue_plain  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        redis.asyncio.client.Redis.execute_command = self._execute_command  # type: ignore[method-assign]
        redis.asyncio.client.Pipeline.execute = self._pipeline_execute  # type: ignore[method-assign]
        AsyncScriptRunner._send = self._send  # type: ignore[method-assign]
        AsyncScriptRunner.enqueue_plain = self._plain  # type: ignore[method-assign]
