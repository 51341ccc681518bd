"""The targets conveyor's figures are held to, judged on this run's medians.

Each target compares one of conveyor's figures with a reference from the same
run (the redis-py ceiling, or the best peer among those in the run) or given on
the command line, scaled by a factor: "at least 5x the best peer's" or "at most
half the reference".  A target whose reference is missing says why instead of
"met" or "not met".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .results import METRIC, PeerResult, best_peer, column

CEILING = "ceiling"
BEST_PEER = "best peer"
GIVEN = "given"


@dataclass(frozen=True)
class Target:
    """conveyor's *metric* against *factor* times the reference's."""

    metric: str
    factor: float
    against: str
    """:data:`CEILING`, :data:`BEST_PEER` or :data:`GIVEN` (``--cpu-reference-us``)."""
    label: str


TARGETS: tuple[Target, ...] = (
    Target("drain_best_free", 0.5, CEILING, "nearly free drain ≥ 0.5x the ceiling's"),
    Target("drain_best_free", 5.0, BEST_PEER, "nearly free drain ≥ 5x the best peer's"),
    Target("drain_best", 2.5, BEST_PEER, "drain, best for 2 cores ≥ 2.5x the best peer's"),
    Target(
        "wcpu_best_free", 0.5, GIVEN, "worker CPU per job, nearly free drain ≤ 0.5x the reference"
    ),
    Target(
        "cpu_drain",
        0.5,
        BEST_PEER,
        "Redis CPU per job, drain (best for 2 cores) ≤ 0.5x the best peer's",
    ),
    Target("cpu_enq", 1.1, CEILING, "Redis CPU per job, single enqueue ≤ 1.1x the ceiling's"),
)


@dataclass(frozen=True)
class Outcome:
    """One row of the Targets table."""

    target: Target
    figure: float | None
    reference: float | None
    source: str
    """Where the reference came from ("Huey", "redis-py ceiling", "--cpu-reference-us"),
    or why there is none."""

    @property
    def ratio(self) -> float | None:
        if self.figure is None or not self.reference:
            return None
        return self.figure / self.reference

    @property
    def met(self) -> bool | None:
        """``None`` when it cannot be told."""
        if self.ratio is None:
            return None
        if METRIC[self.target.metric].higher_is_better:
            return self.ratio >= self.target.factor
        return self.ratio <= self.target.factor


def evaluate(results: Sequence[PeerResult], cpu_reference_us: float | None) -> list[Outcome]:
    """An outcome per target; the row against a given reference only when it was given."""
    conveyor = column(results, "conveyor")
    out = []
    for target in TARGETS:
        if target.against == GIVEN and cpu_reference_us is None:
            continue
        figure = conveyor.value(target.metric).number if conveyor else None
        reference, source = _reference(target, results, cpu_reference_us)
        out.append(Outcome(target, figure, reference, source))
    return out


def _reference(
    target: Target, results: Sequence[PeerResult], given: float | None
) -> tuple[float | None, str]:
    if target.against == GIVEN:
        return given, "--cpu-reference-us"
    if target.against == BEST_PEER:
        best = best_peer(METRIC[target.metric], results)
        return (best[0], best[1]) if best else (None, "no peer measured it")
    ceiling = column(results, "ceiling")
    value = ceiling.value(target.metric) if ceiling else None
    if value is None or value.number is None or value.partial:
        return None, "no ceiling figure"
    return value.number, ceiling.title if ceiling else ""


def rows(outcomes: Sequence[Outcome]) -> list[list[str]]:
    """Header then one row per outcome, for the terminal and RESULTS.md alike."""
    out = [["target", "conveyor", "reference", "conveyor / reference", "result"]]
    for o in outcomes:
        unit = METRIC[o.target.metric].unit
        figure = "n/a" if o.figure is None else f"{_num(o.figure)} {unit}"
        ref = o.source if o.reference is None else f"{_num(o.reference)} ({o.source})"
        ratio = "n/a" if o.ratio is None else f"{o.ratio:.2f}x"
        result = "n/a" if o.met is None else "met" if o.met else "not met"
        out.append([o.target.label, figure, ref, ratio, result])
    return out


def _num(n: float) -> str:
    return f"{n:,.0f}" if abs(n) >= 100 else f"{n:,.2f}"
