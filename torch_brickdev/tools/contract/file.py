"""Profiling contracts as data: a TOML file, read and validated once, before any report is read.

A contract names the bricks that must appear, the metadata figures its checks read (and what
each must be), and its checks, each an instance of a check *kind* with its parameters::

    [contract]
    name = "resnet-train-step"
    metadata = "train"            # figures are read from report.metadata["train"]
    bricks = ["forward", "backward", "optimizer"]

    [contract.figures]
    steps = "count"

    [[checks]]
    id = "steps"
    kind = "count"
    expect = { forward = "steps", "aten::convolution_backward" = "20 * steps" }

Every field is checked here: an unknown kind or field, a parameter of the wrong type, a formula
that does not parse or names an undeclared figure, a sync mode that does not exist. The error
(:class:`ContractError`) names the file, the line and the field. The kinds and their parameters
are listed in ``KINDS`` (and in docs/contracts.md); the checks themselves are in
:mod:`.kinds`, the formulas in :mod:`.formula`.

A contract may come from someone else: reading one is bounded in time and memory (the file's
size, how deep its tables and lists nest, what its formulas compute; linear in its checks), and
its text is quoted in messages escaped and cut.
"""

from __future__ import annotations

import bisect
import collections
import math
import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

import tomllib

from ...argcheck import type_name
from ...terminal import printable

from .formula import Formula
from .numbers import shown

__all__ = ["Check", "Contract", "ContractError", "Formula", "FIGURE_KINDS", "KINDS",
           "MAX_FILE_BYTES", "MAX_NESTING", "MODES", "builtin_path", "parse_contract",
           "read_contract"]

MODES = ("immediate", "deferred", "event")

#: The largest contract file read (a contract of 10,000 checks is about 500 KB).
MAX_FILE_BYTES = 4 << 20
#: How deep tables and lists may nest (a contract's own go 6 deep).
MAX_NESTING = 32

#: What a metadata figure may be declared as, and how the messages say it.
FIGURE_KINDS = {
    "count": "a positive integer",
    "number": "a finite number > 0",
    "series": "a list of finite numbers > 0",
    "shares": "a list of numbers in [0, 1]",
    "any": "any value",
}

_BUILTIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "contracts")


def builtin_path(name: str) -> str:
    """The path of a contract shipped with the package (``"decode"``: the decode contract)."""
    return os.path.join(_BUILTIN, f"{name}.toml")


class ContractError(ValueError):
    """A contract file that cannot be used: the message names the file, the line and the field."""


# ---- the contract ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One check of a contract: its id, kind, title, the sync modes it applies in (None: all),
    those it applies in on an asynchronous device (None: the same), and its parameters,
    validated for its kind."""

    id: str
    kind: str
    title: str
    modes: Optional[Tuple[str, ...]]
    params: Dict[str, object]
    line: int  # where the check starts in the file
    async_modes: Optional[Tuple[str, ...]] = None


@dataclass(frozen=True)
class Contract:
    name: str
    description: str
    metadata: Optional[str]  # the metadata table figures are read from (None: metadata itself)
    missing: str  # what the user does when figures are missing (said in n/a messages)
    bricks: Tuple[str, ...]  # the bricks that must appear
    figures: Dict[str, str]  # figure name -> FIGURE_KINDS key
    checks: Tuple[Check, ...]
    source: str  # the file it was read from, or "<string>"

    @property
    def check_ids(self) -> Tuple[str, ...]:
        return tuple(c.id for c in self.checks)

    def named_bricks(self) -> List[str]:
        """Every brick name the contract mentions (required bricks and the checks' bricks)."""
        names = dict.fromkeys(self.bricks)
        for check in self.checks:
            names.update(dict.fromkeys(_bricks_of(check)))
        return list(names)


def _bricks_of(check: Check) -> List[str]:
    p = check.params
    if check.kind == "count":
        return list(p["expect"])
    if check.kind == "ordering":
        return list(p["order"]) + [n for r in p["ratios"] for n in (r["above"], r["below"])]
    if check.kind == "budget":
        return list(p["limits"])
    if check.kind == "rate":
        return [p["per"]]
    return []


# Parameters of each kind: name -> (validator, default; _REQUIRED when the check must give it).
_REQUIRED = object()


def _number(lo=None, hi=None, integer=False):
    def check(value):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value) or (integer and not isinstance(value, int)):
            raise ValueError(f"expected {'an integer' if integer else 'a finite number'}, got "
                             f"{shown(value)}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise ValueError(f"expected a number in [{lo}, {hi if hi is not None else 'inf'}], "
                             f"got {shown(value)}")
        return value
    return check


def _text(value):
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {shown(value)}")
    return value


def _names(value, what="brick names"):
    if not isinstance(value, list) or not value or \
            not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"expected a non-empty list of {what} (strings), got {shown(value)}")
    duplicates = sorted(v for v, n in collections.Counter(value).items() if n > 1)
    if duplicates:
        raise ValueError(f"{_listed(duplicates)} listed twice")
    return tuple(value)


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _key(key: str) -> str:
    """A key from the file as a message names it: bare when TOML allows, else quoted (escaped
    and cut), as TOML would write it (``contract.figures.'ｓteps'``)."""
    return key if len(key) <= 60 and _BARE_KEY.fullmatch(key) else shown(key)


def _listed(texts: Sequence[str], most: int = 5, quoted: bool = True) -> str:
    """Names from the file for a message: the first few, each escaped and cut."""
    more = f" and {len(texts) - most} more" if len(texts) > most else ""
    return ", ".join(shown(t) if quoted else printable(t, limit=60) for t in texts[:most]) + more


def _modes(value):
    names = _names(value, "sync modes")
    unknown = [m for m in names if m not in MODES]
    if unknown:
        raise ValueError(f"unknown sync mode(s) {_listed(unknown)}; expected some of "
                         f"{', '.join(MODES)}")
    return names


def _expect(value):
    if not isinstance(value, dict) or not value:
        raise ValueError("expected a table of brick name = formula, e.g. "
                         "{ LmHead = \"tokens\" }, got " + shown(value))
    formulas = {name: Formula.parse(formula) for name, formula in value.items()}
    for formula in formulas.values():
        calls = formula.constant
        if calls is not None and not (calls >= 0 and calls == int(calls)):
            raise ValueError(f"formula {shown(formula.text)} is {shown(calls)}: expected a whole "
                             "number of calls >= 0")
    return formulas


def _ratios(value):
    if not isinstance(value, list):
        raise ValueError(f"expected a list of {{ above, below, factor[, modes] }} tables, got "
                         f"{shown(value)}")
    ratios = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise ValueError(f"[{i}]: expected a table {{ above, below, factor[, modes] }}, got "
                             f"{shown(item)}")
        unknown = set(item) - {"above", "below", "factor", "modes"}
        missing = {"above", "below", "factor"} - set(item)
        if unknown or missing:
            raise ValueError(f"[{i}]: " + (f"unknown field(s) [{_listed(sorted(unknown))}]"
                                          if unknown else f"missing field(s) {sorted(missing)}")
                             + "; expected above, below, factor and optionally modes")
        try:
            ratios.append({"above": _text(item["above"]), "below": _text(item["below"]),
                           "factor": _number(lo=0)(item["factor"]),
                           "modes": _modes(item["modes"]) if "modes" in item else None})
        except ValueError as error:
            raise ValueError(f"[{i}]: {error}") from None
        if item["above"] == item["below"]:  # a brick against itself: vacuous or never true
            raise ValueError(f"[{i}]: above and below are both {shown(item['above'])}; expected "
                             "two bricks")
    return tuple(ratios)


_LIMIT_FIELDS = {"avg_us", "p50_us", "p99_us", "max_us", "share"}


def _limits(value):
    if not isinstance(value, dict) or not value:
        raise ValueError("expected a table of brick name = { p50_us, p99_us, avg_us, max_us, "
                         f"share }}, got {shown(value)}")
    limits = {}
    for name, table in value.items():
        if not isinstance(table, dict) or not table:
            raise ValueError(f"{printable(name, limit=60)}: expected a table of limits such as "
                             f"{{ p99_us = 500 }}, got {shown(table)}")
        unknown = sorted(set(table) - _LIMIT_FIELDS)
        if unknown:
            raise ValueError(f"{printable(name, limit=60)}: unknown "
                             f"limit(s) [{_listed(unknown)}]; expected some of "
                             f"{sorted(_LIMIT_FIELDS)}")
        try:
            limits[name] = {k: _number(lo=0, hi=1.0 if k == "share" else None)(v)
                            for k, v in table.items()}
        except ValueError as error:
            raise ValueError(f"{printable(name, limit=60)}: {error}") from None
    return limits


def _metric(value):
    if value not in ("avg", "p50", "p90", "p99", "total"):
        raise ValueError(f"expected one of avg, p50, p90, p99, total, got {shown(value)}")
    return value


KINDS = {
    # top-level brick time / wall time in [min, max]
    # (a coverage below min that the time the machine denied the thread accounts for is
    # inconclusive: report.machine.denied_share)
    "coverage": {"min": (_number(0), _REQUIRED), "max": (_number(0), _REQUIRED)},
    # bricks run as many times as formulas over metadata figures say
    "count": {"expect": (_expect, _REQUIRED), "units": (_text, None), "explain": (_text, None),
              "show": (_names, ())},
    # a metadata rate agrees with count(per) / sum(over)
    "rate": {"rate": (_text, _REQUIRED), "per": (_text, _REQUIRED), "over": (_text, _REQUIRED),
             "tolerance": (_number(0, 1), 0.01), "unit": (_text, "token")},
    # per-call figures ordered: order[0] > order[1] > ...; above > factor x below
    # (a failure while the machine denied >= busy of the wall, with the order holding by the
    # median call, is inconclusive)
    "ordering": {"order": (_names, ()), "ratios": (_ratios, ()), "by": (_metric, "avg"),
                 "busy": (_number(0, 1), 0.05)},
    # the sync mode the run asked for (a metadata figure) is the one the profiler timed in
    "sync-mode": {"declared": (_text, None)},
    # every brick listed once with count > 0; the contract's bricks all present
    "completeness": {},
    # avg_us agrees with total_ns / count / 1000
    "avg-agreement": {"tolerance": (_number(0, 1), 0.01)},
    # coefficient of variation of a per-run series (the first present) below max_cv
    # (denied: a per-run "shares" figure; when the runs the machine descheduled by >= busy
    # explain the spread, the verdict is inconclusive)
    "stability": {"series": (lambda v: _names(v, "metadata figures"), _REQUIRED),
                  "max_cv": (_number(0), _REQUIRED), "unit": (_text, "token"),
                  "denied": (_text, None), "busy": (_number(0, 1), 0.05)},
    # every figure is a measurement: consistent min/avg/max, no constant series
    "measured": {"series": (lambda v: _names(v, "metadata figures"), ())},
    # health counters that must be 0 (and any whose name holds one of zero_matching)
    "health": {"zero": (lambda v: _names(v, "health counters"), ()),
               "zero_matching": (lambda v: _names(v, "name parts"), ("captur",))},
    # per-call and share-of-wall budgets per brick
    "budget": {"limits": (_limits, _REQUIRED)},
}
_COMMON = {"id", "kind", "title", "modes", "async_modes"}


def _coverage_rules(p: dict):
    if p["min"] > p["max"]:  # no ratio could pass
        yield "min", f"{shown(p['min'])} is above max {shown(p['max'])}; expected min <= max"


def _ordering_rules(p: dict):
    # An order of one brick, or no order and no ratios, would pass whatever the report holds.
    if len(p["order"]) == 1:
        yield "order", f"expected at least two bricks to order, got {shown(list(p['order']))}"
    elif not p["order"] and not p["ratios"]:
        yield "order", "an ordering check needs an order of two bricks or more, or ratios"


# Rules across a kind's parameters: (field, problem) for each broken one.
_KIND_RULES = {"coverage": _coverage_rules, "ordering": _ordering_rules}


# ---- reading -----------------------------------------------------------------------------------


class _Lines:
    """Finds the line of a table or a key in the TOML text (tomllib keeps no positions). Built
    in one pass, each lookup by index: a contract of many checks is read in linear time."""

    # No two parts of the pattern can match the same characters: linear on any line.
    _HEADER = re.compile(r"[ \t]*(\[\[?)([^\]]*)\]\]?[ \t\r]*(#.*)?$")

    def __init__(self, text: str):
        self.lines = text.split("\n")  # TOML's line breaks: LF and CRLF
        self.header_lines: List[int] = []  # ascending
        self.by_name: Dict[str, List[int]] = {}
        for number, line in enumerate(self.lines, 1):
            match = self._HEADER.match(line)
            if match:
                self.header_lines.append(number)
                self.by_name.setdefault(match.group(2).strip(), []).append(number)

    def table(self, name: str, index: int = 0) -> int:
        found = self.by_name.get(name, ())
        return found[index] if index < len(found) else 1

    def key(self, table_line: int, key: str) -> int:
        """The line of ``key = ...`` in the table starting at ``table_line`` (1: top level)."""
        at = bisect.bisect_left(self.header_lines, table_line)
        is_header = at < len(self.header_lines) and self.header_lines[at] == table_line
        start = table_line if is_header else 0
        after = bisect.bisect_right(self.header_lines, start)
        end = self.header_lines[after] if after < len(self.header_lines) else len(self.lines) + 1
        pattern = re.compile(rf"^\s*(\"{re.escape(key)}\"|'{re.escape(key)}'|{re.escape(key)})"
                             r"\s*[=.]")
        for number in range(start + 1, end):
            if pattern.match(self.lines[number - 1]):
                return number
        return table_line


def read_contract(path: Union[str, os.PathLike]) -> Contract:
    """Reads and validates the contract file ``path``; raises ContractError naming the file, the
    line and the field, or OSError's message for a file that cannot be read."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"read_contract: path must be a path (str or os.PathLike), got "
                        f"{type_name(path)}")
    path = os.fspath(path)
    shown_path = printable(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise ContractError(f"contract {shown_path}: cannot be read "
                            f"({error.strerror or error})") from None
    if len(data) > MAX_FILE_BYTES:
        raise ContractError(f"{shown_path}: larger than {MAX_FILE_BYTES >> 20} MiB; expected a "
                            "TOML contract (one of 10,000 checks is about 500 KB)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ContractError(f"{shown_path}: not UTF-8 text ({error.reason} at byte "
                            f"{error.start}); expected a TOML contract") from None
    return parse_contract(text, path)


def _nesting(data) -> int:
    """How deep the tables and lists of parsed TOML nest, measured without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_NESTING:
            break
        items = value.values() if isinstance(value, dict) else value
        stack.extend((item, depth + 1) for item in items if isinstance(item, (dict, list)))
    return deepest


def parse_contract(text: str, source: str = "<string>") -> Contract:
    """Validates the TOML text of a contract (``source`` names it in errors)."""
    if not isinstance(text, str):
        raise TypeError(f"parse_contract: text must be a str, got {type_name(text)}")
    if not isinstance(source, str):
        raise TypeError(f"parse_contract: source must be a str, got {type_name(source)}")
    shown_source = printable(source)
    too_deep = (f"{shown_source}: tables and lists nested too deeply; expected at most "
                f"{MAX_NESTING} levels")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ContractError(f"{shown_source}: not valid TOML: {error}") from None
    except RecursionError:  # the reader recurses per level
        raise ContractError(too_deep) from None
    if _nesting(data) > MAX_NESTING:
        raise ContractError(too_deep)
    lines = _Lines(text)

    def fail(line: int, where: str, problem: str):
        raise ContractError(f"{shown_source}:{line}: {where}: {problem}")

    unknown = sorted(set(data) - {"contract", "checks"})
    if unknown:
        fail(lines.table(unknown[0]) if lines.table(unknown[0]) > 1 else lines.key(1, unknown[0]),
             _key(unknown[0]), "unknown section; expected [contract] and "
             "[[checks]]")
    head = data.get("contract")
    if not isinstance(head, dict):
        fail(1, "[contract]", "missing; expected a [contract] table with at least a name")
    head_line = lines.table("contract")
    known = {"name", "description", "metadata", "missing", "bricks", "figures"}
    for key in head:
        if key not in known:
            fail(lines.key(head_line, key), f"contract.{_key(key)}",
                 f"unknown field; expected some of {', '.join(sorted(known))}")

    def field_of(table: dict, key: str, line: int, where: str, validate, default=_REQUIRED):
        if key not in table:
            if default is _REQUIRED:
                fail(line, where, "missing (required)")
            return default
        try:
            return validate(table[key])
        except ValueError as error:
            fail(lines.key(line, key), where, str(error))

    name = field_of(head, "name", head_line, "contract.name", _text)
    description = field_of(head, "description", head_line, "contract.description", _text, "")
    metadata = field_of(head, "metadata", head_line, "contract.metadata", _text, None)
    missing = field_of(head, "missing", head_line, "contract.missing", _text,
                       "write them into the report's metadata or pass them")
    bricks = field_of(head, "bricks", head_line, "contract.bricks", _names, ())
    figures_table = head.get("figures", {})
    figures_line = lines.table("contract.figures")
    if not isinstance(figures_table, dict):
        fail(lines.key(head_line, "figures"), "contract.figures",
             f"expected a table of figure name = kind, got {shown(figures_table)}")
    figures = {}
    for key, kind in figures_table.items():
        if not isinstance(kind, str) or kind not in FIGURE_KINDS:
            fail(lines.key(figures_line, key), f"contract.figures.{_key(key)}",
                 f"unknown kind {shown(kind)}; expected one of {', '.join(FIGURE_KINDS)}")
        figures[key] = kind

    raw_checks = data.get("checks")
    if not isinstance(raw_checks, list) or not raw_checks:
        fail(head_line, "[[checks]]", "no checks; expected at least one [[checks]] table")
    checks, seen = [], {}
    for index, raw in enumerate(raw_checks):
        line = lines.table("checks", index)
        where = f"checks[{index}]"
        if not isinstance(raw, dict):
            fail(line, where, "expected a [[checks]] table")
        check_id = field_of(raw, "id", line, f"{where}.id", _text)
        where = f"checks[{index}] (id {shown(check_id)})"
        if check_id in seen:
            fail(lines.key(line, "id"), f"{where}.id",
                 f"already the id of the check at line {seen[check_id]}")
        seen[check_id] = line
        kind = field_of(raw, "kind", line, f"{where}.kind", _text)
        if kind not in KINDS:
            fail(lines.key(line, "kind"), f"{where}.kind",
                 f"unknown kind {shown(kind)}; expected one of {', '.join(KINDS)}")
        spec = KINDS[kind]
        for key in raw:
            if key not in spec and key not in _COMMON:
                fail(lines.key(line, key), f"{where}.{_key(key)}",
                     f"unknown field for kind {kind!r}; expected some of "
                     f"{', '.join(sorted(_COMMON | set(spec)))}")
        params = {key: field_of(raw, key, line, f"{where}.{key}", validate, default)
                  for key, (validate, default) in spec.items()}
        for key, problem in _KIND_RULES.get(kind, lambda _: ())(params):
            fail(lines.key(line, key), f"{where}.{key}", problem)
        check = Check(check_id, kind, field_of(raw, "title", line, f"{where}.title", _text,
                                               check_id),
                      field_of(raw, "modes", line, f"{where}.modes", _modes, None), params, line,
                      field_of(raw, "async_modes", line, f"{where}.async_modes", _modes, None))
        _validate_figures(check, figures, lambda key, problem: fail(
            lines.key(line, key), f"{where}.{key}", problem))
        checks.append(check)
    return Contract(name, description, metadata, missing, bricks, figures, tuple(checks),
                    source)


def _validate_figures(check: Check, figures: Dict[str, str], fail) -> None:
    """Every metadata figure a check reads is declared, with a kind that fits its use."""
    def need(key: str, name: str, kinds: Sequence[str]):
        if name not in figures:
            declared = _listed(list(figures), 10, quoted=False) or "none"
            fail(key, f"reads the metadata figure {shown(name)}, which [contract.figures] does "
                      f"not declare (declared: {declared})")
        if figures[name] not in kinds:
            fail(key, f"reads {shown(name)} as {' or '.join(FIGURE_KINDS[k] for k in kinds)}, "
                      f"but [contract.figures] declares it {figures[name]!r}")
    p = check.params
    if check.kind == "count":
        for formula in p["expect"].values():
            for name in formula.names:
                need("expect", name, ("count", "number"))
        for name in p["show"]:
            need("show", name, tuple(FIGURE_KINDS))
    elif check.kind == "rate":
        need("rate", p["rate"], ("number",))
        need("over", p["over"], ("series",))
    elif check.kind == "sync-mode" and p["declared"] is not None:
        need("declared", p["declared"], tuple(FIGURE_KINDS))
    elif check.kind in ("stability", "measured"):
        for name in p["series"]:
            need("series", name, ("series",))
        if check.kind == "stability" and p["denied"] is not None:
            need("denied", p["denied"], ("shares",))
