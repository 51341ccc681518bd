"""The package's layering, read from its source with ``ast``.

* What one worker process runs (``conveyor.worker``) never imports the process fleet
  (``conveyor.fleet``): the fleet runs workers, not the other way round.
* Neither imports the operators' shells (``conveyor.cli``, ``conveyor.web``); the shells
  import them.

Every import counts, including those inside functions and under ``TYPE_CHECKING``: a
deferred import is still a dependency.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import conveyor

SRC = Path(conveyor.__file__).parent

# (importer prefix, imported prefix): the first must never import the second
FORBIDDEN = [
    ("conveyor.worker", "conveyor.fleet"),
    ("conveyor.worker", "conveyor.cli"),
    ("conveyor.worker", "conveyor.web"),
    ("conveyor.fleet", "conveyor.cli"),
    ("conveyor.fleet", "conveyor.web"),
]


@dataclass(frozen=True)
class Module:
    name: str  # dotted, e.g. conveyor.worker.leases
    is_package: bool
    tree: ast.Module
    path: str


def parse(name: str, source: str, *, is_package: bool = False, path: str = "") -> Module:
    return Module(name, is_package, ast.parse(source), path or name)


def package_modules() -> list[Module]:
    modules = []
    for file in sorted(SRC.rglob("*.py")):
        parts = file.relative_to(SRC.parent).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        modules.append(parse(name, file.read_text(), is_package=is_package,
                             path=str(file.relative_to(SRC.parent))))
    return modules


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def imported(module: Module) -> Iterator[tuple[int, str]]:
    """(line, dotted name) for every module an import statement may load; ``from X import
    y`` yields both ``X`` and ``X.y``, since ``y`` may be a submodule."""
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[:len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def layering_violations(modules: list[Module]) -> list[str]:
    found = []
    for module in modules:
        for line, target in imported(module):
            for importer, banned in FORBIDDEN:
                if _within(module.name, importer) and _within(target, banned):
                    found.append(f"{module.path}:{line} imports {target}"
                                 f" ({importer} must not import {banned})")
    return sorted(set(found))


def test_worker_and_fleet_import_one_way() -> None:
    modules = package_modules()
    names = {m.name for m in modules}
    assert {"conveyor.worker", "conveyor.fleet.supervisor", "conveyor.fleet.child",
            "conveyor.fleet.autoscale"} <= names
    assert layering_violations(modules) == []


def test_the_layering_check_catches_each_kind_of_import() -> None:
    cases = [
        ("conveyor.worker.leases", False, "from ..fleet import supervisor"),
        ("conveyor.worker.leases", False, "from ..fleet.child import Child"),
        ("conveyor.worker", True, "from ..fleet.supervisor import Supervisor"),
        ("conveyor.worker.outbox", False, "import conveyor.fleet.autoscale"),
        ("conveyor.worker.wake", False, "def f():\n    from ..cli.base import load_app\n"),
        ("conveyor.worker.wake", False,
         "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..web import create_app\n"),
        ("conveyor.fleet.supervisor", False, "from .. import cli"),
        ("conveyor.fleet", True, "from ..web.api import Api"),
    ]
    for name, is_package, source in cases:
        assert layering_violations([parse(name, source, is_package=is_package)]), source
    allowed = [
        ("conveyor.fleet.child", False, "from ..worker import Worker"),
        ("conveyor.worker.leases", False, "from .backoff import pause_after"),
        ("conveyor.worker", True, "from .wake import leave_markers"),
        ("conveyor.cli.worker", False, "from ..fleet.supervisor import Supervisor"),
        ("conveyor.web.queries", False, "from ..fleet import published"),
        ("conveyor.worker.registry", False, "from .. import keys"),
    ]
    for name, is_package, source in allowed:
        assert layering_violations([parse(name, source, is_package=is_package)]) == [], source
