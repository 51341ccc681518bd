"""Run Django's own tests of the Tasks framework against conveyor's backend, on Django 6.1
and on Django 5.2 with the django-tasks backport, with a real Redis and real workers.

    .venv/bin/python scripts/django_upstream.py [--django 6.1|5.2|both]

What it does:

1. downloads Django's source distribution from PyPI (``pip download``, exact version
   below) into ``~/.cache/conveyor-django`` (``$CONVEYOR_DJANGO_CACHE``), once, and
   unpacks its ``tests/tasks/``; nothing of it enters this repository;
2. makes a virtualenv there with that Django and conveyor's dependencies, once
   (``--ignore-requires-python``: Django 6 declares Python 3.12, and runs on 3.11 with
   the two ``inspect`` functions ``tests/django_upstream/run.py`` adds); Django 5.2 and
   the backport are the project's own ``.venv`` (this interpreter);
3. starts a private redis-server and runs the upstream test modules under each Django
   through ``tests/django_upstream/run.py``, which changes only the settings and the
   step that runs a task (see its package's docstring);
4. prints each Django's counts, and exits non-zero when a test that applies did not pass,
   or when ``tests/django_upstream/not_applying.py`` names a test the run did not see.

The django-tasks backport's source distribution ships no tests; its Django 5.2 run is
Django 6.1's tests on the backport.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DJANGO = "6.1.3"  # the Django whose tests/tasks/ run, on itself and on 5.2's backport
LABEL = "tasks"  # the test package; its test_*.py modules are discovered
CACHE = Path(os.environ.get("CONVEYOR_DJANGO_CACHE")
             or Path.home() / ".cache" / "conveyor-django")

sys.path.insert(0, str(ROOT / "tests"))
from django_upstream import not_applying  # noqa: E402 - after the path above


def pip(python: str | Path, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args],
                   check=True)


def upstream_tests() -> Path:
    """The folder holding Django's ``tasks`` test package, unpacked from the sdist."""
    unpacked = CACHE / f"django-{DJANGO}-tests"
    if (unpacked / "tasks" / "test_tasks.py").exists():
        return unpacked
    sdists = CACHE / "sdist"
    sdist = sdists / f"django-{DJANGO}.tar.gz"
    if not sdist.exists():
        pip(sys.executable, "download", "--no-binary", ":all:", "--no-deps",
            "--ignore-requires-python", f"django=={DJANGO}", "-d", str(sdists))
    prefix = f"django-{DJANGO}/tests/tasks/"
    staging = Path(tempfile.mkdtemp(dir=CACHE))
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(prefix) and m.isfile()]
        archive.extractall(staging, members=members, filter="data")
    (staging / f"django-{DJANGO}" / "tests").rename(unpacked)
    shutil.rmtree(staging)
    return unpacked


def django_venv() -> Path:
    """The interpreter of a virtualenv with Django ``DJANGO`` and conveyor's
    dependencies (conveyor itself comes from this clone's ``src``)."""
    venv = CACHE / f"venv-django-{DJANGO}"
    python = venv / "bin" / "python"
    ready = venv / ".ready"
    if ready.exists():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pip(python, "install", "--ignore-requires-python", f"django=={DJANGO}",
        *project["dependencies"])
    ready.touch()
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


def run(python: str | Path, tests: Path, url: str) -> dict[str, object]:
    """Run the upstream modules under ``python``; what ``run.py`` wrote."""
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    env = dict(os.environ, CONVEYOR_REDIS_URL=url,
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"),
                                           str(tests)]))
    env.pop("DJANGO_SETTINGS_MODULE", None)
    try:
        subprocess.run([str(python), "-m", "django_upstream.run", str(out), LABEL],
                       cwd=tests, env=env, check=True)
        found: dict[str, object] = json.loads(out.read_text())
        return found
    finally:
        out.unlink(missing_ok=True)


def verdict(report: dict[str, object]) -> list[str]:
    """Print the counts of one run; the problems found (empty when all is well)."""
    version = str(report["django"])
    outcomes: dict[str, dict[str, str]] = report["tests"]  # type: ignore[assignment]
    listed = not_applying.reasons(tuple(int(part) for part in version.split(".")[:1]))
    problems = [f"{test_id} applies and {o['outcome']}:\n{o['detail']}"
                for test_id, o in sorted(outcomes.items())
                if test_id not in listed and o["outcome"] != "passed"]
    problems += [f"{test_id} is listed as not applying but {o['outcome']}"
                 for test_id, o in sorted(outcomes.items())
                 if test_id in listed and o["outcome"] != "skipped"]
    modules_out = {name for name in listed if name in outcomes and name.count(".") == 1}
    problems += [f"{test_id} is listed as not applying but the run has no such test"
                 for test_id in sorted(listed) if test_id not in outcomes
                 and not any(test_id.startswith(f"{m}.") for m in modules_out)]
    passed = sum(o["outcome"] == "passed" for o in outcomes.values())
    failed = sum(test_id not in listed and o["outcome"] != "passed"
                 for test_id, o in outcomes.items())
    skipped = sum(o["outcome"] == "skipped" for o in outcomes.values())
    print(f"Django {version}: {passed} passed, {failed} failed, {skipped} not applying"
          f" (tests/django_upstream/not_applying.py)")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--django", choices=["6.1", "5.2", "both"], default="both")
    chosen = parser.parse_args().django
    CACHE.mkdir(parents=True, exist_ok=True)
    tests = upstream_tests()
    pythons: list[str | Path] = []
    if chosen in {"6.1", "both"}:
        pythons.append(django_venv())
    if chosen in {"5.2", "both"}:
        pythons.append(sys.executable)  # the project's venv: Django 5.2 and the backport
    problems: list[str] = []
    with redis_server() as url:
        reports = [run(python, tests, url) for python in pythons]
    for report in reports:
        problems += verdict(report)
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
