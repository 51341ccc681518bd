"""The dashboard's Redis cost per poll, embedded in RESULTS.md as its own table.

``bench/dashboard_cost.py`` owns the measurement (its own private servers, its
own worker) and prints a markdown table; this module only runs it in the
repository's interpreter and hands back what it printed, so either side can
change its figures or layout without the other.
"""

from __future__ import annotations

import os
import subprocess

from .venvs import REPO_ROOT, repo_python

TIMEOUT_S = 600.0
TITLE = "## Dashboard: Redis commands per overview poll (`python -m bench.dashboard_cost`)"
INTRO = (
    "Measured in the same run, after the peers, on private servers of its own. One poll of"
    " the web dashboard's overview with 1, 3 and 20 queues, each holding jobs in every"
    " state and an hour of metric buckets; commands from `INFO commandstats` after"
    " `CONFIG RESETSTAT`, round trips as the client's sends. The first poll is a freshly"
    " started dashboard's (its figures exact, its sparklines filled in over the next polls"
    " within the same budget); a steady poll reads only the open buckets."
)


def measure(timeout: float = TIMEOUT_S) -> str:
    """The markdown ``bench.dashboard_cost`` prints, or one line saying why there is none."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "src")])}
    env.pop("VIRTUAL_ENV", None)
    try:
        proc = subprocess.run(
            [repo_python(), "-m", "bench.dashboard_cost"],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return f"n/a: `bench.dashboard_cost` timed out after {timeout:.0f} s"
    if proc.returncode != 0 or not proc.stdout.strip():
        lines = (proc.stderr or proc.stdout).strip().splitlines() or ["(no output)"]
        return f"n/a: `bench.dashboard_cost` failed: {lines[-1][:300]}"
    return proc.stdout.strip()


def section(text: str) -> str:
    """The RESULTS.md section around what :func:`measure` returned."""
    return "\n".join([TITLE, "", INTRO, "", text, ""])
