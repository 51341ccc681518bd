"""``conveyor chaos``: run jobs through real worker processes while faults are injected,
then check that conveyor kept its promises."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import click
from rich.console import Console

from .base import main

if TYPE_CHECKING:
    from ..chaos import Profile


@main.command()
@click.option("--profile", type=click.Choice(["ci", "long"]), default="ci", show_default=True,
              help="ci: 1,500 jobs and 60 s of faults on one server, then 600 jobs and 40 s"
                   " on a Sentinel set, under 2.5 minutes; long: 12,000 jobs and 10 minutes,"
                   " then 6,000 jobs and 5 minutes.")
@click.option("--topology", type=click.Choice(["plain", "sentinel", "both"]), default="both",
              show_default=True,
              help="plain: one Redis server; sentinel: a primary, a replica and three"
                   " sentinels (failovers); both: one phase each, one after the other.")
@click.option("--seed", type=int, help="Seed of the fault schedule and the jobs (default:"
                                       " random; printed, so a failing run can be repeated).")
@click.option("--jobs", type=click.IntRange(min=1), help="Work jobs (overrides the profile).")
@click.option("--fault-seconds", type=click.FloatRange(min=1),
              help="Seconds of faults (overrides the profile; every kind still comes once).")
@click.option("--keep", is_flag=True, help="Keep the logs folder even when every invariant"
                                            " held (it is always kept on a failure).")
def chaos(profile: str, topology: str, seed: int | None, jobs: int | None,
          fault_seconds: float | None, keep: bool) -> None:
    """Check, under faults, that no job is lost or succeeds twice.

    Starts private redis-server processes on loopback (append-only file fsynced on every
    write, noeviction) and runs jobs through `conveyor worker` processes while it injects,
    one after another at random: SIGKILL and SIGSTOP/SIGCONT of workers, SIGKILL and
    restart of Redis, CLIENT KILL of the workers' connections, out-of-memory spells, proxy
    black holes and resets, lost replies (a proxy lets a fetch, finish, enqueue or other
    request reach Redis, then drops its reply and resets the connection), poison jobs (one
    that raises, one that kills its process, one that exits, one that hangs past its
    timeout) and cancels. On a Sentinel set (--topology sentinel, and the second phase of
    both) the workers reach Redis through a redis+sentinel:// URL (one of them, and half the
    enqueues, through proxies that follow the primary), the faults aimed at the server hit
    the current primary, and failovers come among them: SENTINEL FAILOVER with writes
    paused until the replica caught up, so no acknowledged write is at risk.

    The tasks write an independent ledger on a server that suffers no faults. Once the
    queue has settled it is checked: every job ends succeeded, dead (poison only, with a
    reason) or cancelled; at most one success per job; each job stored once, though an
    enqueue that raised was sent again; every re-execution follows a lost lease, within
    what the faults could cost; no attempt is charged without a run; the counters match
    the records. Prints the faults injected and each invariant held or FAILED; exits 1 if
    any failed.
    """
    from ..chaos import PROFILES, SENTINEL_PROFILES, ChaosRun

    phases = {"plain": [PROFILES[profile]], "sentinel": [SENTINEL_PROFILES[profile]],
              "both": [PROFILES[profile], SENTINEL_PROFILES[profile]]}[topology]
    if seed is None:
        seed = random.SystemRandom().randrange(1, 1_000_000)
    console = Console()
    verdicts = []
    for chosen in phases:
        chosen = _override(chosen, jobs, fault_seconds)
        try:
            code = ChaosRun(chosen, seed, console, keep=keep).run()
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from exc
        verdicts.append((chosen.topology, code))
    if len(verdicts) > 1:
        console.print("; ".join(f"{name}: {'held' if code == 0 else '[bold red]FAILED[/]'}"
                                for name, code in verdicts))
    raise SystemExit(max(code for _, code in verdicts))


def _override(chosen: Profile, jobs: int | None, fault_seconds: float | None) -> Profile:
    if jobs is not None:
        chosen = chosen.replace(jobs=jobs, enqueue_seconds=min(chosen.enqueue_seconds,
                                                               max(1.0, jobs / 20)))
    if fault_seconds is not None:
        chosen = chosen.replace(fault_seconds=fault_seconds,
                                enqueue_seconds=min(chosen.enqueue_seconds, fault_seconds))
    return chosen
