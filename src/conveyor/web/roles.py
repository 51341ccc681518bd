"""Who may do what on the dashboard: roles, the rule of each action, and the users.

Three roles, each with the powers of the one before:

- ``readonly``: every page and the JSON API; no action.
- ``operator``: also requeue dead jobs, cancel a job or a workflow, pause and resume a
  queue, signal a job.
- ``admin``: also purge dead jobs and set a queue's limits.

:data:`RULES` names the least role of each action. An action without a rule is refused
to everyone, admins included: a new action stays closed until it is given one.

A user may be limited to some queues: the role's actions then apply only to those (an
action that touches any other queue is refused); the shards of a sharded queue
(``emails~1``, ...) are that queue's. Reading is not limited: a limited user
still sees every queue, read-only. Queue names are not secrets within one namespace, and
hiding them would need a filter in every page and endpoint; give a team that must not
see another's jobs its own namespace (and Redis ACL user) instead.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..sharding import base_queue

ROLES = ("readonly", "operator", "admin")  # each has the powers of those before it
RULES: dict[str, str] = {
    "requeue": "operator",
    "cancel": "operator",
    "cancel_workflow": "operator",
    "pause": "operator",
    "resume": "operator",
    "signal": "operator",
    "purge": "admin",
    "limits": "admin",
}


@dataclass(frozen=True)
class User:
    """An authenticated user: a role, limited to ``queues`` unless that is None.

    :param name: the user's name, as shown in messages
    :param role: one of :data:`ROLES`
    :param queues: the queues its actions may touch; None: every queue
    """

    name: str
    role: str
    queues: frozenset[str] | None = None

    def refusal(self, action: str, queues: Collection[str]) -> str | None:
        """Why this user may not do ``action`` on ``queues``, or None when it may.

        :param queues: every queue the action touches (empty when the request names none)
        """
        needed = RULES.get(action)
        if needed is None:
            return f"action {action!r} has no permission rule, so no role may use it"
        if ROLES.index(self.role) < ROLES.index(needed):
            return f"{action} needs role {needed} (or higher); {self.name} is {self.role}"
        if self.queues is None:
            return None
        if not queues:
            return f"{self.name} is limited to queues and this request names none"
        # a shard (``emails~1``) is part of its queue: a user of the queue may act on it
        outside = sorted({base_queue(q) for q in queues} - self.queues)
        if outside:
            return (f"{self.name} may {action} only on queues {', '.join(sorted(self.queues))},"
                    f" not {', '.join(outside)}")
        return None

    def can(self, action: str, queues: str | Iterable[str] = ()) -> bool:
        """Whether this user may do ``action`` on ``queues`` (a name or several): what the
        templates ask before showing a form."""
        wanted = [queues] if isinstance(queues, str) else [q for q in queues if q]
        return self.refusal(action, wanted) is None


ADMIN = User("admin", "admin")  # whoever passes a token, the basic-auth pair, or no check
NOBODY = User("anonymous", "readonly")  # a request no authentication has named


@dataclass(frozen=True)
class Account:
    """A user and the password that identifies it."""

    password: str
    user: User


def accounts(users: Mapping[str, Any]) -> dict[str, Account]:
    """Check a ``users=`` mapping (name -> ``(password, role)`` or ``(password, role,
    queues)``) and return its accounts.

    :raises ValueError: naming the user and what is wrong with its entry
    """
    if not isinstance(users, Mapping):
        raise ValueError(f"users must be a mapping of name -> (password, role[, queues]),"
                         f" got {type(users).__name__}")
    if not users:
        # Not "no users, so open": a mapping emptied by mistake must not open the doors.
        raise ValueError("users is empty: give at least one user (or leave users out)")
    return {name: _account(name, entry) for name, entry in users.items()}


def _account(name: Any, entry: Any) -> Account:
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"user {name!r}: a user name is a non-empty string without ':'")
    if not isinstance(entry, tuple | list) or len(entry) not in (2, 3):
        raise ValueError(f"user {name!r}: expected (password, role) or (password, role,"
                         f" queues), got {entry!r}")
    password, role, *rest = entry
    if not isinstance(password, str) or not password:
        raise ValueError(f"user {name!r}: the password must be a non-empty string")
    if role not in ROLES:
        raise ValueError(f"user {name!r}: unknown role {role!r} (one of {', '.join(ROLES)})")
    queues = None
    if rest:
        listed = rest[0]
        if (isinstance(listed, str) or not isinstance(listed, Iterable)
                or not (names := list(listed))
                or not all(isinstance(q, str) and q for q in names)):
            raise ValueError(f"user {name!r}: queues must be a non-empty list of queue names,"
                             f" got {listed!r}")
        queues = frozenset(names)
    return Account(password, User(name, role, queues))
