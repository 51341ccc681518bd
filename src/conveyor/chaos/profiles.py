"""How long and how hard a chaos run is: the ``ci`` profile fits in a CI job (about two
minutes on two cores, both topologies), the ``long`` profile runs for more than fifteen
minutes.

Each profile has two phases, one per topology of the jobs' Redis: ``plain`` (one server,
reached directly and through proxies) and ``sentinel`` (a primary, a replica and three
sentinels, with failovers among the faults; the proxies follow the primary). The sentinel
phase is shorter: what it adds is the failover and following the primary; the other
faults are the same.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["PROFILES", "SENTINEL_PROFILES", "TOPOLOGIES", "Profile"]

TOPOLOGIES = ("plain", "sentinel")


@dataclass(frozen=True, slots=True)
class Profile:
    """The shape of a run.

    :param jobs: work jobs to enqueue (poison jobs come on top, as faults)
    :param plain_workers: ``conveyor worker`` processes, restarted by the run when they die
    :param supervised: children of one ``conveyor worker -p N`` supervisor (0: none)
    :param concurrency: ``-c`` of every worker process
    :param fault_seconds: how long faults are injected
    :param enqueue_seconds: over how long the jobs are enqueued (while faults happen)
    :param settle_seconds: longest wait, after the faults, for every job to finish
    :param gap: seconds between two fault episodes (uniform between the two)
    :param task_seconds: longest a work job works (uniform from 0)
    :param delayed_share: share of work jobs enqueued with a delay
    :param max_delay: longest delay (s)
    :param weights: fault kind -> relative frequency (each kind also comes once early)
    :param topology: ``plain`` (one server) or ``sentinel`` (primary, replica, sentinels)
    :param tenants: tenants the work jobs are spread over (one per enqueue batch)
    :param queue_cap: the queue's concurrency limit during the run (None: none)
    :param tenant_cap: every tenant's concurrency limit during the run (None: none)
    """

    name: str
    jobs: int
    plain_workers: int
    supervised: int
    concurrency: int
    fault_seconds: float
    enqueue_seconds: float
    settle_seconds: float
    gap: tuple[float, float]
    task_seconds: float
    delayed_share: float
    max_delay: float
    weights: dict[str, float]
    topology: str = "plain"
    tenants: int = 4
    queue_cap: int | None = 10
    tenant_cap: int | None = 4

    def replace(self, **changes: object) -> Profile:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


WEIGHTS = {
    "worker-kill": 3.0, "worker-pause": 2.0, "redis-kill": 2.0, "client-kill": 2.0,
    "oom": 2.0, "proxy-blackhole": 1.5, "proxy-reset": 1.5, "lost-reply": 2.0,
    "poison-raise": 0.7,
    "poison-kill": 0.5, "poison-exit": 0.5, "poison-hang": 0.5, "cancel": 1.0, "limits": 1.0,
    "shards": 1.0, "overwrite": 1.0,
    "failover": 3.0,  # a Sentinel set only
}

PROFILES = {
    "ci": Profile(name="ci", jobs=1500, plain_workers=2, supervised=1, concurrency=4,
                  fault_seconds=60.0, enqueue_seconds=50.0, settle_seconds=70.0,
                  gap=(0.3, 1.5), task_seconds=0.4, delayed_share=0.1, max_delay=5.0,
                  weights=WEIGHTS),
    "long": Profile(name="long", jobs=12000, plain_workers=2, supervised=2, concurrency=4,
                    fault_seconds=600.0, enqueue_seconds=560.0, settle_seconds=180.0,
                    gap=(0.5, 2.5), task_seconds=0.4, delayed_share=0.1, max_delay=20.0,
                    weights=WEIGHTS),
}

# Failovers come often on a Sentinel set: they are what its phase is for.
SENTINEL_WEIGHTS = {**WEIGHTS, "failover": 8.0}

SENTINEL_PROFILES = {
    "ci": PROFILES["ci"].replace(jobs=600, fault_seconds=40.0, enqueue_seconds=35.0,
                                 settle_seconds=60.0, weights=SENTINEL_WEIGHTS,
                                 topology="sentinel"),
    "long": PROFILES["long"].replace(jobs=6000, fault_seconds=300.0, enqueue_seconds=280.0,
                                     weights=SENTINEL_WEIGHTS, topology="sentinel"),
}
