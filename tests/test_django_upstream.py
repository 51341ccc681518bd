"""The runner of the upstream Tasks tests (``scripts/django_upstream.py``): the list of
the tests that do not apply is the one docs/django.md shows, and the backends a
``TASKS`` setting names (Django's reference backends, the RQ and database queues) are
the only thing it changes into conveyor's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import django_setup  # noqa: F401 - Django set up before the backends below import

from django_upstream import backends, not_applying  # isort: skip

ROOT = Path(__file__).resolve().parent.parent


def _documented() -> set[tuple[str, str, str]]:
    docs = (ROOT / "docs" / "django.md").read_text()
    table = docs.split("<!-- not-applying:start -->")[1].split("<!-- not-applying:end -->")[0]
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+) \| (.+) \|$", table, flags=re.M)
    return {(test_id, where.strip(), reason) for test_id, where, reason in rows}


def test_the_docs_show_the_list_of_tests_that_do_not_apply() -> None:
    listed = {(test_id, "6.1, 5.2", reason)
              for test_id, reason in not_applying.EVERYWHERE.items()}
    listed |= {(test_id, "5.2", reason)
               for test_id, reason in not_applying.WITH_THE_BACKPORT.items()}
    listed |= {(test_id, "6.1", reason) for test_id, reason in not_applying.ON_DJANGO_6.items()}
    assert _documented() == listed


def test_each_django_adds_its_own_to_the_list() -> None:
    assert not_applying.reasons((6, 1, 3, "final", 0)) == {
        **not_applying.EVERYWHERE, **not_applying.ON_DJANGO_6}
    assert not_applying.reasons((5, 2, 19, "final", 0)) == {
        **not_applying.EVERYWHERE, **not_applying.WITH_THE_BACKPORT}
    assert not set(not_applying.EVERYWHERE) & set(not_applying.WITH_THE_BACKPORT)
    assert not set(not_applying.EVERYWHERE) & set(not_applying.ON_DJANGO_6)


def test_only_djangos_reference_backends_become_conveyors(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVEYOR_REDIS_URL", "redis://127.0.0.1:1/0")
    custom = {"BACKEND": "tasks.test_custom_backend.CustomBackend", "OPTIONS": {"x": 1}}
    setting = {
        "default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend", "QUEUES": []},
        "immediate": {"BACKEND": "django_tasks.backends.immediate.ImmediateBackend",
                      "OPTIONS": {"kept": True}},
        "custom": custom,
        "missing": {"BACKEND": "does.not.exist"},
    }
    made = backends.conveyor_tasks(setting)
    assert made["default"] == {"BACKEND": "django_upstream.backends.Stored", "QUEUES": [],
                               "OPTIONS": {"url": "redis://127.0.0.1:1/0",
                                           "namespace": "upstream"}}
    assert made["immediate"]["BACKEND"] == "django_upstream.backends.RunAtOnce"
    assert made["immediate"]["OPTIONS"]["kept"] is True
    assert made["custom"] is custom and made["missing"] == setting["missing"]
    assert backends.conveyor_tasks(made) == made  # read again after a change: the same
    queues = {"rq": {"BACKEND": "django_tasks_rq.RQBackend"},
              "db": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["a"]}}
    assert {alias: params["BACKEND"] for alias, params
            in backends.conveyor_tasks(queues).items()} == {
        "rq": "django_upstream.backends.Stored", "db": "django_upstream.backends.Stored"}
