"""Harness-side handle on one peer's driver (a subprocess in the peer's venv)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from .specs import PeerSpec
from .venvs import REPO_ROOT

RESULT_PREFIX = "BENCH-RESULT "  # must match drivers/__main__.py


class DriverError(RuntimeError):
    """A driver command failed; the message is short enough for a table cell."""


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no output)"


class DriverHandle:
    """Runs ``python -m bench.peers.drivers PEER ...`` with the peer's interpreter."""

    def __init__(
        self, spec: PeerSpec, python: str, redis_url: str, log_dir: Path, redis_pid: int = 0
    ) -> None:
        self.spec = spec
        self.python = python
        self.log_dir = log_dir
        path = [str(REPO_ROOT)]
        if spec.repo_venv:  # measure the working tree's conveyor even if not installed
            path.append(str(REPO_ROOT / "src"))
        self.env = {
            **os.environ,
            "BENCH_REDIS_URL": redis_url,
            "BENCH_REDIS_PID": str(redis_pid or ""),  # drivers/base.py: server CPU per run
            "PYTHONPATH": os.pathsep.join(path),
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        self.env.pop("VIRTUAL_ENV", None)

    def _argv(self, *args: str) -> list[str]:
        return [self.python, "-m", "bench.peers.drivers", self.spec.name, *args]

    def call(self, *args: str, timeout: float) -> dict[str, Any]:
        """Run one driver command to completion and return its JSON result."""
        try:
            proc = subprocess.run(
                self._argv(*args),
                env=self.env,
                cwd=REPO_ROOT,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            raise DriverError(f"`{args[0]}` timed out after {timeout:.0f}s") from exc
        with (self.log_dir / f"{self.spec.name}-driver.log").open("a") as log:
            log.write(f"$ {' '.join(args)} (rc={proc.returncode})\n{proc.stdout}{proc.stderr}\n")
        if proc.returncode != 0:
            raise DriverError(f"`{args[0]}` failed: {_last_line(proc.stderr or proc.stdout)}")
        for line in reversed(proc.stdout.splitlines()):
            if line.startswith(RESULT_PREFIX):
                return dict(json.loads(line[len(RESULT_PREFIX) :]))
        raise DriverError(f"`{args[0]}` printed no result")

    def worker_argv(self, profile: str, burst: bool = False) -> list[str]:
        args = ["worker", "--profile", profile] + (["--burst"] if burst else [])
        return self._argv(*args)

    @property
    def worker_log(self) -> Path:
        return self.log_dir / f"{self.spec.name}-worker.log"
