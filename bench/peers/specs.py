"""What each compared system is and how its environment is built.

Peers cannot share one virtualenv: their redis-py pins are mutually exclusive
(see shared/FACTS.md), so each gets its own, keyed by the requirement list
below.  Versions are pinned so that a RESULTS.md stays reproducible; bump them
deliberately.  ``hiredis`` is installed everywhere redis-py is used because
conveyor's own environment has it and the parser dominates client-side cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PeerSpec:
    """One column of the comparison table."""

    name: str
    """Short id, also the driver module name under ``bench/peers/drivers``."""
    title: str
    """Column heading."""
    requirements: tuple[str, ...] = ()
    """pip requirement strings for the peer's private venv."""
    dist: str = ""
    """Distribution whose installed version is reported."""
    repo_venv: bool = False
    """Run in the harness's own interpreter instead of a private venv."""
    notes: tuple[str, ...] = field(default_factory=tuple)


PEERS: tuple[PeerSpec, ...] = (
    PeerSpec(
        "rq",
        "RQ",
        ("rq==3.0.0", "redis>=6", "hiredis"),
        dist="rq",
    ),
    PeerSpec(
        "celery",
        "Celery",
        ("celery[redis]==5.7.0", "redis>=6", "hiredis"),
        dist="celery",
        notes=("Celery's Redis transport needs redis-py >= 6",),
    ),
    PeerSpec(
        "dramatiq",
        "Dramatiq",
        ("dramatiq[redis]==2.2.1", "hiredis"),
        dist="dramatiq",
    ),
    PeerSpec(
        "huey",
        "Huey",
        ("huey==3.5.4", "redis", "hiredis"),
        dist="huey",
    ),
    PeerSpec(
        "arq",
        "arq",
        ("arq==0.28.0", "redis[hiredis]<6"),
        dist="arq",
        notes=("arq 0.28 pins redis-py < 6",),
    ),
    PeerSpec(
        "saq",
        "SAQ",
        ("saq[redis]==0.26.4", "typing_extensions", "hiredis"),
        dist="saq",
        notes=("SAQ imports typing_extensions without declaring it",),
    ),
    PeerSpec(
        "taskiq",
        "taskiq",
        ("taskiq==0.13.0", "taskiq-redis==1.2.4", "redis>=6", "hiredis"),
        dist="taskiq",
        notes=("RedisStreamBroker; taskiq-redis 1.2 needs redis-py >= 6",),
    ),
    PeerSpec(
        "streaq",
        "streaq",
        ("streaq==7.2.0", "redis", "hiredis"),
        dist="streaq",
        notes=("streaq talks to Redis through coredis; redis-py only for the task's INCR",),
    ),
    PeerSpec(
        "bullmq",
        "BullMQ (py)",
        ("bullmq==3.4.4", "hiredis"),
        dist="bullmq",
        notes=("Python port of BullMQ",),
    ),
)

CEILING = PeerSpec(
    "ceiling",
    "redis-py ceiling",
    ("redis==8.1.0", "hiredis"),
    dist="redis",
    notes=("plain LPUSH / BLMOVE / LREM reliable-queue pattern",),
)

CONVEYOR = PeerSpec(
    "conveyor",
    "conveyor",
    dist="conveyor",
    repo_venv=True,
)

ALL: tuple[PeerSpec, ...] = (CEILING, *PEERS, CONVEYOR)
"""Every column, in table order."""


def select(names: str | None) -> list[PeerSpec]:
    """Resolve a ``--peers a,b,c`` value; ``None`` means everything."""
    if not names:
        return list(ALL)
    wanted = [n.strip().lower() for n in names.split(",") if n.strip()]
    by_name = {p.name: p for p in ALL}
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise SystemExit(f"unknown peer(s): {', '.join(unknown)}; known: {', '.join(by_name)}")
    return [by_name[n] for n in wanted]
