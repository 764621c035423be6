"""What a contract's checks read: a report validated once (:class:`Subject`), its bricks by name
and the metadata figures the contract declares, read and checked once."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Tuple

from ...argcheck import show_json
from ...profiler import BrickStats, Report, ReportError, SyncMode, WrittenFigures

from .file import Contract, FIGURE_KINDS
from .numbers import _finite, _positive

__all__ = ["Figures", "Subject", "figure_problem", "read_figures", "subject"]

# ---- what the checks read, validated once -------------------------------------------------------
#
# The report reader (load_report) and Report.validate() guarantee every figure of a report:
# integer counts and nanoseconds, finite percentiles, a known sync mode, counters in health.
# The free-form metadata holds any JSON: the figures a contract declares are read once.


def figure_problem(label: str, kind: str, value) -> Optional[str]:
    """Why ``value`` cannot be a figure declared as ``kind`` (None when it can), naming it by
    ``label`` (``metadata train.steps``): ``metadata train.steps is string 'x': expected a
    positive integer``."""
    expected = FIGURE_KINDS[kind]
    if kind == "count":
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    elif kind == "number":
        ok = _positive(value)
    elif kind == "any":
        ok = True
    elif kind == "shares" and isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            if not (_finite(item) and 0 <= item <= 1):
                return f"{label}[{i}] is {show_json(item)}: expected {expected}"
        ok = True
    elif not isinstance(value, (list, tuple)):
        ok = False
    else:
        for i, item in enumerate(value):
            if not _positive(item):
                return f"{label}[{i}] is {show_json(item)}: expected {expected}"
        ok = True
    return None if ok else f"{label} is {show_json(value)}: expected {expected}"


@dataclass(frozen=True)
class Figures:
    """The metadata figures a contract declares, read once: ``values[key]`` for usable ones,
    ``problems[key]`` says why a present figure is unusable."""

    values: Dict[str, object] = field(default_factory=dict)
    problems: Dict[str, str] = field(default_factory=dict)

    def get(self, key: str) -> Tuple[Optional[object], Optional[str]]:
        """``(value, None)``; ``(None, None)`` when absent; ``(None, problem)``."""
        return self.values.get(key), self.problems.get(key)


def read_figures(metadata: dict, contract: Contract, overrides: Dict[str, object]) -> Figures:
    table = metadata.get(contract.metadata) if contract.metadata else metadata
    table = {**(table if isinstance(table, dict) else {}), **overrides}
    where = f"{contract.metadata}." if contract.metadata else ""
    values, problems = {}, {}
    for key, kind in contract.figures.items():
        if key in table:
            problem = figure_problem(f"metadata {where}{key}", kind, table[key])
            if problem:
                problems[key] = problem
            else:
                values[key] = table[key]
    return Figures(values, problems)


@dataclass(frozen=True)
class Subject:
    """A report as the checks read it: validated, the bricks by name (the first of duplicated
    names; completeness reports duplicates), the contract's figures read. ``invalid``: why the
    report breaks the rules of a report (then every check fails, saying so)."""

    report: Report
    contract: Contract
    mode: Optional[SyncMode] = None
    named: Dict[str, BrickStats] = field(default_factory=dict)
    figures: Figures = field(default_factory=Figures)
    written: Optional[WrittenFigures] = None  # of a report read from a file or dict
    invalid: Optional[str] = None

    @property
    def asynchronous(self) -> bool:
        """Whether the report's device completes work after its launch (CUDA; the host runtime
        with deferred completion). A report written before the field: its runtime says."""
        written = self.report.device.get("asynchronous")
        if isinstance(written, bool):
            return written
        return self.report.device.get("runtime") == "cuda"

    def no_metadata(self, names: Sequence[str]) -> str:
        table = f"{self.contract.metadata} " if self.contract.metadata else ""
        return f"report has no {table}metadata ({', '.join(names)}): {self.contract.missing}"

    def absent(self, name: str) -> str:
        """Says that brick ``name`` is not in the report, with the report's near names (a
        misspelt name in a contract shows here)."""
        near = difflib.get_close_matches(name, [b.name for b in self.report.bricks], n=3)
        return f"brick {name!r} never ran" + (
            f" (near names in the report: {', '.join(map(repr, near))})" if near else "")


def subject(report: Report, contract: Contract, validated: bool,
            overrides: Dict[str, object]) -> Subject:
    """``report`` read for ``contract``'s checks; a report from the reader is ``validated``
    already, one built or changed in memory is validated here."""
    if not validated:
        try:
            report.validate()
        except ReportError as error:
            return Subject(report, contract, invalid=str(error))
    named = {}
    for b in report.bricks:  # a contract's bricks are brick work: host rows are not them
        if b.kind != "host":
            named.setdefault(b.name, b)
    return Subject(report, contract, SyncMode.parse(report.sync_mode), named,
                   read_figures(report.metadata, contract, overrides), report.written)

