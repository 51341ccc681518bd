"""Reading values that come from Redis, which are untrusted: a record edited by hand, a bug
elsewhere or a partial restore can leave a field that is not what a reader expects. These
helpers never raise; what cannot be read is shown as unknown (or as the given default)."""

from __future__ import annotations

from typing import Any


def text(value: Any) -> str | None:
    """``value`` as text (None stays None); a byte that is not UTF-8 is replaced."""
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def number(value: Any) -> float | None:
    """``value`` as a float, or None when absent or not a number."""
    try:
        return float(text(value) or "")
    except ValueError:
        return None


def integer(value: Any, default: int = 0) -> int:
    """``value`` as an int, or ``default`` when absent or not an integer."""
    try:
        return int(text(value) or default)
    except ValueError:
        return default
