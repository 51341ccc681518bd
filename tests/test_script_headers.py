"""Each Lua script's header names its KEYS and ARGV; the Python wrappers must agree."""

import re
from importlib import resources

import pytest

from conveyor.keys import QueueKeys
from conveyor.scripts import SCRIPT_NAMES, calls, source

HEADER = re.compile(r"^-- (KEYS|ARGV)\[(\d+)\]\s+(\w+)", re.MULTILINE)


def header(name: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {"KEYS": [], "ARGV": []}
    for kind, index, label in HEADER.findall(source(name)):
        assert int(index) == len(found[kind]) + 1, f"{name}.lua: {kind}[{index}] out of order"
        found[kind].append(label)
    return found


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_header_matches_wrapper(name: str) -> None:
    h = header(name)
    assert tuple(h["KEYS"]) == calls.KEYS[name]
    assert tuple(h["ARGV"]) == calls.ARGV[name]
    for key in calls.KEYS[name]:
        assert key in QueueKeys.__dataclass_fields__, f"{name}: unknown key {key}"


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_script_starts_with_shebang_and_stays_small(name: str) -> None:
    text = source(name)
    # Redis refuses a #!lua script under OOM before its first write; only a script that
    # does nothing but remove may say allow-oom.
    first = text.splitlines()[0]
    assert first == "#!lua" or (first == "#!lua flags=allow-oom" and name == "purge_dead")
    assert "--@include" not in text
    own = (resources.files("conveyor.scripts") / f"{name}.lua").read_text()
    assert len(own.splitlines()) <= 130, f"{name}.lua is too long; move helpers to include/"


def test_every_lua_file_is_registered() -> None:
    files = {p.name[:-4] for p in resources.files("conveyor.scripts").iterdir()
             if p.name.endswith(".lua")}
    assert files == set(SCRIPT_NAMES)
