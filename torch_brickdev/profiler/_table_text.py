"""Text tables that fit a width: the report's tables (report.py) lay out their rows here.

A table is a label column (names, left-aligned) and columns of right-aligned cells. Given a width
(a terminal's), a row too wide is fitted: long labels are cut in the middle with an ellipsis
first, down to ``MIN_LABEL`` characters; then optional columns are left out, least useful first;
then labels are cut further. Labels are printed through :func:`~torch_brickdev.terminal.printable`
(they are other people's names). Without a width every row is whole: what a file or a pipe
gets. Plain Python (no torch).
"""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass
from typing import List, Optional, Sequence

from ..argcheck import check_int
from ..terminal import printable, terminal_columns

__all__ = ["Column", "Table", "fitting_width"]

MIN_LABEL = 24  # labels are cut to this before any column is left out
_LAST_LABEL = 12  # ... and to this after every optional column is
_GAP = 2  # between the label column and the first cell
ELLIPSIS = "\u2026"


@dataclass(frozen=True)
class Column:
    """A right-aligned column: its header and width (header and cells padded to it), and when
    it may be left out to fit a width: ``drop`` 0 never, else the smallest goes first."""

    header: str
    width: int
    drop: int = 0


def fitting_width(width, where: str) -> Optional[int]:
    """The width a table's rows must fit, from a table's ``width`` argument: an int > 0 is that
    many columns, 0 no limit; None is the terminal's width where standard output is a terminal,
    and no limit where it is a file or a pipe (which keep every column)."""
    width = check_int(width, "width", where, low=0, optional=True)
    if width is None:
        stream = sys.stdout
        try:
            width = terminal_columns() if stream is not None and stream.isatty() else 0
        except (AttributeError, ValueError):  # a replaced or closed stdout
            width = 0
    return width or None


def cut(text: str, room: int) -> str:
    """``text`` in at most ``room`` characters: its start and end around an ellipsis (a name's
    last part tells most: ``model.layers.0…q_proj``). Leading spaces (a call path's depth) are
    kept while 8 characters of the name still fit."""
    if len(text) <= room:
        return text
    name = text.lstrip(" ")
    indent = min(len(text) - len(name), max(0, room - 8))
    room -= indent
    if room <= 1:
        return (" " * indent + name)[:room + indent]
    tail = (room - 1) // 2
    head = room - 1 - tail
    return " " * indent + name[:head] + ELLIPSIS + (name[-tail:] if tail else "")


class Table:
    """Rows of one label and one cell per column, laid out by :meth:`lines` for a width."""

    def __init__(self, label_header: str, columns: Sequence[Column]):
        self.label_header = label_header
        self.columns = list(columns)
        self._labels: List[str] = []
        self._cells: List[Sequence[str]] = []

    def add(self, label: str, cells: Sequence[str]) -> None:
        assert len(cells) == len(self.columns), (cells, self.columns)
        self._labels.append(printable(label))
        self._cells.append(cells)

    def lines(self, width: Optional[int]) -> "Layout":
        """The header, rules and rows, fitted to ``width`` (None: every row whole)."""
        labels = self._labels
        label_width = max([len(self.label_header)] + [len(label) for label in labels])
        shown = list(range(len(self.columns)))
        cut_to = None
        if width is not None:
            def total(label: int) -> int:
                return label + _GAP + sum(self.columns[i].width for i in shown)

            if total(label_width) > width:
                floor = max(len(self.label_header), min(label_width, MIN_LABEL))
                for i in sorted((i for i in shown if self.columns[i].drop),
                                key=lambda i: self.columns[i].drop):
                    if total(floor) <= width:
                        break
                    shown.remove(i)
                # the room the columns left, down to _LAST_LABEL where none is left to drop
                room = max(width - total(0), len(self.label_header), _LAST_LABEL)
                if room < label_width:
                    cut_to, labels = room, [cut(label, room) for label in labels]
                    label_width = room
        pad = label_width + _GAP
        header = f"{self.label_header:<{pad}}" + "".join(
            f"{self.columns[i].header:>{self.columns[i].width}}" for i in shown)
        rows = [f"{label:<{pad}}" + "".join(f"{cells[i]:>{self.columns[i].width}}" for i in shown)
                for label, cells in zip(labels, self._cells)]
        left_out = [self.columns[i].header for i in range(len(self.columns)) if i not in shown]
        rule = "-" * len(header)
        return Layout([rule, header, rule, *rows, rule], width, cut_to is not None, left_out)


@dataclass
class Layout:
    """A laid-out table: its lines, and what fitting ``width`` took from it."""

    lines: List[str]
    width: Optional[int]
    labels_cut: bool
    left_out: List[str]

    def with_notes(self, notes: Sequence[str]) -> str:
        """The table and its notes below it, the notes wrapped to the width; a last note says
        what was cut or left out to fit, and how to see every column."""
        notes = list(notes)
        if self.labels_cut or self.left_out:
            parts = (["names cut"] if self.labels_cut else []) + (
                [f"{', '.join(self.left_out)} left out"] if self.left_out else [])
            notes.append(f"fitted to {self.width} columns: {'; '.join(parts)} "
                         f"(table(width=0) shows every column whole)")
        if self.width is not None:
            notes = [wrapped for note in notes for wrapped in
                     textwrap.wrap(note, self.width, subsequent_indent="  ",
                                   break_on_hyphens=False) or [""]]
        return "\n".join(self.lines + notes)
