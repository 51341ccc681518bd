"""What conveyor needs from its Redis server, checked: each check is a one-line verdict and,
when something is wrong, its fix.

``conveyor doctor`` prints them; a worker runs them once at start and logs what is wrong
(:mod:`conveyor.worker.server_check`). The probes read, except one: the scripting check
writes a key of the namespace's doctor tag that expires within a second, since a server
that runs scripts but refuses writes (a replica, an exhausted ``maxmemory``) is no more
use to conveyor than one without scripts.

Statuses: ``ok``; ``warn`` (conveyor works, but can lose jobs or run slower);
``fail`` (conveyor cannot work: no scripts, no writes, commands it needs refused);
``skip`` (the server would not say, e.g. ``CONFIG`` renamed on a managed service). The exit
status of ``conveyor doctor`` is 1 when a check failed, 2 when one warned, else 0, so that
a deploy check may choose whether warnings stop it.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from redis.exceptions import ResponseError

from .clock import aserver_now
from .scripts import MAX_COMMAND_ARGS, SCRIPT_NAMES, source

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
PROBE_ARGS = 4000  # keys of the EXISTS that probes the argument limit
PINGS = 5
SLOW_MS = 20.0  # a round trip above this is a warning: every job costs several
CLOCK_SKEW_S = 2.0  # conveyor runs on the server's clock; a client far off misreads at=
MIN_VERSION = (7, 0)  # '#!lua' script flags, LMPOP, BLMOVE
_CALL = re.compile(r"(?:redis\.p?call|list_call)\('([A-Z]+)'")


@dataclass(frozen=True, slots=True)
class Check:
    """One verdict: ``status`` is ``ok``, ``warn``, ``fail`` or ``skip``."""

    name: str
    status: str
    detail: str
    fix: str = ""


@dataclass(frozen=True, slots=True)
class Report:
    """Every check, in the order they ran."""

    checks: tuple[Check, ...]

    @property
    def exit_code(self) -> int:
        """1 when a check failed, 2 when one warned, else 0."""
        statuses = {c.status for c in self.checks}
        return 1 if FAIL in statuses else 2 if WARN in statuses else 0

    def as_dict(self) -> dict[str, Any]:
        return {"exit_code": self.exit_code, "checks": [asdict(c) for c in self.checks]}


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _short(exc: BaseException, limit: int = 48) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


class Probe:
    """Sends commands to the server a client writes to: on a Cluster, to its first
    primary (what is checked on one primary holds for the others when they are configured
    alike; the topology line says how many there are)."""

    def __init__(self, client: Any, namespace: str) -> None:
        self.client = client
        self.tag = f"{{{namespace}:doctor}}"
        self.cluster = hasattr(client, "get_primaries")
        self._node: Any = None

    async def __call__(self, *args: Any) -> Any:
        if not self.cluster:
            return await self.client.execute_command(*args)
        if self._node is None:
            await self.client.initialize()
            self._node = sorted(self.client.get_primaries(), key=lambda n: n.name)[0]
        return await self.client.execute_command(*args, target_nodes=self._node)


def engine_of(server: dict[str, Any]) -> tuple[str, str]:
    """(engine, version) from ``INFO server``."""
    if "dragonfly_version" in server:
        return "Dragonfly", _text(server["dragonfly_version"])
    if _text(server.get("server_name", "")).lower() == "valkey" or "valkey_version" in server:
        return "Valkey", _text(server.get("valkey_version", server.get("redis_version", "?")))
    if "redis_version" in server:
        return "Redis", _text(server["redis_version"])
    return "unknown engine", "?"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:2])


def check_engine(server: dict[str, Any]) -> Check:
    name, version = engine_of(server)
    what = f"{name} {version}"
    if name in ("Redis", "Valkey"):
        if _version(version) < MIN_VERSION:
            return Check("engine", FAIL, f"{what}: scripts need 7.0", "upgrade to 7.0+")
        return Check("engine", OK, what)
    if name == "Dragonfly":
        return Check("engine", WARN, f"{what}: not tested", "--lock_on_hashtags")
    return Check("engine", WARN, f"{what}: not tested")


def check_scripting(reply: Any) -> Check:
    """``reply``: what the probe script returned, or the error it raised."""
    if not isinstance(reply, BaseException):
        return Check("scripting", OK, "scripts run and write")
    text = str(reply)
    if text.startswith("READONLY") or "replica" in text.lower():
        return Check("scripting", FAIL, "writes refused (a replica?)", "use the primary")
    if text.startswith("NOPERM"):
        return Check("scripting", FAIL, "this user may not run scripts", "ACL +@scripting")
    if text.startswith("OOM"):
        return Check("scripting", FAIL, "out of memory: writes refused", "raise maxmemory")
    if "unknown command" in text.lower():
        return Check("scripting", FAIL, "no Lua scripting on this server", "enable Lua")
    return Check("scripting", FAIL, _short(reply))


def check_persistence(aof: bool | None, save: str | None) -> Check:
    """``aof``: ``aof_enabled``; ``save``: the ``save`` setting (None: not readable)."""
    if aof:
        return Check("persistence", OK, "AOF on")
    if save is None:
        return Check("persistence", WARN, "AOF off; RDB unknown", "appendonly yes")
    if save.strip():
        return Check("persistence", WARN, "RDB only: a crash loses recent jobs",
                     "appendonly yes")
    return Check("persistence", WARN, "none: a restart loses every job", "appendonly yes")


def check_memory(memory: dict[str, Any]) -> Check:
    policy = _text(memory.get("maxmemory_policy", "?"))
    limit = int(memory.get("maxmemory", 0) or 0)
    if policy == "noeviction":
        shown = f"{limit // 2**20} MiB" if limit else "no maxmemory"
        return Check("memory", OK, f"noeviction, {shown}")
    if limit:
        return Check("memory", WARN, f"{policy}: may evict jobs",
                     "maxmemory-policy noeviction")
    return Check("memory", OK, f"no maxmemory ({policy} once one is set)")


async def topology(probe: Probe) -> Check:
    if probe.cluster:
        primaries = probe.client.get_primaries()
        return Check("topology", OK, f"Cluster with {len(primaries)} primaries")
    replication = await probe("INFO", "replication")
    role = _text(replication.get("role", "?"))
    replicas = int(replication.get("connected_slaves", 0) or 0)
    pool = getattr(probe.client, "connection_pool", None)
    service = getattr(pool, "service_name", None)
    if role != "master":
        return Check("topology", FAIL, f"connected to a {role}", "point --url at the primary")
    kind = f"Sentinel primary {_text(service)!r}" if service else "plain primary"
    return Check("topology", OK, f"{kind} with {replicas} replica{'s' * (replicas != 1)}")


async def argument_limit(probe: Probe) -> Check:
    """EXISTS of :data:`PROBE_ARGS` keys (one slot: the doctor's tag); if refused, of as
    many as conveyor sends at most."""
    keys = [f"{probe.tag}:{i}" for i in range(PROBE_ARGS)]
    try:
        await probe("EXISTS", *keys)
        return Check("arguments", OK, f"{PROBE_ARGS:,} keys in one command accepted"
                     f" (conveyor sends ≤ {MAX_COMMAND_ARGS:,} words)")
    except ResponseError:
        pass
    try:
        await probe("EXISTS", *keys[:MAX_COMMAND_ARGS - 1])
    except ResponseError as exc:
        return Check("arguments", FAIL, f"{MAX_COMMAND_ARGS:,} words refused: {_short(exc, 30)}")
    return Check("arguments", OK, f"{PROBE_ARGS:,} keys refused, {MAX_COMMAND_ARGS:,} words"
                 " accepted")


async def latency(probe: Probe) -> tuple[Check, Check]:
    """The median of :data:`PINGS` round trips, and the offset of the server's clock
    (``TIME``, read halfway through its round trip) from this machine's."""
    trips = []
    for _ in range(PINGS):
        start = time.perf_counter()
        await probe("PING")
        trips.append((time.perf_counter() - start) * 1000)
    median = statistics.median(trips)
    before = time.time()
    server_now = await aserver_now(probe.client)
    after = time.time()
    offset = server_now - (before + after) / 2
    ping = Check("latency", WARN if median > SLOW_MS else OK,
                 f"median of {PINGS} PINGs {median:.2f} ms")
    clock = Check("clock", WARN if abs(offset) > CLOCK_SKEW_S else OK,
                  f"server {round(offset * 1000) or 0:+d} ms from this machine",
                  "sync clocks (NTP)" if abs(offset) > CLOCK_SKEW_S else "")
    return ping, clock


def needed_commands() -> list[tuple[str, ...]]:
    """What conveyor sends, as the commands ``ACL DRYRUN`` checks: the transport's, then
    each command its scripts call (a script's commands are checked against its caller)."""
    inner = sorted({m for name in SCRIPT_NAMES for m in _CALL.findall(source(name))}
                   | {"XADD"})
    return [("EVALSHA",), ("EVAL",), ("SCRIPT", "LOAD"), ("MULTI",), ("EXEC",),
            *((c,) for c in inner)]


def _dryrun_args(command: tuple[str, ...], info: dict[str, Any], key: str) -> list[str]:
    """``command`` with as many arguments as its arity asks (``key`` for each: DRYRUN
    checks permissions, it runs nothing), a script call with one key."""
    if command[0] == "EVALSHA":
        return ["EVALSHA", "0" * 40, "1", key]
    if command[0] == "EVAL":
        return ["EVAL", "return 1", "1", key]
    arity = int(info.get("arity", -2))  # negative: at least that many words
    return [*command, *[key] * max(0, abs(arity) - len(command))]


async def acl(probe: Probe) -> Check:
    try:
        user = _text(await probe("ACL", "WHOAMI"))
        arities = await probe("COMMAND", "INFO", *{c[0] for c in needed_commands()})
    except ResponseError as exc:
        return Check("acl", SKIP, f"ACL not readable: {_short(exc, 40)}")
    refused = []
    for command in needed_commands():
        args = _dryrun_args(command, arities.get(command[0].lower()) or {}, f"{probe.tag}:acl")
        try:
            verdict = _text(await probe("ACL", "DRYRUN", user, *args))
        except ResponseError as exc:
            if "DRYRUN" in str(exc).upper() or str(exc).startswith(("NOPERM", "ERR unknown")):
                return Check("acl", SKIP, f"ACL DRYRUN unavailable: {_short(exc, 30)}")
            continue  # a probe this checker built badly says nothing of the user
        if verdict != "OK":
            refused.append(" ".join(command))
    if refused:
        listed = ", ".join(refused[:4]) + (" …" if len(refused) > 4 else "")
        return Check("acl", FAIL, f"{user!r} may not run {listed}", "ACL SETUSER")
    return Check("acl", OK, f"{user!r} may run the {len(needed_commands())} commands needed")


SCRIPT_PROBE = "#!lua\nredis.call('SET', KEYS[1], '1', 'PX', 1000)\nreturn 1\n"


async def _guard(name: str, step: Callable[[], Awaitable[Check]]) -> Check:
    """A check whose probe the server refused: skipped with the reason, not a crash."""
    try:
        return await step()
    except ResponseError as exc:
        return Check(name, SKIP, f"refused: {_short(exc, 50)}")


async def _config(probe: Probe, name: str) -> str | None:
    try:
        reply = await probe("CONFIG", "GET", name)
    except ResponseError:  # renamed or forbidden on managed services
        return None
    values = {_text(k): _text(v) for k, v in reply.items()}
    return values.get(name)


async def run_checks(client: Any, namespace: str = "conveyor") -> Report:
    """Every check against ``client``'s server (a redis.asyncio client: plain, Sentinel
    or Cluster).

    :raises redis.exceptions.ConnectionError: the server cannot be reached
    """
    probe = Probe(client, namespace)
    server = await probe("INFO", "server")
    checks = [check_engine(server)]
    try:
        reply: Any = await probe("EVAL", SCRIPT_PROBE, 1, f"{probe.tag}:script")
    except ResponseError as exc:
        reply = exc
    checks.append(check_scripting(reply))
    persistence = await probe("INFO", "persistence")
    aof = str(persistence.get("aof_enabled", "0")) == "1"
    checks.append(check_persistence(aof, await _config(probe, "save")))
    checks.append(check_memory(await probe("INFO", "memory")))
    checks.append(await _guard("topology", lambda: topology(probe)))
    checks.append(await _guard("arguments", lambda: argument_limit(probe)))
    checks.extend(await latency(probe))
    checks.append(await _guard("acl", lambda: acl(probe)))
    return Report(tuple(checks))


def problems(report: Report) -> list[str]:
    """A sentence for each check that warned or failed."""
    return [f"{c.name}: {c.detail}" + (f"; fix: {c.fix}" if c.fix else "")
            for c in report.checks if c.status in (WARN, FAIL)]


__all__ = ["FAIL", "OK", "SKIP", "WARN", "Check", "Report", "problems", "run_checks"]
