"""Workload sizes and time budgets of a run (``--quick`` shrinks them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Options:
    """Workload sizes; ``--quick`` shrinks them."""

    jobs: int = 20_000
    runs: int = 3
    """Rounds: every peer runs every scenario once per round; the table shows the
    median over the rounds and their min-max."""
    enqueue_jobs: int = 3_000
    mem_jobs: int = 10_000
    mem_jobs_large: int = 1_000_000
    """Queued jobs for the second memory figure: conveyor always, a peer only when
    its fastest enqueue rate fills them within ``mem_large_budget_s``."""
    mem_large_budget_s: float = 30.0
    latency_samples: int = 200
    latency_interval: float = 0.02
    idle_seconds: float = 10.0
    drain_cap_s: float = 30.0
    """A drain run is cut here; a configuration cut once is not run in later rounds."""
    delayed_jobs: int = 100
    """Delayed probes per run, ``delayed_interval`` s apart."""
    delayed_interval: float = 0.05
    delayed_min_s: float = 0.2
    delayed_max_s: float = 1.0
    delayed_cap_s: float = 10.0
    """A probe not started this long after the last one was due fails the step."""
    peer_budget_s: float = 480.0
    """Time one peer's round may take before its remaining steps are skipped."""

    @classmethod
    def quick(cls, **overrides: Any) -> Options:
        base: dict[str, Any] = {
            "jobs": 2_000,
            "runs": 1,
            "enqueue_jobs": 500,
            "mem_jobs": 2_000,
            "mem_jobs_large": 20_000,
            "latency_samples": 50,
            "idle_seconds": 3.0,
            "delayed_jobs": 30,
            "drain_cap_s": 15.0,
            "peer_budget_s": 180.0,
        }
        base.update(overrides)
        return cls(**base)
