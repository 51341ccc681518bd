"""Jinja filters that format figures the way the dashboard's script does."""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import quote

import jinja2
import msgspec

from ..keys import split_job_id


def when(ts: float | None) -> str:
    """Epoch seconds as a UTC time; "-" for none."""
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S") + " UTC"


def duration(value: float | None) -> str:
    """Seconds in the unit that reads best; "n/a" for none."""
    if value is None:
        return "n/a"
    if value < 1e-3:
        return f"{value * 1e6:.0f} µs"
    if value < 1:
        return f"{value * 1e3:.1f} ms"
    if value < 120:
        return f"{value:.2f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def figure(value: float | None) -> str:
    """A published count or rate: whole numbers without decimals; "-" for none."""
    if value is None:
        return "-"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:g}"


def segment(value: str) -> str:
    """``value`` quoted to sit in one path segment of a URL."""
    return quote(value, safe="~")


def pretty(value: Any) -> str:
    """A decoded value as indented JSON text (escaped later by autoescape)."""
    try:
        return msgspec.json.format(msgspec.json.encode(value), indent=2).decode()
    except (TypeError, msgspec.EncodeError):
        return repr(value)


def queue_of(job_id: str) -> str:
    """The queue a job (or workflow) id names; empty when it names none."""
    try:
        return split_job_id(job_id)[0]
    except ValueError:
        return ""


def install(env: jinja2.Environment) -> None:
    env.filters.update(when=when, duration=duration, seg=segment, pretty=pretty,
                       figure=figure, queue_of=queue_of)
