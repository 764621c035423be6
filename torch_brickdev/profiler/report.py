"""Reports of the brick registry: JSON, a text table, and a side-by-side view with
``key_averages()`` of PyTorch's legacy profiler.

Reading a report (:func:`load_report`) is one schema pass over the parsed JSON: every problem
raises :class:`ReportError` naming the file, the field by its path (``bricks[3].count``) and
what was expected. The rules:

* required top-level fields: ``schema``, ``version``, ``sync_mode``, ``wall_ns``, ``device``,
  ``bricks``, ``paths``; optional: ``created``, ``torch`` (strings), ``metadata`` (an object),
  ``health`` (an object of counters: non-negative integers), ``wall_s`` and ``top_level_ns``
  (derived figures: a number, an integer);
* every brick entry has the thirteen fields of :class:`BrickStats` (names and paths non-empty
  text, ``kind`` ``"op"`` or ``"range"``, ``device`` >= -1, counts and nanosecond figures
  integers in [0, 2**63 - 1], percentiles finite numbers >= 0) and optionally ``avg_us`` (a
  finite number >= 0, the figure the contract compares with ``total_ns / count``);
* no NaN or Infinity anywhere (the writer never writes one), no integer of more than 400
  digits, no object repeating a key, nothing nested more than 100 levels deep;
* unknown keys, at the top level and in brick entries, are ignored (a newer writer may add
  fields); ``device`` and ``metadata`` are kept as written, unknown ``health`` counters too.

:meth:`Report.validate` applies the same rules to a report built or changed in memory.
"""

from __future__ import annotations

import codecs
import datetime
import json
import math
import os
from dataclasses import dataclass
from typing import Iterable, List, NoReturn, Optional, Tuple, Union

import torch

from .. import _C
from ._kineto import is_brick_activity
from ..argcheck import show_json
from ._registry import health
from ._stats import BrickStats, SyncMode

SCHEMA = "torch_brickdev.report"
VERSION = 1

_INT64_MAX = 2**63 - 1
# Integers of free-form sections (metadata, device) stay below 10**400: past float range, no
# consumer can do arithmetic with them, and json refuses to write ints of > 4300 digits.
_MAX_DIGITS = 400
_MAX_NESTING = 100  # far deeper than any report; bounds the walk of a dict with a cycle


class ReportError(ValueError):
    """A report that cannot be read (or breaks the rules a reader applies): names the file, or
    ``Report`` for one in memory, and the field."""


@dataclass(frozen=True)
class WrittenFigures:
    """The derived figures of a report file as written there (None where the file has none):
    what a consumer of the file reads, to compare with what they derive from."""

    wall_s: Optional[float]  # wall_ns / 1e9
    top_level_ns: Optional[int]  # Report.top_level_ns()
    bricks_avg_us: Tuple[Optional[float], ...]  # per entry of ``bricks``: BrickStats.avg_us()
    paths_avg_us: Tuple[Optional[float], ...]  # per entry of ``paths``


class Report:
    """One profiled region: every brick (by name and by call path), the wall time of the
    region, the sync mode and the device. Every figure in it is measured.

    ``written``: the derived figures as the file :func:`load_report` read held them (None for a
    report built in memory)."""

    def __init__(self, *, bricks: List[BrickStats], paths: List[BrickStats], wall_ns: int,
                 sync_mode: SyncMode, device: dict, metadata: Optional[dict] = None,
                 health: Optional[dict] = None, created: Optional[str] = None,
                 torch_version: Optional[str] = None, written: Optional[WrittenFigures] = None):
        self.bricks = _brick_list(bricks, "bricks")
        self.paths = _brick_list(paths, "paths")
        if isinstance(wall_ns, bool) or not isinstance(wall_ns, int):
            raise TypeError(f"Report: wall_ns must be an int (nanoseconds), got {_type(wall_ns)}")
        if wall_ns < 0:
            raise ValueError(f"Report: wall_ns must be >= 0 (nanoseconds), got {wall_ns}")
        self.wall_ns = int(wall_ns)
        if not isinstance(sync_mode, (SyncMode, str)):  # worded as for the other arguments
            modes = ", ".join(repr(m.value) for m in SyncMode)
            raise TypeError(f"Report: sync_mode must be a SyncMode or a str ({modes}), got "
                            f"{_type(sync_mode)}")
        self.sync_mode = SyncMode.parse(sync_mode, arg="sync_mode", where="Report")
        for name, value, optional in (("device", device, False), ("metadata", metadata, True),
                                      ("health", health, True)):
            if not isinstance(value, dict) and not (optional and value is None):
                expected = "a dict or None" if optional else "a dict"
                raise TypeError(f"Report: {name} must be {expected}, got {_type(value)}")
        for name, value in (("created", created), ("torch_version", torch_version)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"Report: {name} must be a str or None, got {_type(value)}")
        if written is not None and not isinstance(written, WrittenFigures):
            raise TypeError(f"Report: written must be a WrittenFigures or None, got "
                            f"{_type(written)}")
        self.device = dict(device)
        self.metadata = dict(metadata or {})
        self.health = dict(health or {})
        self.created = created or datetime.datetime.now(datetime.timezone.utc).isoformat()
        self.torch_version = torch_version or torch.__version__
        self.written = written

    @classmethod
    def capture(cls, *, wall_ns: int, sync_mode: Union[SyncMode, str],
                metadata: Optional[dict] = None) -> "Report":
        """Builds a report from the registry's current figures: one snapshot, from which both
        views derive, so that they agree even while other threads record."""
        views = _C._profiler.snapshot(["name", "path"])
        return cls(
            bricks=[BrickStats(**d) for d in views["name"]],
            paths=[BrickStats(**d) for d in views["path"]], wall_ns=wall_ns, sync_mode=sync_mode,
            device={
                "type": "brick",
                "runtime": _C._runtime_name(),
                "backing": _C._backing_device_type(),
                "count": _C._device_count(),
            },
            metadata=metadata, health=health(),
        )

    def with_metadata(self, **entries) -> "Report":
        """A copy of this report whose metadata also holds ``entries``, e.g. figures known only
        once the profiled region has ended (``report.with_metadata(decode={...})``)."""
        return Report(bricks=self.bricks, paths=self.paths, wall_ns=self.wall_ns,
                      sync_mode=self.sync_mode, device=self.device,
                      metadata={**self.metadata, **entries}, health=self.health,
                      created=self.created, torch_version=self.torch_version,
                      written=self.written)

    def validate(self) -> "Report":
        """Checks this report, built or changed in memory, by the rules :func:`load_report`
        applies to a file (see the module documentation); returns it. Raises ReportError naming
        the field, e.g. ``Report: bricks[3].total_ns: field 'total_ns' must be an integer ...``."""
        def entry(b):  # a BrickStats as the reader sees an entry; anything else as it is
            return {k: getattr(b, k) for k in _BRICK_FIELDS} if isinstance(b, BrickStats) else b

        def entries(items):
            return [entry(b) for b in items] if isinstance(items, (list, tuple)) else items

        mode = self.sync_mode.value if isinstance(self.sync_mode, SyncMode) else self.sync_mode
        _Reader("Report").fields({
            "schema": SCHEMA, "version": VERSION, "sync_mode": mode, "wall_ns": self.wall_ns,
            "device": self.device, "metadata": self.metadata, "health": self.health,
            "created": self.created, "torch": self.torch_version,
            "bricks": entries(self.bricks), "paths": entries(self.paths),
        })
        return self

    # ---- queries ----------------------------------------------------------------------------
    def brick(self, name: str) -> BrickStats:
        _check_str(name, "Report.brick", "name")
        for b in self.bricks:
            if b.name == name:
                return b
        raise KeyError(f"brick report: no brick named {name!r}")

    def __contains__(self, name: str) -> bool:
        _check_str(name, "Report.__contains__", "name")
        return any(b.name == name for b in self.bricks)

    def top_level_ns(self) -> int:
        """Total time of the bricks that have no parent brick (nothing counted twice)."""
        return sum(p.total_ns for p in self.paths if p.depth == 0)

    # ---- JSON -------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "version": VERSION,
            "created": self.created,
            "torch": self.torch_version,
            "sync_mode": self.sync_mode.value,
            "device": self.device,
            "wall_ns": self.wall_ns,
            "wall_s": self.wall_ns / 1e9,
            "top_level_ns": self.top_level_ns(),
            "metadata": self.metadata,
            "health": self.health,
            "bricks": [b.to_dict() for b in self.bricks],
            "paths": [p.to_dict() for p in self.paths],
        }

    def to_json(self, indent: Optional[int] = 2) -> str:
        """The report as JSON text. Raises ValueError (NaN, Infinity) or TypeError (a value JSON
        cannot hold) naming the field, e.g. ``metadata.decode.tokens_per_s``."""
        if indent is not None and (isinstance(indent, bool) or not isinstance(indent, int)):
            raise TypeError(f"Report.to_json: indent must be an int or None, got {_type(indent)}")
        if indent is not None and indent < 0:
            raise ValueError(f"Report.to_json: indent must be >= 0 or None, got {indent}")
        data = self.to_dict()
        try:
            return json.dumps(data, indent=indent, allow_nan=False)
        except (TypeError, ValueError) as error:
            # json names neither the field nor the value: find it, to say which one.
            detail = _first_unwritable(data) or str(error)
            raise type(error)(f"brick report: cannot write the report as JSON: {detail}") from None

    def write_json(self, path: Union[str, os.PathLike]) -> str:
        """Writes the report; returns the path. Raises OSError naming the path on failure."""
        if not isinstance(path, (str, bytes, os.PathLike)):
            raise TypeError(f"Report.write_json: path must be a str or os.PathLike, got "
                            f"{_type(path)}")
        path = os.fspath(path)
        if not path:
            raise ValueError("Report.write_json: path must not be empty")
        if ("\0" if isinstance(path, str) else b"\0") in path:
            raise ValueError(f"Report.write_json: path {path!r} contains a NUL character")
        text = self.to_json()
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as error:
            raise OSError(error.errno, f"brick report: cannot write {os.fsdecode(path)!r}: "
                          f"{error.strerror}") from None
        return os.fsdecode(path) if isinstance(path, bytes) else path

    # ---- text -------------------------------------------------------------------------------
    def table(self, sort_by: str = "total", row_limit: Optional[int] = None, by: str = "name") -> str:
        """A text table in the style of ``key_averages().table()``.

        ``sort_by``: ``total``, ``avg``, ``count``, ``max``, ``p99`` or ``name``; ``by``: ``name``
        or ``path`` (per call path, indented by depth); ``row_limit``: the first rows only (None:
        every row).
        """
        keys = {
            "total": lambda b: -b.total_ns, "avg": lambda b: -b.avg_us(), "count": lambda b: -b.count,
            "max": lambda b: -b.max_ns, "p99": lambda b: -b.p99_ns, "name": lambda b: b.name,
        }
        _check_str(sort_by, "Report.table", "sort_by")
        if sort_by not in keys:
            raise ValueError(f"brick report: sort_by must be one of {', '.join(keys)}, got {sort_by!r}")
        _check_str(by, "Report.table", "by")
        if by not in ("name", "path"):
            raise ValueError(f"brick report: by must be 'name' or 'path', got {by!r}")
        _check_row_limit(row_limit, "Report.table")
        rows = (sorted(self.bricks, key=keys[sort_by]) if by == "name"
                else _tree_order(self.paths, keys[sort_by]))
        if row_limit is not None:
            rows = rows[:row_limit]
        label = "Name" if by == "name" else "Path"
        width = max([len(label)] + [len(_label(b, by)) for b in rows]) + 2
        header = (f"{label:<{width}}{'Kind':>6}{'Calls':>9}{'Total ms':>12}{'Avg us':>11}"
                  f"{'Min us':>11}{'Max us':>11}{'P50 us':>11}{'P99 us':>11}{'% wall':>8}")
        rule = "-" * len(header)
        lines = [rule, header, rule]
        wall = self.wall_ns or 1
        for b in rows:
            lines.append(
                f"{_label(b, by):<{width}}{b.kind:>6}{b.count:>9}{b.total_ns / 1e6:>12.3f}"
                f"{b.avg_us():>11.3f}{b.min_ns / 1e3:>11.3f}{b.max_ns / 1e3:>11.3f}"
                f"{b.p50_ns / 1e3:>11.3f}{b.p99_ns / 1e3:>11.3f}{100 * b.total_ns / wall:>7.1f}%"
            )
        lines.append(rule)
        lines.append(
            f"sync mode: {self.sync_mode.value}; wall time: {self.wall_ns / 1e6:.3f} ms; "
            f"top-level brick time: {self.top_level_ns() / 1e6:.3f} ms; {len(self.bricks)} bricks"
        )
        lines.append("calls: every call on every thread, a call nested in a call of the same "
                     "name included (key_averages() folds it into its parent)")
        lines.extend(_collective_lines(self.metadata.get("collectives")))
        # What the profiler could not time is said, never left to be noticed.
        missed = {
            "capture_skipped": "bricks skipped: their stream was being captured into a CUDA graph",
            "timing_failures": "bricks dropped: a device call failed while timing them",
            "unbalanced_exits": "exits without an open brick (started before profiling)",
        }
        for key, meaning in missed.items():
            value = self.health.get(key, 0)
            if value:
                lines.append(f"warning: {value} {meaning} ({key})")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _collective_lines(collectives) -> List[str]:
    """The collectives of brick's c10d backend in the region: per kind, calls, bytes this rank
    contributed, group size, time in the collective (enqueue to completion) and bytes over that
    time (algorithm bandwidth)."""
    if not isinstance(collectives, dict) or not collectives:
        return []
    lines = ["collectives (brick's c10d backend; time: enqueue to completion, summed over calls):"]
    for name, c in sorted(collectives.items()):
        if not isinstance(c, dict):
            continue
        line = (f"  {name}: {c.get('calls', 0)} calls, {c.get('bytes', 0) / 2**20:.3f} MiB, "
                f"group size {c.get('group_size', 0)}")
        time_ns, timed = c.get("time_ns"), c.get("timed_calls")
        if isinstance(time_ns, int) and isinstance(timed, int) and timed > 0 and time_ns > 0:
            line += f", {time_ns / 1e6:.3f} ms in the collective"
            if timed == c.get("calls"):
                line += f", {c.get('bytes', 0) / time_ns:.3f} GB/s"
            else:
                line += f" ({timed} of the calls timed)"
        lines.append(line)
    return lines


def _tree_order(paths, sibling_key) -> list:
    """Call paths as a tree: each path right after its parent, siblings ordered by
    ``sibling_key`` (a path whose parent is not listed is a root)."""
    listed = {b.path for b in paths}
    children = {}
    for b in paths:
        parent = b.path.rsplit("/", 1)[0] if "/" in b.path else None
        children.setdefault(parent if parent in listed else None, []).append(b)
    ordered, stack = [], sorted(children.get(None, []), key=sibling_key)[::-1]
    while stack:
        b = stack.pop()
        ordered.append(b)
        stack.extend(sorted(children.get(b.path, []), key=sibling_key)[::-1])
    return ordered


def _label(b: BrickStats, by: str) -> str:
    return b.name if by == "name" else "  " * b.depth + b.name


# ---- argument checks --------------------------------------------------------------------------


def _type(value) -> str:
    return type(value).__name__


def _check_str(value, func: str, arg: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{func}: {arg} must be a str, got {_type(value)}")


def _check_row_limit(row_limit, func: str) -> None:
    if row_limit is None:
        return
    if isinstance(row_limit, bool) or not isinstance(row_limit, int):
        raise TypeError(f"{func}: row_limit must be an int >= 0 or None, got {_type(row_limit)}")
    if row_limit < 0:  # rows[:-1] would silently drop the last row
        raise ValueError(f"{func}: row_limit must be >= 0 (None for every row), got {row_limit}")


def _brick_list(items, arg: str) -> List[BrickStats]:
    # A str, bytes or dict is iterable too, but never a list of bricks.
    if isinstance(items, (str, bytes, dict)) or not isinstance(items, Iterable):
        raise TypeError(f"Report: {arg} must be a list of BrickStats, got {_type(items)}")
    out = list(items)
    for i, item in enumerate(out):
        if not isinstance(item, BrickStats):
            raise TypeError(f"Report: {arg}[{i}] must be a BrickStats, got {_type(item)}")
    return out


# ---- reading: parsing the text ----------------------------------------------------------------


class _RepeatedKeys(dict):
    """A JSON object that repeated a key. json keeps the last value without a word; the schema
    pass rejects it, naming the object's path (the parser cannot know it)."""

    repeated: Tuple[str, ...] = ()


class _LongInteger:
    """An integer literal of more than ``_MAX_DIGITS`` digits, kept unparsed: converting it is
    slow (quadratic) and may exceed Python's int/str limit; the schema pass rejects it."""

    def __init__(self, text: str):
        self.digits = len(text.lstrip("-"))


def _object_from_pairs(pairs):
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen, repeated = set(), []
        for key, _ in pairs:
            if key in seen and key not in repeated:
                repeated.append(key)
            seen.add(key)
        obj = _RepeatedKeys(obj)
        obj.repeated = tuple(repeated)
    return obj


def _parse_int(text: str):
    return _LongInteger(text) if len(text) > _MAX_DIGITS + 1 else int(text)


def _read_source(source, func: str = "load_report", arg: str = "source") -> Tuple[object, str]:
    """The parsed JSON of a report path (or the dict itself) and the label errors start with."""
    if isinstance(source, dict):
        return source, "report"
    if not isinstance(source, (str, bytes, os.PathLike)):
        raise TypeError(f"{func}: {arg} must be a path (str or os.PathLike) or a dict, got "
                        f"{_type(source)}")
    path = os.fspath(source)
    where = os.fsdecode(path)
    if not path:
        raise ReportError(f"{func}: {arg} is an empty path; expected a report file")
    if ("\0" if isinstance(path, str) else b"\0") in path:
        raise ReportError(f"{func}: {arg} {where!r} contains a NUL character; expected a path")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as error:
        raise ReportError(f"{where}: cannot read: {error.strerror or error}") from None
    if not raw.strip():
        raise ReportError(f"{where}: the file is empty; expected a JSON report object")
    if raw.startswith(codecs.BOM_UTF8):  # a byte-order mark is harmless
        raw = raw[len(codecs.BOM_UTF8):]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ReportError(f"{where}: not UTF-8 text (byte 0x{raw[error.start]:02x} at offset "
                          f"{error.start}); expected a JSON report written by Report.write_json"
                          ) from None
    try:
        data = json.loads(text, object_pairs_hook=_object_from_pairs, parse_int=_parse_int)
    except json.JSONDecodeError as error:
        raise ReportError(f"{where}: not valid JSON ({error.msg} at line {error.lineno}, "
                          f"column {error.colno}): expected a report as Report.write_json "
                          "writes it; is the file truncated?") from None
    except RecursionError:
        raise ReportError(f"{where}: JSON nested too deeply to parse: expected a report (a few "
                          "levels deep)") from None
    return data, where


# ---- reading: the schema pass -----------------------------------------------------------------

_Path = Tuple[Union[str, int], ...]


def _path_text(path: _Path) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out


def _show(value) -> str:
    """A value as the message shows it: its JSON type, and the value when short."""
    if isinstance(value, _LongInteger):
        return f"integer of {value.digits} digits"
    return show_json(value)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Schema:
    """Rules for one value: ``problem(value)`` returns what was expected, or None when the value
    is fine."""

    def __init__(self, expected: str, accept):
        self.expected, self._accept = expected, accept

    def problem(self, value) -> Optional[str]:
        return None if self._accept(value) else self.expected


def _integer(minimum: int) -> _Schema:
    return _Schema(f"an integer >= {minimum} (at most 2**63 - 1)",
                   lambda v: _is_int(v) and minimum <= v <= _INT64_MAX)


def _valid_text(value: str) -> bool:
    try:
        value.encode("utf-8")  # a lone surrogate (JSON "\ud800") cannot be printed or written
    except UnicodeEncodeError:
        return False
    return True


_COUNT = _integer(0)
_DEVICE_INDEX = _integer(-1)  # -1: recorded on several devices
_FIGURE = _Schema("a finite number >= 0",
                  lambda v: _is_number(v) and (_is_int(v) and 0 <= v <= _INT64_MAX
                                               or isinstance(v, float) and 0 <= v < math.inf))
_NAME = _Schema("a non-empty string of valid Unicode",
                lambda v: isinstance(v, str) and v != "" and _valid_text(v))
_KIND = _Schema("'op' or 'range'", lambda v: isinstance(v, str) and v in ("op", "range"))
_TEXT = _Schema("a string", lambda v: isinstance(v, str))
_OBJECT = _Schema("an object", lambda v: isinstance(v, dict))
_LIST = _Schema("an array", lambda v: isinstance(v, (list, tuple)))  # a dict source's tuple too
_SYNC_MODES = tuple(m.value for m in SyncMode)
_SYNC_MODE = _Schema("one of " + ", ".join(map(repr, _SYNC_MODES)),
                     lambda v: isinstance(v, str) and v.lower() in _SYNC_MODES)

#: Every field of a brick entry (the fields of BrickStats, in order).
_BRICK_FIELDS = {
    "name": _NAME, "path": _NAME, "kind": _KIND, "device": _DEVICE_INDEX, "depth": _COUNT,
    "count": _COUNT, "total_ns": _COUNT, "min_ns": _COUNT, "max_ns": _COUNT, "last_ns": _COUNT,
    "p50_ns": _FIGURE, "p90_ns": _FIGURE, "p99_ns": _FIGURE,
}
_BRICK_OPTIONAL = {"avg_us": _FIGURE}  # derived; the contract compares it with total/count
assert tuple(_BRICK_FIELDS) == tuple(BrickStats.__dataclass_fields__)


class _Reader:
    """The schema pass over one parsed report; every error names ``where`` and the path."""

    def __init__(self, where: str):
        self.where = where
        self._seen = set()  # ids of the containers free_form() has walked

    def fail(self, path: _Path, problem: str) -> NoReturn:
        if not path:
            subject = "the report"
        elif isinstance(path[-1], str):
            key = f"field {path[-1]!r}"
            subject = key if len(path) == 1 else f"{_path_text(path)}: {key}"
        else:
            subject = _path_text(path)
        raise ReportError(f"{self.where}: {subject} {problem}")

    def value(self, value, path: _Path, schema: _Schema):
        expected = schema.problem(value)
        if expected is not None:
            self.fail(path, f"must be {expected}, got {_show(value)}")
        return value

    def object(self, value, path: _Path) -> dict:
        self.value(value, path, _OBJECT)
        if isinstance(value, _RepeatedKeys):
            self.fail(path, f"repeats key(s) {', '.join(map(repr, value.repeated))}; expected "
                      "each key once (JSON readers disagree on which value wins)")
        return value

    def field(self, obj: dict, key: str, path: _Path, schema: _Schema, required: bool = True):
        if key not in obj:
            if required:
                self.fail(path + (key,), f"is missing; expected {schema.expected}")
            return None
        return self.value(obj[key], path + (key,), schema)

    def free_form(self, value, path: _Path, depth: int = 0, ancestors: Tuple[int, ...] = ()):
        """Any JSON value (metadata, device): finite numbers, string keys, no repeated keys,
        bounded nesting. Containers of a dict source may be shared (walked once each: ``seen``
        is kept on the reader) or even cyclic (rejected)."""
        if depth > _MAX_NESTING:
            self.fail(path, f"is nested more than {_MAX_NESTING} levels deep; expected plain "
                      "JSON data")
        if isinstance(value, (dict, list, tuple)):
            if id(value) in ancestors:
                self.fail(path, "contains itself; expected plain JSON data")
            if id(value) in self._seen:
                return
            self._seen.add(id(value))
            inner = ancestors + (id(value),)
            if isinstance(value, dict):
                self.object(value, path)
                for key, item in value.items():
                    if not isinstance(key, str):
                        self.fail(path, f"has key {key!r} of type {_type(key)}; expected string "
                                  "keys (JSON object keys are strings)")
                    self.free_form(item, path + (key,), depth + 1, inner)
            else:
                for i, item in enumerate(value):
                    self.free_form(item, path + (i,), depth + 1, inner)
        elif isinstance(value, float):
            if not math.isfinite(value):
                self.fail(path, f"must be a finite number, got {_show(value)} (JSON has no NaN "
                          "or Infinity; the writer never writes one)")
        elif isinstance(value, int) and not isinstance(value, bool):
            if abs(value) >= 10**_MAX_DIGITS:
                self.fail(path, f"must be an integer of at most {_MAX_DIGITS} digits, got "
                          f"{_show(value)}")
        elif not (value is None or isinstance(value, (str, bool))):
            self.fail(path, f"must be a JSON value, got {_show(value)}")

    def bricks(self, items, section: str) -> Tuple[List[BrickStats], Tuple[Optional[float], ...]]:
        """The entries of ``bricks`` or ``paths``, and the ``avg_us`` figures as written."""
        self.value(items, (section,), _LIST)
        bricks, written_avg = [], []
        for i, item in enumerate(items):
            path = (section, i)
            self.object(item, path)
            values = {key: self.field(item, key, path, schema)
                      for key, schema in _BRICK_FIELDS.items()}
            written_avg.append(self.field(item, "avg_us", path, _BRICK_OPTIONAL["avg_us"],
                                          required=False))
            bricks.append(BrickStats(**values))
        return bricks, tuple(written_avg)

    def fields(self, data) -> dict:
        """The arguments of the Report that ``data`` holds, the derived figures as written
        (``avg_us`` per entry, ``wall_s``, ``top_level_ns``) among them."""
        if not isinstance(data, dict):
            raise ReportError(f"{self.where}: must hold a JSON object (a report), got "
                              f"{_show(data)}")
        self.object(data, ())
        schema = data.get("schema")
        if schema != SCHEMA:
            self.fail(("schema",), f"must be {SCHEMA!r}, got "
                      f"{'nothing' if 'schema' not in data else _show(schema)}")
        version = self.field(data, "version", (), _COUNT)
        if version != VERSION:
            self.fail(("version",), f"is {version}; this reader understands version {VERSION}")
        mode = SyncMode.parse(self.field(data, "sync_mode", (), _SYNC_MODE))
        wall_ns = self.field(data, "wall_ns", (), _COUNT)
        device = self.field(data, "device", (), _OBJECT)
        self.free_form(device, ("device",))
        metadata = self.field(data, "metadata", (), _OBJECT, required=False)
        if metadata is not None:
            self.free_form(metadata, ("metadata",))
        counters = self.field(data, "health", (), _OBJECT, required=False)
        if counters is not None:
            self.object(counters, ("health",))
            for key, value in counters.items():
                if not isinstance(key, str):
                    self.fail(("health",), f"has key {key!r} of type {_type(key)}; expected "
                              "string keys")
                self.value(value, ("health", key), _COUNT)
        created = self.field(data, "created", (), _TEXT, required=False)
        torch_version = self.field(data, "torch", (), _TEXT, required=False)
        wall_s = self.field(data, "wall_s", (), _FIGURE, required=False)
        top_level_ns = self.field(data, "top_level_ns", (), _COUNT, required=False)
        bricks, bricks_avg = self.bricks(self.field(data, "bricks", (), _LIST), "bricks")
        paths, paths_avg = self.bricks(self.field(data, "paths", (), _LIST), "paths")
        return dict(bricks=bricks, paths=paths, wall_ns=wall_ns, sync_mode=mode, device=device,
                    metadata=metadata, health=counters, created=created,
                    torch_version=torch_version,
                    written=WrittenFigures(wall_s, top_level_ns, bricks_avg, paths_avg))


def load_report(source: Union[str, os.PathLike, dict], *, where: str = "load_report",
                arg: str = "source") -> Report:
    """Reads a report written by :meth:`Report.write_json` (a path, or the parsed dict); its
    :attr:`Report.written` holds the derived figures as written.

    Raises ReportError naming the file and the field (``bricks[3].count``) and what was expected
    for a malformed, truncated or wrong-version report (the rules are in the module
    documentation), TypeError when ``source`` is neither a path nor a dict. ``where`` and
    ``arg`` name the caller's function and argument in the messages about ``source`` itself."""
    data, label = _read_source(source, where, arg)
    return Report(**_Reader(label).fields(data))


def _first_unwritable(data) -> Optional[str]:
    """What ``json.dumps(allow_nan=False)`` refuses, by path, for messages."""
    try:
        _Reader("report").free_form(data, ())
    except ReportError as error:
        return str(error)[len("report: "):]
    return None


def folded_by_pytorch(report: Report) -> dict:
    """Calls per name that PyTorch's profilers fold away: ``key_averages()`` (through
    ``EventList``) drops an op whose parent has the same name and no other child, lifting its
    device time into the parent (``aten::div_`` calling ``aten::div_``, ``aten::mul`` calling
    ``aten::mul``). The registry counts every call, so for such a name its count is PyTorch's
    plus these. Read from the report's call paths: a path whose parent path has this one child
    path and the same name."""
    if not isinstance(report, Report):
        raise TypeError(f"folded_by_pytorch: report must be a Report, got {_type(report)}")
    children = {}
    for p in report.paths:
        parent, _, _ = p.path.rpartition("/")
        children.setdefault(parent, []).append(p)
    folded = {}
    for parent, kids in children.items():
        if len(kids) == 1 and parent and parent.rpartition("/")[2] == kids[0].name:
            folded[kids[0].name] = folded.get(kids[0].name, 0) + kids[0].count
    return folded


def compare_with_key_averages(prof, report: Report, row_limit: Optional[int] = None) -> str:
    """Rows of ``prof.key_averages()`` (PyTorch's legacy profiler or ``torch.profiler``) beside
    the registry's figures for the same names.

    How the counts relate. The registry counts every call of every op and range, on every
    thread, nested same-name calls included. PyTorch's ``key_averages()`` differs in three ways,
    all accounted for here:

    * it splits one name into two rows, the calls whose device time truncates to 0 us and the
      others (``is_legacy``; the legacy path reads device time in whole microseconds): the rows
      are merged;
    * it folds a call nested alone in a call of the same name into it: the ``folded`` column
      (:func:`folded_by_pytorch`), so ``brick calls - folded == torch calls``;
    * it sees only threads that carry its thread-local state: work PyTorch's autograd engine
      runs on its device threads outside a graph task's state (e.g. buffers it allocates during
      ``backward()``) is in the registry only, and shows as a difference left over.

    The legacy path truncates each event's device time to whole microseconds; the registry keeps
    nanoseconds, so short ops differ most in time. The rows brick's torch.profiler plugin adds
    (``brick::`` device activities, launches) are left out: their time is in their ops' rows.
    ``row_limit``: the first rows only (None: every row)."""
    if not callable(getattr(prof, "key_averages", None)):
        raise TypeError(f"compare_with_key_averages: prof must be a profiler with key_averages() "
                        f"(torch.profiler.profile or torch.autograd.profiler.profile), got "
                        f"{_type(prof)}")
    if not isinstance(report, Report):
        raise TypeError(f"compare_with_key_averages: report must be a Report, got {_type(report)}")
    _check_row_limit(row_limit, "compare_with_key_averages")
    # key_averages() may split one name into rows (with and without device time): merge them.
    legacy = {}
    for avg in prof.key_averages():
        if is_brick_activity(avg.key):
            continue
        count, total = legacy.get(avg.key, (0, 0.0))
        legacy[avg.key] = (count + avg.count, total + getattr(avg, "device_time_total", 0.0))
    folded = folded_by_pytorch(report)
    rows = []
    for key, (count, legacy_total) in legacy.items():
        brick = next((b for b in report.bricks if b.name == key), None)
        rows.append((key, count, legacy_total, brick))
    rows.sort(key=lambda r: -(r[3].total_ns if r[3] else 0))
    if row_limit is not None:
        rows = rows[:row_limit]
    width = max([4] + [len(r[0]) for r in rows]) + 2
    header = (f"{'Name':<{width}}{'torch calls':>13}{'torch BRICK us':>17}"
              f"{'brick calls':>12}{'folded':>8}{'brick total us':>16}{'brick avg us':>14}"
              f"{'diff':>8}")
    lines = ["-" * len(header), header, "-" * len(header)]
    for name, count, legacy_total, brick in rows:
        if brick is None:
            lines.append(f"{name:<{width}}{count:>13}{legacy_total:>17.1f}{'-':>12}{'-':>8}"
                         f"{'-':>16}{'-':>14}{'-':>8}")
            continue
        total_us = brick.total_ns / 1e3
        diff = f"{100 * (legacy_total - total_us) / total_us:+.0f}%" if total_us else "-"
        lines.append(f"{name:<{width}}{count:>13}{legacy_total:>17.1f}{brick.count:>12}"
                     f"{folded.get(name, 0):>8}{total_us:>16.1f}{brick.avg_us():>14.3f}{diff:>8}")
    lines.append("-" * len(header))
    lines.append("calls: brick counts every call on every thread; torch calls + folded == brick "
                 "calls, except work only the registry's global callback sees (autograd device "
                 "threads outside a graph task)")
    return "\n".join(lines)
