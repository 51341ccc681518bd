"""The reference pages follow the code: the CLI page is regenerated and compared, and the
configuration page names every option the code accepts."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLI_PAGE = ROOT / "docs" / "reference" / "cli.md"
CONFIG_PAGE = ROOT / "docs" / "reference" / "configuration.md"


def generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("cli_reference",
                                                  ROOT / "scripts" / "cli_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("cli_reference", module)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_is_current() -> None:
    expected = generator().render()
    assert CLI_PAGE.read_text() == expected, (
        "docs/reference/cli.md is stale: regenerate it with"
        " PYTHONPATH=src python scripts/cli_reference.py > docs/reference/cli.md")


def test_cli_reference_covers_every_command() -> None:
    import click

    from conveyor.cli import main

    page = CLI_PAGE.read_text()

    def walk(group: click.Group, path: str) -> None:
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            assert command is not None
            assert f"`{path} {name}`" in page
            if isinstance(command, click.Group):
                walk(command, f"{path} {name}")

    walk(main, "conveyor")


def test_cli_reference_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defaults are the declared ones: an env var set where the page is made changes nothing."""
    monkeypatch.setenv("CONVEYOR_REDIS_URL", "redis://envhost-xyz:6390/3")
    monkeypatch.setenv("CONVEYOR_DASHBOARD_TOKEN", "secret")
    assert "secret" not in generator().render()
    assert "envhost-xyz" not in generator().render()


def names_in_config_page() -> str:
    return CONFIG_PAGE.read_text()


@pytest.mark.parametrize("kind", ["app", "limits", "task", "job", "batch", "worker"])
def test_configuration_page_names_every_option(kind: str) -> None:
    import conveyor
    from conveyor.batch import Batch
    from conveyor.bounds import Limits
    from conveyor.task import JobOptions
    from conveyor.worker import Worker

    def params(fn: object) -> list[str]:
        return [p for p in inspect.signature(fn).parameters  # type: ignore[arg-type]
                if p not in ("self", "app", "fn")]

    names = {
        "app": params(conveyor.Conveyor.__init__),
        "limits": [f.name for f in dataclasses.fields(Limits)],
        "task": params(conveyor.Conveyor.task),
        "job": ["queue", *(f.name for f in dataclasses.fields(JobOptions))],
        "batch": [f.name for f in dataclasses.fields(Batch)],
        "worker": params(Worker.__init__),
    }[kind]
    page = names_in_config_page()
    missing = [n for n in names if f"`{n}`" not in page]
    assert not missing, f"docs/reference/configuration.md does not name {kind} options {missing}"


def test_configuration_page_names_every_environment_variable() -> None:
    import re

    source = "\n".join(p.read_text() for p in (ROOT / "src" / "conveyor").rglob("*.py")
                       if "chaos" not in p.parts)
    found = set(re.findall(r"\bCONVEYOR_[A-Z_]+[A-Z]\b", source))
    page = names_in_config_page()
    missing = sorted(n for n in found if f"`{n}`" not in page)
    assert not missing, f"docs/reference/configuration.md does not name {missing}"
