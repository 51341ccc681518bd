"""Least-privilege Redis ACL rules for each role a conveyor process plays.

The rules are made from what conveyor sends, not written out by hand: the key patterns
from :mod:`conveyor.keys` (a queue's keys under ``{NAMESPACE:QUEUE}``, the registry under
``NAMESPACE:``), and a role's commands from the Lua of the scripts it runs (EVALSHA runs
a script with its caller's permissions, so every command and key a script touches is
checked against the caller's user) plus the plain commands its clients send.

Where two roles run the same commands, they are told apart by keys, with read (``%R~``)
and write (``%W~``) selectors:

- a producer may write the ready lists, tenant rings and priorities (an enqueue pushes
  onto them) but not read them, and may not touch the leases: a fetch, which pops the
  ready lists and first reads the expired leases, is refused before its first write. For
  the same reason an enqueue made by a producer never hands its jobs straight to an idle
  worker (that would be a claim): it may count the waiters but not read them, so the
  hand-off's look for one fails quietly and the enqueue wakes a worker instead;
- a worker may read but not write a queue's limits and its paused flag;
- an operator may delete only the paused flag, dedupe keys and kept replies: purging
  dead letters deletes job records, and is refused before anything is deleted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, fields

from .keys import QueueKeys, queue_keys, queues_key
from .scripts import source

ROLES = ("producer", "worker", "dashboard-readonly", "operator", "admin")

READ, WRITE, BOTH = "%R~", "%W~", "~"

# Every role: connecting (CLIENT SETINFO, Redis 7.2+, is left out: redis-py passes over
# its refusal), naming the connection, the server's clock, the checks of
# `conveyor doctor` that need no @dangerous command, and what a Cluster client asks.
CONNECTION = ("ping", "echo", "hello", "auth", "select", "time", "readonly",
              "client|setname", "client|getname", "client|id",
              "acl|whoami", "command", "command|info", "command|docs", "command|count",
              "cluster|slots", "cluster|shards", "cluster|nodes", "cluster|info",
              "cluster|keyslot")
SCRIPTING = ("script|load", "script|exists")
# EVAL and EVALSHA declare their KEYS as read and written, so the call itself must be
# allowed on every key a script is passed; what the script then does with each key is
# checked command by command against the user's other rules. So a selector allows the
# calls, on the namespace's queue keys, and grants no other command.
SCRIPT_CALLS = ("evalsha", "eval")
# Commands of @read that name no key, so key patterns cannot bound them: they would show
# other namespaces' key names.
UNBOUNDED_READS = ("scan", "randomkey", "dbsize")

_CALL = re.compile(r"(?:redis\.p?call|list_call)\('([A-Z]+)'")


@dataclass(frozen=True)
class Role:
    """What a role runs: its scripts, the plain commands it sends besides (or, for the
    broad roles, command categories), and its access to each kind of queue key (named as
    :class:`~conveyor.keys.QueueKeys` fields) and to the registry."""

    summary: str
    scripts: tuple[str, ...] = ()
    all_scripts: bool = False  # runs every script (its commands come from categories)
    confined: tuple[str, ...] = ()  # commands granted only by a selector, on its keys
    commands: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    queue_keys: dict[str, str] = field(default_factory=dict)
    registry: tuple[tuple[str, str], ...] = ()  # (permission, pattern after "NAMESPACE:")
    selectors: tuple[tuple[tuple[str, ...], dict[str, str]], ...] = ()


_ALL_KEYS = tuple(f.name for f in fields(QueueKeys) if f.name not in ("queue", "tag"))
_READ_ALL = dict.fromkeys(_ALL_KEYS, READ)
_STATUS_READS = ("get", "hget", "hgetall", "hmget", "exists", "type", "zscore", "zrange",
                 "zcard", "llen", "lrange", "smembers", "sismember")

_ROLES: dict[str, Role] = {
    "producer": Role(
        "enqueue jobs (single, many, delayed, deduplicated, debounced, workflows) and read "
        "their status and results; cannot fetch jobs, cancel, requeue or purge",
        scripts=("enqueue", "workflow_enqueue"),
        commands=("multi", "exec", "discard", "hset", "rpush", "hincrby", "zincrby", "lpush",
                  "ltrim", "expire", "del", "sadd", "wait", *_STATUS_READS),
        queue_keys={
            "job_prefix": BOTH, "dedupe_prefix": BOTH, "throttle_prefix": BOTH,
            "schedule_prefix": BOTH, "fired_prefix": BOTH, "replies_prefix": BOTH,
            "counts": BOTH, "metrics_prefix": BOTH, "workflow_prefix": BOTH,
            "ready_prefix": WRITE, "ring_prefix": WRITE, "priorities": WRITE,
            "delayed": WRITE, "expiring": WRITE, "wake": WRITE,
            "paused": READ, "limits": READ},
        registry=((BOTH, "queues"),),
        selectors=((("zcount", "exists"), {"waiters": READ}),)),
    "worker": Role(
        "run jobs: fetch, heartbeat, finish, retry, progress, durable waits, periodic "
        "tasks, register itself, events, reclaim expired leases; cannot pause, resume or "
        "set limits",
        categories=("@read", "@write", "@transaction", "@blocking"),
        all_scripts=True,
        queue_keys={**dict.fromkeys(_ALL_KEYS, BOTH), "limits": READ, "paused": READ},
        registry=((BOTH, "*"),)),
    "dashboard-readonly": Role(
        "read what the dashboard, `conveyor stats`, `inspect` and `top` show; writes "
        "nothing",
        categories=("@read",),
        queue_keys=_READ_ALL,
        registry=((READ, "*"),)),
    "operator": Role(
        "dashboard-readonly, and requeue dead jobs, cancel jobs, pause and resume queues, "
        "signal and resume suspended jobs; cannot purge dead letters or set limits",
        scripts=("cancel", "requeue_dead", "signal", "resume"),
        categories=("@read",),
        commands=("set", "lpush", "ltrim"),
        queue_keys={**_READ_ALL, **dict.fromkeys(
            ("job_prefix", "ready_prefix", "ring_prefix", "priorities", "delayed", "counts",
             "wake", "dedupe_prefix", "cancelling", "suspended", "handover", "paused",
             "replies_prefix", "dead"), BOTH)},
        registry=((READ, "*"),),
        confined=("del", "unlink"),
        selectors=((("del", "unlink"), {"paused": BOTH, "dedupe_prefix": BOTH,
                                        "replies_prefix": BOTH}),)),
    "admin": Role(
        "everything in the namespace: all of the above, purge, limits",
        categories=("@read", "@write", "@transaction", "@blocking"),
        all_scripts=True,
        queue_keys=dict.fromkeys(_ALL_KEYS, BOTH),
        registry=((BOTH, "*"),)),
}


def role(name: str) -> Role:
    """The :class:`Role` called ``name``.

    :raises ValueError: no such role (the message names the valid ones)
    """
    try:
        return _ROLES[name]
    except KeyError:
        raise ValueError(f"unknown role {name!r}; valid roles: {', '.join(ROLES)}") from None


def glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis glob pattern."""
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)


def script_commands(names: Iterable[str]) -> list[str]:
    """The commands the scripts ``names`` call (lower case, sorted)."""
    return sorted({c.lower() for name in names for c in _CALL.findall(source(name))})


def key_patterns(namespace: str, grants: dict[str, str]) -> list[str]:
    """Key patterns for ``grants`` (QueueKeys field -> permission) in every queue of
    ``namespace``."""
    k = queue_keys(glob_escape(namespace), "*")
    out = []
    for name, permission in grants.items():
        pattern = getattr(k, name)
        out.append(permission + pattern + ("*" if name.endswith("_prefix") else ""))
    return out


def rules(role_name: str, namespace: str) -> list[str]:
    """The ``ACL SETUSER`` rules (after the user's name, password and ``on``) that give a
    process of role ``role_name`` what it needs in ``namespace``, and nothing else.

    :raises ValueError: unknown role
    """
    r = role(role_name)
    out = ["resetkeys", "resetchannels", "-@all"]
    out += [f"+{c}" for c in r.categories]
    out += ["-@dangerous"]
    if "@read" in r.categories:
        out += [f"-{c}" for c in UNBOUNDED_READS]
    commands = dict.fromkeys((*CONNECTION, *r.commands, *script_commands(r.scripts)))
    runs_scripts = r.all_scripts or bool(r.scripts)
    if runs_scripts:
        commands.update(dict.fromkeys(SCRIPTING))
    out += [f"+{c}" for c in commands if c not in r.confined]
    out += key_patterns(namespace, r.queue_keys)
    registry = glob_escape(queues_key(namespace)).removesuffix("queues")
    out += [permission + registry + pattern for permission, pattern in r.registry]
    for selector_commands, grants in r.selectors:
        inner = [f"+{c}" for c in selector_commands] + key_patterns(namespace, grants)
        out.append("(" + " ".join(inner) + ")")
    if runs_scripts:
        calls = " ".join(f"+{c}" for c in SCRIPT_CALLS)
        out.append(f"({calls} ~{queue_keys(glob_escape(namespace), '*').tag[:-1]})")
    return out


def setuser_command(user: str, password: str, role_name: str, namespace: str) -> list[str]:
    """The arguments of ``ACL SETUSER`` that (re)create ``user`` with ``password`` and the
    rules of ``role_name`` in ``namespace``; any rule the user had before is reset.

    :raises ValueError: unknown role
    """
    return ["ACL", "SETUSER", user, "reset", "on", f">{password}",
            *rules(role_name, namespace)]
