"""The sharding benchmark's own parts: how it counts priority inversions, and a short run
of the whole benchmark on its own Cluster, which prints every table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.sharding.figures import inversions
from bench.sharding.runs import Claim

ROOT = Path(__file__).resolve().parent.parent


def test_a_claim_that_passes_over_a_higher_priority_ready_long_enough_is_counted() -> None:
    claims = [
        Claim(priority=8, enqueued=0.000, started=0.300),  # waited while the 2s ran
        Claim(priority=2, enqueued=0.000, started=0.100),  # passed it over: counted
        Claim(priority=2, enqueued=0.000, started=0.290),  # counted
        Claim(priority=2, enqueued=0.000, started=0.400),  # after it started: not counted
    ]
    assert inversions(claims, bound=0.0) == 500
    assert inversions(claims, bound=0.2) == 250  # at 0.1 s it had not waited 0.2 s yet
    assert inversions(claims, bound=0.3) == 0


def test_claims_in_priority_order_have_no_inversion() -> None:
    claims = [Claim(9, 0.0, 0.01), Claim(5, 0.0, 0.02), Claim(5, 0.0, 0.03),
              Claim(1, 0.0, 0.04), Claim(9, 0.045, 0.05)]  # the late 9 came after the 1
    assert inversions(claims, bound=0.0) == 0


def test_a_short_run_prints_every_table() -> None:
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    out = subprocess.run(
        [sys.executable, "-m", "bench.sharding", "--runs", "1", "--jobs", "300",
         "--tenants", "30", "--priority-jobs", "100", "--idle", "0.5"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=110)
    assert out.returncode == 0, out.stderr[-3000:]
    for heading in ("| figure | 1 shard | 3 shards |", "| shard | primary |",
                    "| primaries (1 core each) |", "| bound | 1 shard, inversions",
                    "| one idle worker, empty queue |"):
        assert heading in out.stdout
    assert "Every job ran once" in out.stdout, out.stdout[-3000:]
