"""``conveyor chaos``: run jobs through real worker processes while faults are injected,
then check that conveyor kept its promises."""

from __future__ import annotations

import random

import click
from rich.console import Console

from .base import main


@main.command()
@click.option("--profile", type=click.Choice(["ci", "long"]), default="ci", show_default=True,
              help="ci: ~1,000 jobs, 60 s of faults, under 3 minutes; long: ~12,000 jobs,"
                   " 10 minutes of faults.")
@click.option("--seed", type=int, help="Seed of the fault schedule and the jobs (default:"
                                       " random; printed, so a failing run can be repeated).")
@click.option("--jobs", type=click.IntRange(min=1), help="Work jobs (overrides the profile).")
@click.option("--fault-seconds", type=click.FloatRange(min=1),
              help="Seconds of faults (overrides the profile; every kind still comes once).")
@click.option("--keep", is_flag=True, help="Keep the logs folder even when every invariant"
                                            " held (it is always kept on a failure).")
def chaos(profile: str, seed: int | None, jobs: int | None, fault_seconds: float | None,
          keep: bool) -> None:
    """Check, under faults, that no job is lost or succeeds twice.

    Starts private redis-server processes on loopback (append-only file fsynced on every
    write, noeviction) and runs jobs through `conveyor worker` processes while it injects,
    one after another at random: SIGKILL and SIGSTOP/SIGCONT of workers, SIGKILL and
    restart of Redis, CLIENT KILL of the workers' connections, out-of-memory spells, proxy
    black holes and resets (when conveyor.faults.proxy is present), poison jobs (one that
    raises, one that kills its process, one that exits, one that hangs past its timeout)
    and cancels.

    The tasks write an independent ledger on a server that suffers no faults. Once the
    queue has settled it is checked: every job ends succeeded, dead (poison only, with a
    reason) or cancelled; at most one success per job; every re-execution follows a lost
    lease, within what the faults could cost; the counters match the records. Prints the
    faults injected and each invariant held or FAILED; exits 1 if any failed.
    """
    from ..chaos import PROFILES, ChaosRun

    chosen = PROFILES[profile]
    if jobs is not None:
        chosen = chosen.replace(jobs=jobs, enqueue_seconds=min(chosen.enqueue_seconds,
                                                               max(1.0, jobs / 20)))
    if fault_seconds is not None:
        chosen = chosen.replace(fault_seconds=fault_seconds,
                                enqueue_seconds=min(chosen.enqueue_seconds, fault_seconds))
    if seed is None:
        seed = random.SystemRandom().randrange(1, 1_000_000)
    try:
        code = ChaosRun(chosen, seed, Console(), keep=keep).run()
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from exc
    raise SystemExit(code)
