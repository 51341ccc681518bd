"""The one loader of ``MODULE:APP`` that the CLI, the supervisor and its children share."""

from __future__ import annotations

import re

import pytest

import conveyor
from conveyor.fleet.supervisor import Supervisor
from conveyor.loading import import_app


def test_a_module_alone_finds_its_app_by_the_default_names() -> None:
    from apps import cli_app

    assert import_app("apps.cli_app") is cli_app.app
    assert import_app("apps.cli_app:app") is cli_app.app


@pytest.mark.parametrize(("spec", "message"), [
    (":app", "expected MODULE:APP, got ':app'"),
    ("apps.nosuchmodule:app", "cannot import 'apps.nosuchmodule'"),
    ("apps.cli_app:nothing", "has no conveyor.Conveyor named 'nothing'"),
    ("apps.cli_app:double", "has no conveyor.Conveyor named 'double'"),  # a task, not an app
])
def test_a_bad_spec_is_named_in_a_configuration_error(spec: str, message: str) -> None:
    with pytest.raises(conveyor.ConfigurationError, match=re.escape(message)):
        import_app(spec)


def test_the_supervisor_refuses_a_bad_spec_before_it_starts_a_child() -> None:
    # The same error as the CLI's, raised where the supervisor is built: no child is
    # started only to die on the import.
    with pytest.raises(conveyor.ConfigurationError, match=re.escape("cannot import 'apps.nosuch'")):
        Supervisor("apps.nosuch:app")
