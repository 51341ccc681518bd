"""Generate the sync code from its async source, or check that it is up to date.

    python scripts/generate_sync.py          # write every file of PAIRS' right-hand side
    python scripts/generate_sync.py --check  # write nothing; exit 1 if one differs

Each ``_async/<name>.py`` of :data:`PAIRS` is the source (under ``src/conveyor``): the
``unasync`` package takes ``async`` and ``await`` out and renames the async classes to
their sync names (:data:`RENAMES`), and a header marks the result as generated.
``make lint`` runs ``--check``. What differs for real between the two sides lives in
``io.py`` beside each, written by hand on both.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from pathlib import Path

import unasync

ROOT = Path(__file__).resolve().parent.parent / "src" / "conveyor"
PAIRS = [
    ("scripts/_async/transport.py", "scripts/_sync/transport.py"),
    ("_async/poll.py", "_sync/poll.py"),
]
RENAMES = {"AsyncScriptRunner": "ScriptRunner", "AsyncKept": "Kept"}
HEADER = ("# Generated from ../_async/{name} by scripts/generate_sync.py: do not edit;\n"
          "# change the async source and run that script again.\n")


def generated(source: Path) -> str:
    """The sync text made from the async file ``source``."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp, "_async", source.name)
        copy.parent.mkdir()
        copy.write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
        rule = unasync.Rule("/_async/", "/_sync/", additional_replacements=RENAMES)
        unasync.unasync_files([str(copy)], [rule])
        text = Path(tmp, "_sync", source.name).read_text(encoding="utf-8")
    return HEADER.format(name=source.name) + text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; fail when a generated file is not up to date")
    check = parser.parse_args(argv).check
    stale = 0
    for source, target in PAIRS:
        text, path = generated(ROOT / source), ROOT / target
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if text == current:
            continue
        if check:
            stale += 1
            sys.stdout.writelines(difflib.unified_diff(
                current.splitlines(keepends=True), text.splitlines(keepends=True),
                f"{target} (committed)", f"{target} (generated from {source})"))
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT.parent.parent)}")
    if stale:
        print(f"{stale} generated file(s) out of date: run python scripts/generate_sync.py",
              file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
