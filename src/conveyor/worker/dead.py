"""Telling of dead jobs: the hooks that hear of each one, and the dead letters the cap deleted.

A job goes dead when a fetch finds it cannot run (its record is broken) or when its last
outcome is recorded. Either way the worker that saw it reads its record (one pipelined
round trip for a batch) and calls :meth:`~conveyor.hooks.Hook.dead` of every hook that
listens: the alert webhook's :class:`~conveyor.alerts.Alerter`, the app's ``on_dead``
callbacks, and the app's hooks that override the method. With none of them there is
nothing to read, and no command is sent.

Dead letters the dead-letter cap deleted are gone for good: they are logged, and the
alerter (if any) counts them for its next message.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..hooks import Hook
from ..job import JobInfo
from .backoff import REDIS_ERRORS, pause_after

if TYPE_CHECKING:
    from ..alerts import Alerter
    from ..app import Conveyor

log = logging.getLogger("conveyor.worker")
HOOK_READ_TRIES = 8  # about 10 s of back-off


class Callback(Hook):
    """An ``on_dead`` (or ``on_expire``) callback as a hook (a function of the job's info,
    sync or async)."""

    def __init__(self, callback: Callable[[JobInfo], Any]) -> None:
        self.callback = callback

    def dead(self, info: JobInfo) -> Awaitable[None] | None:
        result = self.callback(info)
        return result if inspect.isawaitable(result) else None

    def __repr__(self) -> str:
        return repr(self.callback)


def _listens(hook: Hook) -> bool:
    return type(hook).dead is not Hook.dead


class DeadNotices:
    """Tells the hooks of dead jobs, in the background of the running loop.

    :param app: the application (its ``on_dead`` callbacks and hooks, read at each notice,
        so that those added later are heard too; its keys and client, to read records)
    :param alerter: the alert webhook's alerter, if the app has one: it hears of dead jobs
        first, and of dead letters the cap deleted
    """

    def __init__(self, app: Conveyor, alerter: Alerter | None = None) -> None:
        self.app = app
        self.alerter = alerter
        self._tasks: set[asyncio.Task[None]] = set()

    def hooks(self) -> list[Hook]:
        """Who hears of dead jobs now, in the order they are told."""
        heard: list[Hook] = [] if self.alerter is None else [self.alerter]
        heard += [Callback(callback) for callback in self.app.dead_hooks]
        heard += [hook for hook in self.app.hooks if _listens(hook)]
        return heard

    def dead(self, queue: str, short_ids: list[str]) -> None:
        """These jobs of ``queue`` went dead: tell the hooks (in the background)."""
        hooks = self.hooks()
        if hooks:
            task = asyncio.get_running_loop().create_task(self._tell(queue, short_ids, hooks))
            self._tasks.add(task)  # held until done: the loop keeps only weak references
            task.add_done_callback(self._tasks.discard)

    def expired(self, queue: str, short_ids: list[str]) -> None:
        """These jobs of ``queue`` expired: tell the app's ``on_expire`` callbacks."""
        hooks: list[Hook] = [Callback(callback) for callback in self.app.expire_hooks]
        if hooks:
            task = asyncio.get_running_loop().create_task(self._tell(queue, short_ids, hooks))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def trimmed(self, queue: str, short_ids: list[str]) -> None:
        """Dead letters deleted by the cap: log them and alert (they are gone for good)."""
        log.error("dead-letter set of %s is full (cap %d): %d oldest dead job(s) deleted: %s",
                  queue, self.app.limits.dead_cap, len(short_ids), ", ".join(short_ids[:5]))
        if self.alerter is not None:
            self.alerter.add_trimmed(queue, short_ids, self.app.limits.dead_cap)

    async def flush(self) -> None:
        """Post what the alerter has counted, ignoring its rate limit (a worker that stops,
        or a burst worker done with its queues)."""
        if self.alerter is not None:
            await self.alerter.flush()

    async def _tell(self, queue: str, short_ids: list[str], hooks: list[Hook]) -> None:
        records = await self._read(queue, short_ids)
        for short, record in zip(short_ids, records, strict=True):
            if not record:
                continue
            try:
                info = JobInfo.from_record(self.app, queue, short, record)
            except Exception:
                log.exception("dead job %s~%s has a record that cannot be read", queue, short)
                continue
            for hook in hooks:
                try:
                    heard = hook.dead(info)
                    if heard is not None:
                        await heard
                except Exception:
                    log.exception("dead hook %r failed for job %s", hook, info.id)

    async def _read(self, queue: str, short_ids: list[str]) -> list[Any]:
        """The records of ``short_ids`` (one round trip), tried again after a pause; none
        (logged) when Redis cannot be read for long."""
        keys = self.app.keys(queue)
        for failures in range(1, HOOK_READ_TRIES + 1):
            try:
                async with self.app.aredis().pipeline(transaction=False) as pipe:
                    for short in short_ids:  # one round trip for a whole batch of dead jobs
                        pipe.hgetall(keys.job(short))
                    return list(await pipe.execute())
            except REDIS_ERRORS as exc:
                if failures == HOOK_READ_TRIES:
                    log.error("could not read %d dead job(s) of %s for the dead hooks and"
                              " alerts (%s): %s", len(short_ids), queue, exc,
                              ", ".join(short_ids[:5]))
                    return [None] * len(short_ids)
                await asyncio.sleep(pause_after(failures))
        return [None] * len(short_ids)
