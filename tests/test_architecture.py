"""The package's layering, read from its source with ``ast``.

* What one worker process runs (``conveyor.worker``) never imports the process fleet
  (``conveyor.fleet``): the fleet runs workers, not the other way round.
* Neither imports the operators' shells (``conveyor.cli``, ``conveyor.web``); the shells
  import them.
* The monitor (``conveyor.monitor``) reads only: of a worker it imports only the registry
  (``conveyor.worker.registry``, the one reader of who is alive), of the fleet only what
  supervisors publish (``conveyor.fleet.published``), and nothing that writes jobs (the
  producer, the Lua scripts) or runs them.
* The fleet reads the monitor's readers (``stats``, ``histogram``, ``flow``: what the
  autoscaler decides on), never the ``Monitor`` itself; what the fleet publishes for the
  monitor (``conveyor.fleet.published``) imports nothing of it, so the two packages meet
  without a cycle. A worker imports neither the monitor nor the fleet.
* Inside a worker, the parts get small objects, never the :class:`~conveyor.worker.Worker`:
  no module of ``conveyor.worker`` but the package itself imports it. The running set
  (``worker.slots``) is told nothing of who fills or empties it (the consumer, the wake
  listener, the outbox, the lease keeper, the shutdown), and the outbox only records
  outcomes: alerts and hooks hear of dead jobs through ``worker.dead``.
* The inline runner (``conveyor.testing``) is known only to itself and its batch part
  (``conveyor.inline_batches``): the app, job handles and the monitor reach its records
  through the app's sender (``Sender.record``), never by importing it.
* One module asks Redis for its clock (``conveyor.clock``) and one Lua helper
  (``scripts/include/clock.lua``): every other module and script gets the server's time
  from them, so "now" means the same thing everywhere.

Every import counts, including those inside functions and under ``TYPE_CHECKING``: a
deferred import is still a dependency.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import conveyor

SRC = Path(conveyor.__file__).parent

# (importer prefix, imported prefix, exceptions): the first must never import the second,
# unless what it imports lies within one of the exceptions
FORBIDDEN: list[tuple[str, str, tuple[str, ...]]] = [
    ("conveyor.worker", "conveyor.fleet", ()),
    ("conveyor.worker", "conveyor.monitor", ()),
    ("conveyor.worker", "conveyor.cli", ()),
    ("conveyor.worker", "conveyor.web", ()),
    ("conveyor.fleet", "conveyor.cli", ()),
    ("conveyor.fleet", "conveyor.web", ()),
    ("conveyor.fleet", "conveyor.monitor",
     ("conveyor.monitor.stats", "conveyor.monitor.histogram", "conveyor.monitor.flow")),
    ("conveyor.fleet.published", "conveyor.monitor", ()),
    ("conveyor.monitor", "conveyor.worker", ("conveyor.worker.registry",)),
    ("conveyor.monitor", "conveyor.fleet", ("conveyor.fleet.published",)),
    ("conveyor.monitor", "conveyor.producer", ()),
    ("conveyor.monitor", "conveyor.scripts", ()),
    ("conveyor.monitor", "conveyor.cli", ()),
    ("conveyor.monitor", "conveyor.web", ()),
    *[("conveyor.worker.slots", f"conveyor.worker.{part}", ())
      for part in ("consumer", "wake", "outbox", "leases", "shutdown", "handback")],
    ("conveyor.worker.outbox", "conveyor.alerts", ()),
    ("conveyor.worker.outbox", "conveyor.hooks", ()),
]
WORKER = "conveyor.worker"


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


def imported(module: Module) -> Iterator[tuple[int, str, bool]]:
    """(line, dotted name, whether only a path to what follows) for every module an import
    statement may load; ``from X import y`` yields both ``X`` (a path: ``X.y`` carries the
    verdict when ``X`` is a package on the way to an allowed module) and ``X.y``, since
    ``y`` may be a submodule."""
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, False
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[:len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            yield node.lineno, base, True
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}", False


def _excepted(target: str, exceptions: tuple[str, ...], path_only: bool) -> bool:
    """Whether ``target`` is allowed by ``exceptions``: within one, or (a ``from`` import's
    package) on the way to one."""
    return any(_within(target, allowed) or (path_only and _within(allowed, target))
               for allowed in exceptions)


def layering_violations(modules: list[Module]) -> list[str]:
    found = []
    for module in modules:
        for line, target, path_only in imported(module):
            for importer, banned, exceptions in FORBIDDEN:
                if (_within(module.name, importer) and _within(target, banned)
                        and not _excepted(target, exceptions, path_only)):
                    rule = f"{importer} must not import {banned}"
                    if exceptions:
                        rule += f" but {', '.join(exceptions)}"
                    found.append(f"{module.path}:{line} imports {target} ({rule})")
    return sorted(set(found))


def worker_imports(modules: list[Module]) -> list[str]:
    """Places where a module of the worker package (not the package itself) imports the
    package, or its ``Worker``: a part that needs the whole worker."""
    found = []
    for module in modules:
        if not module.name.startswith(WORKER + "."):
            continue
        for line, target, path_only in imported(module):
            if target == f"{WORKER}.Worker" or (target == WORKER and not path_only):
                found.append(f"{module.path}:{line} imports {target}")
    return sorted(set(found))


def test_worker_parts_never_import_the_worker() -> None:
    modules = package_modules()
    assert {"conveyor.worker.slots", "conveyor.worker.consumer", "conveyor.worker.shutdown",
            "conveyor.worker.wake", "conveyor.worker.dead"} <= {m.name for m in modules}
    assert worker_imports(modules) == []


def test_the_worker_check_catches_a_part_that_takes_the_worker() -> None:
    caught = [
        ("conveyor.worker.wake", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                 "    from . import Worker\n"),
        ("conveyor.worker.registry", "from conveyor.worker import Worker"),
        ("conveyor.worker.consumer", "import conveyor.worker"),
        ("conveyor.worker.leases", "def f():\n    from .. import worker\n"),
    ]
    for name, source in caught:
        assert worker_imports([parse(name, source)]), source
    fine = [
        ("conveyor.worker.consumer", "from .slots import Slots"),
        ("conveyor.worker.wake", "from . import handoff"),
        ("conveyor.worker", "from .consumer import Consumer"),
        ("conveyor.fleet.child", "from ..worker import Worker"),
    ]
    for name, source in fine:
        assert worker_imports([parse(name, source, is_package=name == WORKER)]) == [], source


def test_worker_fleet_and_monitor_import_one_way() -> None:
    modules = package_modules()
    names = {m.name for m in modules}
    assert {"conveyor.worker", "conveyor.fleet.supervisor", "conveyor.fleet.child",
            "conveyor.fleet.autoscale", "conveyor.fleet.published", "conveyor.monitor",
            "conveyor.monitor.stats", "conveyor.worker.registry"} <= names
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
        ("conveyor.worker.consumer", False, "from ..monitor import Monitor"),
        ("conveyor.monitor", True, "from ..worker import Worker"),
        ("conveyor.monitor.overview", False, "from ..worker.leases import LeaseKeeper"),
        ("conveyor.monitor.overview", False, "import conveyor.worker"),
        ("conveyor.monitor", True, "from ..fleet.supervisor import Supervisor"),
        ("conveyor.monitor.stats", False, "from ..fleet import autoscale"),
        ("conveyor.monitor.lists", False, "from ..scripts import calls"),
        ("conveyor.monitor", True, "from .. import producer"),
        ("conveyor.monitor.advice", False, "from ..cli.base import load_app"),
        ("conveyor.fleet.autoscale", False, "from ..monitor import Monitor"),
        ("conveyor.fleet.autoscale", False, "from .. import monitor"),
        ("conveyor.fleet.published", False, "from ..monitor.stats import merge"),
        ("conveyor.worker.slots", False, "from .consumer import Consumer"),
        ("conveyor.worker.slots", False, "from . import wake"),
        ("conveyor.worker.outbox", False, "from ..alerts import alerter_for"),
        ("conveyor.worker.outbox", False, "from ..hooks import Hook"),
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
        ("conveyor.monitor", True, "from ..worker import registry"),
        ("conveyor.monitor.advice", False, "from ..worker.registry import WorkerInfo"),
        ("conveyor.monitor", True, "from ..fleet.published import SupervisorRecord"),
        ("conveyor.monitor", True, "from ..fleet import published"),
        ("conveyor.fleet.autoscale", False, "from ..monitor.stats import merge"),
        ("conveyor.fleet.autoscale", False, "from ..monitor.histogram import Histogram"),
        ("conveyor.fleet.child", False, "from ..worker.registry import SUPERVISOR_ENV"),
        ("conveyor.worker.slots", False, "from .executor import Executor, Held"),
        ("conveyor.worker.consumer", False, "from .slots import Slots"),
        ("conveyor.worker.dead", False, "from ..hooks import Hook"),
    ]
    for name, is_package, source in allowed:
        assert layering_violations([parse(name, source, is_package=is_package)]) == [], source


TESTING = "conveyor.testing"
TESTING_PARTS = ("conveyor.testing", "conveyor.inline_batches")


def inline_runner_importers(modules: list[Module]) -> list[str]:
    """Places outside the inline runner's own modules that import it."""
    return sorted(f"{module.path}:{line} imports {target}" for module in modules
                  if module.name not in TESTING_PARTS
                  for line, target, _ in imported(module) if _within(target, TESTING))


def test_only_the_inline_runner_imports_itself() -> None:
    modules = package_modules()
    assert set(TESTING_PARTS) <= {m.name for m in modules}
    assert inline_runner_importers(modules) == []


def test_the_testing_check_catches_each_kind_of_import() -> None:
    caught = [
        ("conveyor.app", "from .testing import InlineRunner"),
        ("conveyor.job", "def f():\n    from . import testing\n"),
        ("conveyor.monitor.lists", "import conveyor.testing"),
        ("conveyor.app", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                         "    from .testing import InlineRunner\n"),
    ]
    for name, source in caught:
        assert inline_runner_importers([parse(name, source)]), source
    fine = [
        ("conveyor.inline_batches", "from .testing import InlineRunner"),
        ("conveyor.app", "from .producer import Sender"),
        ("conveyor.job", "from . import hooks"),
    ]
    for name, source in fine:
        assert inline_runner_importers([parse(name, source)]) == [], source


CLOCK_MODULE = "conveyor.clock"
LUA_CLOCK = Path("scripts/include/clock.lua")
LOOP_GETTERS = {"get_running_loop", "get_event_loop"}


def _time_module_names(tree: ast.Module) -> set[str]:
    return {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
            for alias in node.names if alias.name == "time"}


def _is_event_loop(node: ast.expr) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            in LOOP_GETTERS)


def time_senders(modules: list[Module]) -> list[str]:
    """Places outside :mod:`conveyor.clock` that send ``TIME``: a ``.time()`` call on
    anything but the ``time`` module or an event loop, or a ``"TIME"`` command name."""
    found = []
    for module in modules:
        if module.name == CLOCK_MODULE:
            continue
        time_names = _time_module_names(module.tree)
        for node in ast.walk(module.tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "time"):
                receiver = node.func.value
                if not ((isinstance(receiver, ast.Name) and receiver.id in time_names)
                        or _is_event_loop(receiver)):
                    found.append(f"{module.path}:{node.lineno} calls {ast.unparse(node)}")
            elif isinstance(node, ast.Constant) and node.value in ("TIME", b"TIME"):
                found.append(f"{module.path}:{node.lineno} names the TIME command")
    return found


def test_one_module_reads_the_server_clock() -> None:
    assert time_senders(package_modules()) == []


def test_one_lua_helper_reads_the_server_clock() -> None:
    scripts = SRC / "scripts"
    readers = sorted(str(f.relative_to(SRC)) for f in scripts.rglob("*.lua")
                     if re.search(r"""redis\.p?call\(\s*['"]TIME['"]""", f.read_text(),
                                  re.IGNORECASE))
    assert readers == [str(LUA_CLOCK)]


def test_the_clock_check_catches_each_way_of_sending_time() -> None:
    senders = [
        "sec, usec = app.redis.time()",
        "async def f(client):\n    return await client.time()",
        "with app.redis.pipeline() as pipe:\n    pipe.time()",
        "client.execute_command('TIME')",
        "import time as clock\nr.time()",
    ]
    for source in senders:
        assert time_senders([parse("conveyor.monitor.x", source)]), source
    local_clocks = [
        "import time\nnow = time.time()",
        "import time as _t\nnow = _t.time()",
        "import asyncio\nnow = asyncio.get_running_loop().time()",
        "time_left = 'time'",
    ]
    for source in local_clocks:
        assert time_senders([parse("conveyor.monitor.x", source)]) == [], source
    assert time_senders([parse(CLOCK_MODULE, "client.time()")]) == []
