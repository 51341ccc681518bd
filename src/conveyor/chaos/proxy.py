"""The TCP proxies between the run's clients and the jobs' Redis, for black-hole, reset and
lost-reply faults: one in front of a worker process, one in front of half the producer's
enqueues. Each connects to the server that is primary when a connection opens (one server:
always the same), and the run resets them after a failover, as a TCP load balancer in
front of a Sentinel set does when its role check sees the primary change.

The proxies are :class:`conveyor.faults.proxy.Proxy` when that module is present; without
it a run skips the proxy faults and says so in its report.
"""

from __future__ import annotations

import hashlib
import importlib
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..scripts import SCRIPT_NAMES, source

__all__ = ["LOST_REPLY_TARGETS", "LostReplySpell", "ProxyLink", "open_proxy", "script_shas"]

Address = tuple[str, int]
WORKER, PRODUCER = "worker", "producer"
SETTLE = 0.5  # seconds a spell waits, once it ends, for the replies of chosen requests


def script_shas() -> dict[str, str]:
    """Script name -> the SHA1 its ``EVALSHA`` carries (that of its assembled source)."""
    return {name: hashlib.sha1(source(name).encode()).hexdigest() for name in SCRIPT_NAMES}


def _is_exec(request: bytes) -> bool:
    return request.startswith(b"*1\r\n$4\r\nEXEC\r\n") or request.upper().startswith(b"EXEC")


@dataclass(frozen=True, slots=True)
class Target:
    """What a lost-reply spell aims at: requests of these scripts (None: any script; with
    ``exec_too`` a transaction's EXEC too) or, with ``any_request``, every request, on the
    proxies of these clients."""

    clients: tuple[str, ...]
    scripts: tuple[str, ...] | None = None
    exec_too: bool = False
    any_request: bool = False


# target name -> (what it hits, relative frequency)
LOST_REPLY_TARGETS: dict[str, tuple[Target, float]] = {
    "fetch": (Target((WORKER,), ("fetch",)), 3.0),
    "finish": (Target((WORKER,), ("finish",)), 3.0),
    "enqueue": (Target((PRODUCER,), ("enqueue", "workflow_enqueue"), exec_too=True), 3.0),
    "heartbeat": (Target((WORKER,), ("heartbeat",)), 1.0),
    "wait": (Target((WORKER,), ("wait", "resume")), 1.0),
    "signal": (Target((PRODUCER,), ("signal",)), 1.0),
    "any script": (Target((WORKER, PRODUCER)), 1.0),
    "any request": (Target((WORKER, PRODUCER), any_request=True), 1.0),
}


@dataclass(slots=True)
class LostReplySpell:
    """What one spell did: requests chosen and replies lost, per client."""

    chosen: dict[str, int]
    lost: list[tuple[str, str]]  # (client, what the request was), in order


class ProxyLink:
    """What a run needs of its proxies: their URLs, black hole on and off and reset (the
    worker's), lost replies (both), following a new primary, close.

    :param worker: the started proxy in front of one worker process
    :param producer: the started proxy in front of the producer's routed enqueues
    """

    def __init__(self, worker: Any, producer: Any) -> None:
        self.proxies = {WORKER: worker, PRODUCER: producer}
        self.reach = 0  # jobs the proxied worker can hold (set by the run)
        self.shas = script_shas()
        self._names = {sha.encode(): name for name, sha in self.shas.items()}
        self.lost: Counter[str] = Counter()  # what was lost, by script or command, whole run
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        """The worker's proxy."""
        url: str = self.proxies[WORKER].url
        return url

    @property
    def producer_url(self) -> str:
        url: str = self.proxies[PRODUCER].url
        return url

    def blackhole(self) -> None:
        self.proxies[WORKER].blackhole()

    def heal(self) -> None:
        self.proxies[WORKER].heal()

    def reset(self) -> None:
        self.proxies[WORKER].reset()

    def follow(self) -> None:
        """After a failover: reset every connection, so that clients reconnect, to the new
        primary, instead of talking to a demoted server."""
        for proxy in self.proxies.values():
            proxy.reset()

    def close(self) -> None:
        for proxy in self.proxies.values():
            proxy.close()

    def describe(self, request: bytes) -> str:
        """A lost request as the report names it: its script, else its command."""
        head = request.split(b" ", 1)
        if head[0].upper() == b"EVALSHA" and len(head) == 2:
            return self._names.get(head[1], f"script {head[1][:8].decode(errors='replace')}")
        return head[0].decode(errors="replace").lower()

    def _match(self, target: Target) -> Callable[[bytes], bool] | None:
        if target.any_request:
            return None
        names = target.scripts if target.scripts is not None else tuple(self.shas)
        shas = tuple(self.shas[n].encode() for n in names)

        def match(request: bytes) -> bool:
            if target.exec_too and _is_exec(request):
                return True
            return b"EVALSHA" in request[:24].upper() and any(s in request for s in shas)

        return match

    def lose(self, target: Target, count: int, seconds: float, stop: threading.Event
             ) -> LostReplySpell:
        """Lose the replies of up to ``count`` requests of ``target`` on each of its
        proxies, for at most ``seconds``; then stop choosing, and wait a little for the
        replies of the requests already chosen."""
        match = self._match(target)
        rules = {client: self.proxies[client].lose_replies(match, count)
                 for client in target.clients}
        deadline = time.monotonic() + seconds
        while not stop.is_set() and time.monotonic() < deadline:
            if all(rule.lost + rule.missed >= count for rule in rules.values()):
                break
            stop.wait(0.05)
        for rule in rules.values():
            rule.cancel()
        settle = time.monotonic() + SETTLE
        while (time.monotonic() < settle and not stop.is_set()
               and any(r.lost + r.missed < r.chosen for r in rules.values())):
            stop.wait(0.05)
        lost = [(client, self.describe(request))
                for client, rule in rules.items() for request in list(rule.requests)]
        with self._lock:
            self.lost.update(what for _, what in lost)
        return LostReplySpell({client: rule.chosen for client, rule in rules.items()}, lost)


def open_proxy(target: Callable[[], Address]) -> tuple[ProxyLink | None, str]:
    """Started proxies to the address ``target()`` names at each new connection, or None
    and the reason there are none."""
    try:
        module = importlib.import_module("conveyor.faults.proxy")
    except ImportError:
        return None, "conveyor.faults.proxy is not available"
    if not hasattr(module.Proxy, "lose_replies"):
        return None, "conveyor.faults.proxy cannot lose replies"
    return ProxyLink(module.Proxy(target).start(), module.Proxy(target).start()), ""
