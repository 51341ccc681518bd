"""The typing check: ``pass_tasks.py`` is clean and ``fail_tasks.py`` fails exactly on
its lines marked ``# error``, under both ``mypy --strict`` and pyright.

Usage: ``python tests/typecheck/check.py`` (exit status 0 when both checkers agree).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
PASS, FAIL = HERE / "pass_tasks.py", HERE / "fail_tasks.py"


def expected_lines(path: Path) -> set[int]:
    lines = path.read_text().splitlines()
    return {i for i, line in enumerate(lines, 1) if line.rstrip().endswith("# error")}


def mypy_errors(path: Path) -> set[int]:
    out = subprocess.run(
        [str(BIN / "mypy"), "--strict", "--no-incremental", "--cache-dir", "/dev/null",
         "--config-file", "/dev/null", "--python-version", "3.11", str(path)],
        capture_output=True, text=True, check=False).stdout
    pattern = re.compile(rf"^(?:.*/)?{re.escape(path.name)}:(\d+): error:", re.M)
    return {int(n) for n in pattern.findall(out)}


def pyright_errors(path: Path) -> set[int]:
    proc = subprocess.run(
        [str(BIN / "pyright"), "--outputjson", "--pythonpath", sys.executable, str(path)],
        capture_output=True, text=True, check=False)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        sys.exit(f"pyright did not run: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return {d["range"]["start"]["line"] + 1 for d in report["generalDiagnostics"]
            if d["severity"] == "error"}


def main() -> int:
    failed = False
    for checker, errors in (("mypy --strict", mypy_errors), ("pyright", pyright_errors)):
        for path, want in ((PASS, set[int]()), (FAIL, expected_lines(FAIL))):
            got = errors(path)
            if got != want:
                failed = True
                print(f"{checker} on {path.name}: errors on lines {sorted(got)},"
                      f" expected on {sorted(want)}")
            else:
                print(f"{checker} on {path.name}: as expected ({len(want)} error line(s))")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
