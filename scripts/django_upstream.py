"""Run the upstream tests of Django's Tasks framework against conveyor's backend, on
Django 6.1 and on Django 5.2 with the django-tasks backport, with a real Redis and real
conveyor workers.

    .venv/bin/python scripts/django_upstream.py [--django 6.1|5.2|both] [--suite NAME]

The suites (``SUITES``): Django's ``tests/tasks/``, and the backend tests
(``tests/tests.py``) of django-tasks-rq and django-tasks-db. What it does:

1. downloads each suite's source distribution from PyPI (``pip download``, exact
   versions below) into ``~/.cache/conveyor-django`` (``$CONVEYOR_DJANGO_CACHE``), once,
   and unpacks its ``tests/``; nothing of them enters this repository;
2. makes a virtualenv there for each Django (``VENVS``, exact versions) with conveyor's
   dependencies, once; Django 6 declares Python 3.12 and is installed with
   ``--ignore-requires-python``: it runs on 3.11 with the two ``inspect`` functions
   ``tests/django_upstream/run.py`` adds;
3. starts a private redis-server and runs each suite under each Django it applies to
   through ``tests/django_upstream/run.py``, which changes only the settings and the
   step that runs a task (see its package's docstring);
4. prints the counts of each run, and exits non-zero when a test that applies did not
   pass, or when ``tests/django_upstream/not_applying.py`` names a test the run did not
   have.

The django-tasks backport's own source distribution ships no tests: on Django 5.2 it is
tested by Django 6.1's tests (with ``django.tasks`` naming it) and by the two backends'.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("CONVEYOR_DJANGO_CACHE")
             or Path.home() / ".cache" / "conveyor-django")

sys.path.insert(0, str(ROOT / "tests"))
from django_upstream import not_applying  # noqa: E402 - after the path above


@dataclass(frozen=True)
class Suite:
    """Upstream tests from one source distribution on PyPI."""

    name: str  # the distribution, and the prefix of its tests' ids
    version: str
    package: str  # the folder of the sdist's tests/ to put on the path ("" for tests/)
    label: str  # what the test runner loads
    djangos: tuple[str, ...]  # the Djangos it runs on


SUITES = [
    Suite("django", "6.1.3", "tests", "tasks", ("6.1", "5.2")),
    Suite("django-tasks-rq", "0.12.0", "", "tests.tests", ("5.2",)),
    Suite("django-tasks-db", "0.13.0", "", "tests.tests", ("6.1", "5.2")),
]
# What each Django's virtualenv holds besides conveyor's dependencies: the Django, the
# backport before Django 6, and what the test modules of the backends import.
VENVS = {
    "6.1": ["django==6.1.3", "django-tasks-db==0.13.0"],
    "5.2": ["django==5.2.19", "django-tasks==0.12.0", "django-tasks-db==0.13.0",
            "django-tasks-rq==0.12.0", "rq==2.6.1", "django-rq==3.2.2"],
}


def pip(python: str | Path, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args],
                   check=True)


def unpacked_tests(suite: Suite) -> Path:
    """The folder to put on the path for ``suite``'s tests, unpacked from its sdist."""
    unpacked = CACHE / f"{suite.name}-{suite.version}-tests"
    if (unpacked / "tests").is_dir():
        return unpacked / suite.package
    sdists = CACHE / "sdist" / f"{suite.name}-{suite.version}"
    if not list(sdists.glob("*.tar.gz")):
        pip(sys.executable, "download", "--no-binary", ":all:", "--no-deps",
            "--ignore-requires-python", f"{suite.name}=={suite.version}", "-d", str(sdists))
    [sdist] = sdists.glob("*.tar.gz")
    staging = Path(tempfile.mkdtemp(dir=CACHE))
    with tarfile.open(sdist) as archive:
        top = archive.getmembers()[0].name.split("/")[0]
        members = [m for m in archive.getmembers()
                   if m.name.startswith(f"{top}/tests/") and m.isfile()]
        archive.extractall(staging, members=members, filter="data")
    shutil.rmtree(unpacked, ignore_errors=True)  # an older or partial unpacking
    (staging / top).rename(unpacked)
    shutil.rmtree(staging)
    return unpacked / suite.package


def django_venv(django: str) -> Path:
    """The interpreter of a virtualenv for Django ``django`` with ``VENVS[django]`` and
    conveyor's dependencies (conveyor itself comes from this clone's ``src``)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*VENVS[django], *project["dependencies"]]
    venv = CACHE / f"venv-django-{django}"
    python = venv / "bin" / "python"
    ready = venv / "ready.json"
    if ready.exists() and json.loads(ready.read_text()) == wanted:
        return python
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip(python, "install", "--ignore-requires-python", *wanted)
    ready.write_text(json.dumps(wanted))
    return python


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def redis_server() -> Iterator[str]:
    """A private redis-server, gone afterwards; its URL."""
    binary = os.environ.get("CONVEYOR_REDIS_SERVER") or shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found (bash scripts/system-deps.sh redis)")
    port, folder = free_port(), tempfile.mkdtemp(prefix="conveyor-django-redis-")
    process = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1",
                                "--dir", folder, "--save", "", "--appendonly", "no"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


def run(python: Path, suite: Suite, tests: Path, url: str) -> dict[str, object]:
    """Run ``suite`` under ``python``; what ``run.py`` wrote."""
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    env = dict(os.environ, CONVEYOR_REDIS_URL=url,
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"),
                                           str(tests)]))
    env.pop("DJANGO_SETTINGS_MODULE", None)
    try:
        subprocess.run([str(python), "-m", "django_upstream.run", str(out), suite.name,
                        suite.label], cwd=tests, env=env, check=True)
        found: dict[str, object] = json.loads(out.read_text())
        found["suite"] = f"{suite.name} {suite.version}"
        return found
    finally:
        out.unlink(missing_ok=True)


def verdict(report: dict[str, object]) -> list[str]:
    """Print the counts of one run; the problems found (empty when all is well)."""
    version = str(report["django"])
    outcomes: dict[str, dict[str, str]] = report["tests"]  # type: ignore[assignment]
    prefix = f"{str(report['suite']).split()[0]}:"
    listed = {test_id: reason for test_id, reason
              in not_applying.reasons(tuple(int(part) for part in version.split(".")[:1])).items()
              if test_id.startswith(prefix)}
    problems = [f"{test_id} applies and {o['outcome']}:\n{o['detail']}"
                for test_id, o in sorted(outcomes.items())
                if test_id not in listed and o["outcome"] != "passed"]
    problems += [f"{test_id} is listed as not applying but {o['outcome']}"
                 for test_id, o in sorted(outcomes.items())
                 if test_id in listed and o["outcome"] != "skipped"]
    modules_out = {name for name in listed if name in outcomes and name.count(".") <= 1}
    problems += [f"{test_id} is listed as not applying but the run has no such test"
                 for test_id in sorted(listed) if test_id not in outcomes
                 and not any(test_id.startswith(f"{m}.") for m in modules_out)]
    passed = sum(o["outcome"] == "passed" for o in outcomes.values())
    failed = sum(test_id not in listed and o["outcome"] != "passed"
                 for test_id, o in outcomes.items())
    skipped = sum(o["outcome"] == "skipped" for o in outcomes.values())
    print(f"{report['suite']} on Django {version}: {passed} passed, {failed} failed,"
          f" {skipped} not applying")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--django", choices=["6.1", "5.2", "both"], default="both")
    parser.add_argument("--suite", choices=[suite.name for suite in SUITES],
                        help="one suite only (default: all)")
    args = parser.parse_args()
    CACHE.mkdir(parents=True, exist_ok=True)
    djangos = ["6.1", "5.2"] if args.django == "both" else [args.django]
    plan = [(django, suite) for django in djangos for suite in SUITES
            if django in suite.djangos and args.suite in {None, suite.name}]
    ready = [(django_venv(django), suite, unpacked_tests(suite)) for django, suite in plan]
    problems: list[str] = []
    with redis_server() as url:
        reports = [run(python, suite, tests, url) for python, suite, tests in ready]
    for report in reports:
        problems += verdict(report)
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
