"""Tables that fit the terminal they are printed on.

An id or a task name is what an operator copies into the next command, so it is never
cut: those columns do not wrap and are as wide as their longest value. From
:data:`WIDE` columns up a view is one table; below, each row becomes a block (its names
on the first line, its figures below, laid out by rich to the width), which fits 80
columns whatever the figures. Units go in the headers, so the cells stay short.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich import box
from rich.columns import Columns
from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

WIDE = 120  # columns from which a view is one table

NAME, FIGURE, TEXT = "name", "figure", "text"


@dataclass(frozen=True, slots=True)
class Column:
    """A column of a view.

    :param header: its header, with the unit (``wait p95 (s)``)
    :param kind: ``name`` (an id or a name: never cut), ``figure`` (a short value,
        right-aligned) or ``text`` (free text that may wrap, on a line of its own when
        stacked)
    """

    header: str
    kind: str = FIGURE


def seconds(value: float | None) -> str:
    """A duration for a column whose header says ``(s)``: three significant digits."""
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}" if value >= 0.001 else f"{value:.1e}" if value > 0 else "0"


def wide(console: Console) -> bool:
    return console.width >= WIDE


TEXT_LEAST = 20  # free text narrower than this is hard to read


def narrowest(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[int]:
    """How narrow each column may get: a name or a figure as wide as its longest value
    (and a name as its header), a header as its longest word."""
    out = []
    for i, column in enumerate(columns):
        words = max(len(word) for word in column.header.split())
        if column.kind == TEXT:
            out.append(max(words, TEXT_LEAST))
            continue
        longest = max([len(row[i]) for row in rows] + [words])
        out.append(max(longest, len(column.header)) if column.kind == NAME else longest)
    return out


def spacing(columns: Sequence[Column]) -> int:
    """What the table's own padding takes (a space each side of each cell)."""
    return 2 * len(columns)


def fits(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> bool:
    """Whether the one-table form fits ``width`` without cutting a value."""
    return sum(narrowest(columns, rows)) + spacing(columns) <= width


def table(title: str | None, columns: Sequence[Column], rows: Sequence[Sequence[str]],
          width: int = WIDE) -> Table:
    """The one-table form of a view, ``width`` columns at most: when the headers on one
    line do not fit, each column but free text gets the width of its longest value (or
    header word), and the headers wrap."""
    out = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False,
                collapse_padding=True)
    least = narrowest(columns, rows)
    natural = [max(n, len(c.header)) for c, n in zip(columns, least, strict=True)]
    tight = sum(natural) + spacing(columns) > width
    for column, n in zip(columns, least if tight else natural, strict=True):
        if column.kind == TEXT:
            out.add_column(column.header, overflow="fold", ratio=1, min_width=n)
        elif column.kind == NAME:
            out.add_column(column.header, no_wrap=True, width=n, overflow="fold")
        else:  # the header may wrap ("wait p95" over "(s)"), the figure never
            out.add_column(column.header, justify="right", width=n)
    for row in rows:
        out.add_row(*row)
    return out


def stacked(title: str | None, columns: Sequence[Column], rows: Sequence[Sequence[str]]
            ) -> Group:
    """The narrow form of a view: a block per row."""
    parts: list[RenderableType] = []
    if title:
        parts.append(Text(title, style="bold"))
    for n, row in enumerate(rows):
        if n:
            parts.append(Text())  # a blank line between blocks: each reads as one record
        names = [value for column, value in zip(columns, row, strict=True)
                 if column.kind == NAME and value]
        figures = [Text.assemble((f"{column.header} ", "dim"), value)
                   for column, value in zip(columns, row, strict=True)
                   if column.kind == FIGURE]
        texts = [Text(value, overflow="fold") for column, value in zip(columns, row, strict=True)
                 if column.kind == TEXT and value]
        parts.append(Text("  ".join(names), style="bold", overflow="fold"))
        if figures:
            parts.append(Padding(Columns(figures, padding=(0, 3)), (0, 0, 0, 2)))
        parts += [Padding(text, (0, 0, 0, 2)) for text in texts]
    if not rows:
        parts.append(Text("(none)", style="dim"))
    return Group(*parts)


def view(console: Console, title: str | None, columns: Sequence[Column],
         rows: Sequence[Sequence[str]]) -> RenderableType:
    """The view in the form that fits ``console``."""
    if wide(console) and fits(columns, rows, console.width):
        return table(title, columns, rows, console.width)
    return stacked(title, columns, rows)
