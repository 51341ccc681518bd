"""``conveyor chaos``: a published check that conveyor keeps its promises under faults.

A run starts private redis-server processes on loopback (the jobs' server with an
append-only file fsynced on every write and ``noeviction``; a second one for the ledger,
which suffers no faults), runs jobs through ``conveyor worker`` processes, injects faults
at random from a seed (workers SIGKILLed and paused, Redis killed and restarted, its
connections killed, out-of-memory spells, proxy black holes, lost replies, poison jobs,
cancels), lets the queue settle and then checks the ledger the tasks wrote against what
conveyor recorded (:mod:`conveyor.chaos.invariants`).

The jobs' Redis is one server, or a Sentinel set (a primary, a replica, three sentinels:
:mod:`~conveyor.chaos.sentinel`) whose faults include coordinated failovers.

Modules: :mod:`~conveyor.chaos.tasks` (the tasks and their ledger), :mod:`~.servers`,
:mod:`~.sentinel`, :mod:`~.fleet` (worker processes), :mod:`~.producer`, :mod:`~.faults`,
:mod:`~.gather`, :mod:`~.invariants`, :mod:`~.report`, :mod:`~.runner`.
"""

from __future__ import annotations

from .profiles import PROFILES, SENTINEL_PROFILES, Profile
from .runner import ChaosRun

__all__ = ["PROFILES", "SENTINEL_PROFILES", "ChaosRun", "Profile"]
