"""``python -m bench.peers``: benchmark conveyor against peer task queues.

Run from the repository root.  See ``bench/peers/README.md``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def _ensure_redis_py() -> None:
    """Re-run under the repo's venv if this interpreter lacks redis-py."""
    try:
        import redis  # noqa: F401
    except ImportError:
        venv_python = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "python"
        if venv_python.exists() and not os.environ.get("BENCH_REEXEC"):
            os.environ["BENCH_REEXEC"] = "1"
            os.execv(str(venv_python), [str(venv_python), "-m", "bench.peers", *sys.argv[1:]])
        raise SystemExit("bench.peers needs redis-py in the harness interpreter") from None


if __name__ == "__main__":
    _ensure_redis_py()
    from .cli import main

    main()
