"""Webhook alerts when jobs go dead: Slack-compatible, batched, rate-limited, retried.

An :class:`Alerter` is a :class:`~conveyor.hooks.Hook`: a worker tells it of each dead job
through :meth:`Alerter.dead`, and it only counts the job (per queue and task type, keeping
the first error and a few ids). A background task posts one message
``{"text": ...}`` summarising everything counted so far: the first one shortly after the
first death (``gather`` seconds, so a storm starts as one message), then at most one per
``min_interval``. A storm of 10,000 dead jobs therefore gives a handful of messages with
counts, and memory stays bounded by the number of task types, not of jobs. When the
endpoint fails (connection error, 5xx, 429) the same summary, grown by whatever died in
the meantime, is posted again after an exponential back-off (``Retry-After`` honoured).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from .hooks import Hook
from .job import JobInfo

log = logging.getLogger("conveyor.alerts")
TRIMMED = "(dead letters deleted by the cap)"  # the task name of trimmed dead letters' group
MAX_GROUP_LINES = 10  # task types listed in one message; the rest are summed up
EXAMPLE_IDS = 3


@dataclass(frozen=True, slots=True)
class Webhook:
    """Where and how often to alert; ``Conveyor(alert_webhook=...)`` takes this or a URL.

    :param url: endpoint receiving ``POST {"text": ...}`` (Slack incoming webhooks and
        their look-alikes: Mattermost, Rocket.Chat, Discord's ``/slack`` endpoint)
    :param gather: seconds to collect deaths before the first message of a storm
    :param min_interval: fewest seconds between two messages
    :param retry_max: longest back-off between attempts when the endpoint fails
    :param timeout: seconds one HTTP attempt may take
    """

    url: str
    gather: float = 2.0
    min_interval: float = 60.0
    retry_max: float = 300.0
    timeout: float = 10.0


@dataclass
class _Group:
    count: int = 0
    error: str = ""
    examples: list[str] = field(default_factory=list)


class DeliveryError(Exception):
    """The endpoint refused or could not be reached; ``retry_after`` if it said when."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def post_json(url: str, payload: dict[str, str], timeout: float) -> None:
    """POST ``payload`` as JSON (blocking; run it in a thread).

    :raises DeliveryError: connection failure or a non-2xx status
    """
    body = json.dumps(payload).encode()
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        retry_after = exc.headers.get("Retry-After") if exc.headers else None
        wait = float(retry_after) if retry_after and retry_after.isdigit() else None
        raise DeliveryError(f"HTTP {exc.code}", wait) from exc
    except (urllib.error.URLError, OSError) as exc:
        raise DeliveryError(str(exc)) from exc


def first_line(text: str | None, limit: int = 200) -> str:
    line = (text or "").strip().splitlines()[-1:] or [""]
    return line[0][:limit]  # the last line of a traceback names the exception


class Alerter(Hook):
    """Counts dead jobs and posts summaries from a background task on the running loop."""

    def __init__(self, webhook: Webhook | str, source: str = "conveyor") -> None:
        self.webhook = Webhook(webhook) if isinstance(webhook, str) else webhook
        self.source = source
        self.groups: dict[tuple[str, str], _Group] = {}
        self.sent = 0  # messages delivered
        self.failures = 0  # failed attempts
        self._task: asyncio.Task[None] | None = None
        self._next_send = 0.0  # monotonic time before which nothing is posted

    @property
    def pending(self) -> int:
        return sum(g.count for g in self.groups.values())

    def add(self, info: JobInfo) -> None:
        """Count one dead job (call on the event loop; never blocks)."""
        group = self.groups.setdefault((info.queue, info.task), _Group())
        group.count += 1
        if not group.error:
            group.error = first_line(info.error)
        if len(group.examples) < EXAMPLE_IDS:
            group.examples.append(info.id)
        self._schedule()

    def dead(self, info: JobInfo) -> None:
        """The hook a worker calls for each dead job: count it (see :meth:`add`)."""
        self.add(info)

    def add_trimmed(self, queue: str, short_ids: list[str], cap: int) -> None:
        """Count dead letters the dead-letter cap deleted: they are gone for good, and the
        set being full is itself worth an alert."""
        group = self.groups.setdefault((queue, TRIMMED), _Group())
        group.count += len(short_ids)
        group.error = f"the dead-letter set is full (cap {cap}); its oldest entries were deleted"
        ids = [f"{queue}~{short}" for short in short_ids[:EXAMPLE_IDS]]
        group.examples = (group.examples + ids)[:EXAMPLE_IDS]
        self._schedule()

    def _schedule(self) -> None:
        if self._task is None or self._task.done():
            self._next_send = max(self._next_send, time.monotonic() + self.webhook.gather)
            self._task = asyncio.get_running_loop().create_task(self._run(),
                                                                name="conveyor-alerts")

    def message(self) -> str:
        """The text summarising every dead job counted and not yet delivered."""
        total = sum(g.count for (_, task), g in self.groups.items() if task != TRIMMED)
        ordered = sorted(self.groups.items(), key=lambda item: -item[1].count)
        lines = [f":rotating_light: {self.source}: {total} job(s) went dead"]
        for (queue, task), group in ordered[:MAX_GROUP_LINES]:
            lines.append(f"• {group.count} x {task} (queue {queue}): {group.error or 'no error'}"
                         f" — e.g. {', '.join(group.examples)}")
        rest = ordered[MAX_GROUP_LINES:]
        if rest:
            lines.append(f"• and {sum(g.count for _, g in rest)} more in {len(rest)} other "
                         "task type(s)")
        lines.append("Inspect them with `conveyor dead list QUEUE`.")
        return "\n".join(lines)

    async def _run(self) -> None:
        backoff = 0.0
        while self.groups:
            delay = self._next_send - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                await self._deliver()
                backoff = 0.0
                self._next_send = time.monotonic() + self.webhook.min_interval
            except DeliveryError as exc:
                self.failures += 1
                backoff = min(self.webhook.retry_max, max(1.0, backoff * 2))
                wait = max(backoff, exc.retry_after or 0.0)
                log.warning("alert webhook failed (%s); retrying in %.0f s with %d dead job(s)"
                            " counted", exc, wait, self.pending)
                self._next_send = time.monotonic() + wait

    async def _deliver(self) -> None:
        if not self.groups:
            return
        delivered = self.groups
        self.groups = {}
        try:
            await asyncio.to_thread(post_json, self.webhook.url, {"text": self._text(delivered)},
                                    self.webhook.timeout)
        except BaseException:
            # Put the counts back, merged with what died meanwhile, for the next attempt.
            for key, group in delivered.items():
                newer = self.groups.get(key)
                if newer is not None:
                    group.count += newer.count
                    group.examples = (group.examples + newer.examples)[:EXAMPLE_IDS]
                self.groups[key] = group
            raise
        self.sent += 1

    def _text(self, groups: dict[tuple[str, str], _Group]) -> str:
        current, self.groups = self.groups, groups
        try:
            return self.message()
        finally:
            self.groups = current

    async def flush(self, timeout: float = 5.0) -> None:
        """Post what is counted now, ignoring the rate limit (a worker that stops)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if not self.groups:
            return
        try:
            await asyncio.wait_for(self._deliver(), timeout)
        except (DeliveryError, TimeoutError) as exc:
            log.error("could not post the last alert (%s): %d dead job(s) not reported",
                      exc, self.pending)


def alerter_for(target: Webhook | str | None, source: str = "conveyor") -> Alerter | None:
    """An :class:`Alerter` for an app's ``alert_webhook`` setting, or None when unset."""
    return Alerter(target, source) if target else None
