"""MkDocs hook: the reST roles the docstrings use (``:class:`~conveyor.Job```) rendered as
code naming the object, as Sphinx would show them, instead of the raw markers."""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(r":(?:class|meth|func|attr|mod|data|exc|obj):<code>(~?)([\w.]+)</code>")


def _name(match: re.Match[str]) -> str:
    tilde, target = match.group(1), match.group(2)
    return f"<code>{target.rsplit('.', 1)[-1] if tilde else target}</code>"


def on_page_content(html: str, **kwargs: Any) -> str:
    return ROLE.sub(_name, html)
