"""Cached per-peer virtualenvs under ``bench/.venvs/``.

A venv is rebuilt only when its requirement list changes (a hash of it is
stored in a marker file), so repeated benchmark runs start in seconds.  Any
failure is turned into :class:`VenvError` with pip's last lines, so the
harness can print the reason and carry on with the other peers.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from .specs import PeerSpec

BENCH_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = BENCH_DIR.parent
VENV_ROOT = BENCH_DIR / ".venvs"
MARKER = "bench-requirements.sha256"
INSTALL_TIMEOUT_S = 900


class VenvError(RuntimeError):
    """The peer's environment could not be prepared."""


def repo_python() -> str:
    """Interpreter for conveyor: the repo's venv if present, else our own."""
    candidate = REPO_ROOT / ".venv" / "bin" / "python"
    return str(candidate) if candidate.exists() else sys.executable


def _digest(spec: PeerSpec) -> str:
    text = "\n".join((sys.version, *spec.requirements))
    return hashlib.sha256(text.encode()).hexdigest()


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def _run(cmd: list[str]) -> None:
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise VenvError(f"timed out after {INSTALL_TIMEOUT_S}s: {' '.join(cmd[:4])}") from exc
    if proc.returncode != 0:
        raise VenvError(f"{' '.join(cmd[2:5])} failed: {_tail(proc.stderr or proc.stdout)}")


def ensure_venv(spec: PeerSpec, log: Callable[[str], None] = print) -> str:
    """Return the interpreter path for *spec*, creating its venv if needed."""
    if spec.repo_venv:
        return repo_python()
    venv = VENV_ROOT / spec.name
    python = venv / "bin" / "python"
    marker = venv / MARKER
    digest = _digest(spec)
    if python.exists() and marker.exists() and marker.read_text().strip() == digest:
        return str(python)
    if venv.exists():
        shutil.rmtree(venv)
    log(f"[{spec.name}] creating venv {venv} ...")
    base = getattr(sys, "_base_executable", sys.executable)
    _run([base, "-m", "venv", str(venv)])
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run([*pip, *spec.requirements])
    marker.write_text(digest + "\n")
    log(f"[{spec.name}] installed {' '.join(spec.requirements)}")
    return str(python)
