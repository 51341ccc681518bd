"""The sync code generated from its async source (``scripts/generate_sync.py``) is up to
date, and the check that ``make lint`` runs fails when it is not."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_sync",
                                                  REPO / "scripts" / "generate_sync.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_sync_files_are_what_the_generator_makes() -> None:
    assert _generator().main(["--check"]) == 0


def test_the_check_fails_on_a_generated_file_edited_by_hand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    generator = _generator()
    for source, target in generator.PAIRS:
        for name in (source, target):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(generator.ROOT / name, tmp_path / name)
    monkeypatch.setattr(generator, "ROOT", tmp_path)
    target = tmp_path / generator.PAIRS[0][1]
    target.write_text(target.read_text() + "# edited by hand\n")
    assert generator.main(["--check"]) == 1
    assert "# edited by hand" in capsys.readouterr().out
    assert generator.main([]) == 0  # written again from the source
    assert generator.main(["--check"]) == 0

