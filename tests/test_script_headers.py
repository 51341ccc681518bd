"""Each Lua script's header names its KEYS and ARGV; the Python wrappers must agree."""

import re
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import pytest

from conveyor.keys import QueueKeys
from conveyor.scripts import SCRIPT_NAMES, assemble, calls, source
from helpers import RedisServer, env_with_src

HEADER = re.compile(r"^-- (K|A)\.(\w+)", re.MULTILINE)
ITEM_COUNT = re.compile(r"^-- A\.\w+ .*?(\d+) fields? each", re.MULTILINE)
USES = re.compile(r"(?<![\w.])(K|A|ITEM)\.(\w+)")
POSITION = re.compile(r"\b(KEYS|ARGV)\[[^\]]*\d")  # a digit inside KEYS[...] or ARGV[...]


def own_text(path: str) -> str:
    return (resources.files("conveyor.scripts") / path).read_text()


def header(name: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {"K": [], "A": []}
    for kind, label in HEADER.findall(own_text(f"{name}.lua")):
        found[kind].append(label)
    return found


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_header_matches_wrapper(name: str) -> None:
    h = header(name)
    assert tuple(h["K"]) == calls.KEYS[name]
    assert tuple(h["A"]) == calls.ARGV[name]._fields  # type: ignore[attr-defined]
    for key in calls.KEYS[name]:
        assert key in QueueKeys.__dataclass_fields__, f"{name}: unknown key {key}"
    # The header's "N fields each" of the items a call carries is their tuple's length.
    counts = [int(n) for n in ITEM_COUNT.findall(own_text(f"{name}.lua"))]
    item = calls.ITEMS.get(name)
    assert counts == ([] if item is None or len(item._fields) == 1  # type: ignore[attr-defined]
                      else [len(item._fields)])  # type: ignore[attr-defined]


def lua_files() -> list[str]:
    root = resources.files("conveyor.scripts")
    return sorted([f"{p.name}" for p in root.iterdir() if p.name.endswith(".lua")]
                  + [f"include/{p.name}" for p in (root / "include").iterdir()
                     if p.name.endswith(".lua")])


@pytest.mark.parametrize("path", lua_files())
def test_no_lua_file_writes_a_position(path: str) -> None:
    # Positions exist only in the bindings the loader makes from conveyor.scripts.signatures
    # (K, A, ITEM): a reordered tuple then moves the script's names with it.
    text = own_text(path)
    found = [line for line in text.splitlines() if POSITION.search(line)]
    assert not found, f"{path} indexes KEYS/ARGV by a number: {found}"
    assert not re.search(r"^\s*local (K|A|ITEM)\b", text, re.MULTILINE), (
        f"{path} binds K, A or ITEM itself; the loader does")


def test_the_position_check_catches_positions() -> None:
    for bad in ("local x = ARGV[3]", "KEYS[1]", "ARGV[base + 2]", "-- ARGV[2..] ids"):
        assert POSITION.search(bad), bad
    for good in ("ARGV[base + ITEM.token]", "#ARGV", "K.job_prefix", "ARGV[FIRST + i * FIELDS]"):
        assert not POSITION.search(good), good


def included(name: str) -> list[str]:
    """Every file script ``name`` is made of: itself and its includes, recursively."""
    read_paths: list[str] = []

    def read(path: str) -> str:
        read_paths.append(path)
        return own_text(path)

    assemble(name, read)
    return read_paths


def defined(name: str) -> dict[str, set[str]]:
    item = calls.ITEMS.get(name)
    return {"K": set(calls.KEYS[name]),
            "A": set(calls.ARGV[name]._fields),  # type: ignore[attr-defined]
            "ITEM": set() if item is None
            else {"first", "fields", *item._fields}}  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_binding_used_is_defined_by_each_host(name: str) -> None:
    # An include reads its host's arguments by name; every script that includes it (also
    # through another include) must bind each of those names, or the include reads nil.
    names = defined(name)
    for path in included(name):
        for kind, label in USES.findall(own_text(path)):
            assert label in names[kind], (
                f"{path} uses {kind}.{label}, which {name}.lua does not bind")


def test_item_fields_do_not_shadow_the_item_layout() -> None:
    for name, item in calls.ITEMS.items():
        assert name in SCRIPT_NAMES
        assert not {"first", "fields"} & set(item._fields)  # type: ignore[attr-defined]
        # the count of items is the last fixed argument
        assert calls.ARGV[name]._fields  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_bindings_come_after_the_transport_takes_its_part(name: str) -> None:
    text = source(name)
    assert text.index("table.remove(ARGV)") < text.index("local function body_()") \
        < text.index("local K = {") < text.index("local A = {")
    assert text.count("local K = {") == 1


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_script_starts_with_shebang_and_stays_small(name: str) -> None:
    text = source(name)
    # Redis refuses a #!lua script under OOM before its first write; only a script that
    # does nothing but remove may say allow-oom.
    first = text.splitlines()[0]
    assert first == "#!lua" or (first == "#!lua flags=allow-oom" and name == "purge_dead")
    assert "--@include" not in text
    own = (resources.files("conveyor.scripts") / f"{name}.lua").read_text()
    # The header names every KEYS and ARGV entry, so it grows with what a script touches;
    # the bound that keeps a script readable is on its code.
    code = [line for line in own.splitlines() if not line.startswith("--")]
    assert len(code) <= 100, f"{name}.lua is too long; move helpers to include/"
    assert len(own.splitlines()) <= 160, f"{name}.lua is too long; move helpers to include/"


def test_every_lua_file_is_registered() -> None:
    files = {p.name[:-4] for p in resources.files("conveyor.scripts").iterdir()
             if p.name.endswith(".lua")}
    assert files == set(SCRIPT_NAMES)


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_helper_is_defined_before_it_is_used(name: str) -> None:
    # A Lua local referenced above its definition is a global (nil) at run time, and an
    # include inlined twice would define its helpers twice: both fail here, not in Redis.
    text = source(name)
    defined = [m.group(1) for m in re.finditer(r"^local function (\w+)", text, re.MULTILINE)]
    assert len(defined) == len(set(defined)), f"{name}: a helper is defined twice"
    for helper in defined:
        where = text.index(f"local function {helper}(")
        first_use = re.search(rf"(?<![\w.:]){helper}\(", text)
        assert first_use is not None and first_use.start() > where, (
            f"{name}.lua uses {helper}() before its definition")
    assert "--@include" not in text


def _files(**files: str) -> Callable[[str], str]:
    def read(path: str) -> str:
        if path not in files:
            raise FileNotFoundError(path)
        return files[path]
    return read


def test_includes_resolve_recursively_once_each_in_dependency_order() -> None:
    read = _files(**{"s.lua": "#!lua\n--@include b\n--@include a\nmain()\n",
                     "include/a.lua": "--@include c\nA\n",
                     "include/b.lua": "--@include a\n--@include c\nB\n",
                     "include/c.lua": "C\n"})
    assert assemble("s", read).split() == ["#!lua", "C", "A", "B", "main()"]


def test_include_cycles_and_missing_files_are_refused_by_name() -> None:
    cycle = _files(**{"s.lua": "#!lua\n--@include a\n", "include/a.lua": "--@include b\n",
                      "include/b.lua": "--@include a\n"})
    with pytest.raises(ValueError, match=r"include cycle in s\.lua: s\.lua -> a -> b -> a"):
        assemble("s", cycle)
    missing = _files(**{"s.lua": "#!lua\n--@include a\n", "include/a.lua": "--@include z\n"})
    with pytest.raises(FileNotFoundError, match=r"s\.lua -> a includes 'z'"):
        assemble("s", missing)
    with pytest.raises(ValueError, match="shebang"):
        assemble("s", _files(**{"s.lua": "return 1\n"}))


def test_scripts_are_read_when_conveyor_is_imported_not_later(redis_server: RedisServer,
                                                              tmp_path: Path) -> None:
    # A deploy may replace the files under a running process; a script read after that
    # would be sent the old process's arguments (a long chaos run met exactly that).
    program = tmp_path / "deploy.py"
    program.write_text(textwrap.dedent(f"""
        import importlib.resources
        import conveyor

        def gone(*args, **kwargs):
            raise AssertionError("a script file was read after import")

        importlib.resources.files = gone
        app = conveyor.Conveyor({redis_server.url!r}, namespace="deploy{uuid.uuid4().hex[:6]}")

        @app.task(name="t", queue="q")
        def t(x: int) -> int:
            return x

        job = t.enqueue(1)
        print(job.info().state.value)
    """))
    done = subprocess.run([sys.executable, str(program)], capture_output=True, text=True,
                          timeout=60, env=env_with_src())
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ready"
