"""Reading a report: the JSON parse (repeated keys, overlong integers kept for the schema pass to
name) and the schema pass over it, whose rules report.py's docstring states. A leaf: report.py
builds the :class:`~torch_brickdev.profiler.report.Report` from the fields it returns and checks
in-memory reports with it."""

from __future__ import annotations

import codecs
import json
import math
import os
from dataclasses import dataclass
from typing import List, NoReturn, Optional, Tuple, Union

from ..argcheck import show_json, type_name
from ._stats import BRICK_KINDS, BrickStats, SyncMode, check_brick_fields

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


def read_source(source, func: str = "load_report", arg: str = "source") -> Tuple[object, str]:
    """The parsed JSON of a report path (or the dict itself) and the label errors start with."""
    if isinstance(source, dict):
        return source, "report"
    if not isinstance(source, (str, bytes, os.PathLike)):
        raise TypeError(f"{func}: {arg} must be a path (str or os.PathLike) or a dict, got "
                        f"{type_name(source)}")
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
_KIND = _Schema("one of " + ", ".join(map(repr, BRICK_KINDS)),
                lambda v: isinstance(v, str) and v in BRICK_KINDS)
_TEXT = _Schema("a string", lambda v: isinstance(v, str))
_OBJECT = _Schema("an object", lambda v: isinstance(v, dict))
_LIST = _Schema("an array", lambda v: isinstance(v, (list, tuple)))  # a dict source's tuple too
_SYNC_MODES = tuple(m.value for m in SyncMode)
_SYNC_MODE = _Schema("one of " + ", ".join(map(repr, _SYNC_MODES)),
                     lambda v: isinstance(v, str) and v.lower() in _SYNC_MODES)

#: Every field of a brick entry (the fields of BrickStats, in order).
BRICK_FIELDS = {
    "name": _NAME, "path": _NAME, "kind": _KIND, "device": _DEVICE_INDEX, "depth": _COUNT,
    "count": _COUNT, "total_ns": _COUNT, "min_ns": _COUNT, "max_ns": _COUNT, "last_ns": _COUNT,
    "p50_ns": _FIGURE, "p90_ns": _FIGURE, "p99_ns": _FIGURE,
}
_BRICK_OPTIONAL = {"avg_us": _FIGURE}  # derived; the contract compares it with total/count
check_brick_fields(BRICK_FIELDS, "the report schema's brick fields (BRICK_FIELDS)")


class Reader:
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
                        self.fail(path, f"has key {key!r} of type {type_name(key)}; expected string "
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
                      for key, schema in BRICK_FIELDS.items()}
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
            # why the profiled run ended early (Report.incomplete), where it did
            self.field(metadata, "incomplete", ("metadata",), _NAME, required=False)
        counters = self.field(data, "health", (), _OBJECT, required=False)
        if counters is not None:
            self.object(counters, ("health",))
            for key, value in counters.items():
                if not isinstance(key, str):
                    self.fail(("health",), f"has key {key!r} of type {type_name(key)}; expected "
                              "string keys")
                self.value(value, ("health", key), _COUNT)
        machine = self.field(data, "machine", (), _OBJECT, required=False)
        if machine is not None:
            self.free_form(machine, ("machine",))
        created = self.field(data, "created", (), _TEXT, required=False)
        torch_version = self.field(data, "torch", (), _TEXT, required=False)
        wall_s = self.field(data, "wall_s", (), _FIGURE, required=False)
        top_level_ns = self.field(data, "top_level_ns", (), _COUNT, required=False)
        span = self.field(data, "bricks_span_ns", (), _COUNT, required=False)
        bricks, bricks_avg = self.bricks(self.field(data, "bricks", (), _LIST), "bricks")
        paths, paths_avg = self.bricks(self.field(data, "paths", (), _LIST), "paths")
        return dict(bricks=bricks, paths=paths, wall_ns=wall_ns, sync_mode=mode, device=device,
                    metadata=metadata, health=counters, machine=machine, created=created,
                    torch_version=torch_version, bricks_span_ns=span,
                    written=WrittenFigures(wall_s, top_level_ns, bricks_avg, paths_avg))


def first_unwritable(data) -> Optional[str]:
    """What ``json.dumps(allow_nan=False)`` refuses, by path, for messages."""
    try:
        Reader("report").free_form(data, ())
    except ReportError as error:
        return str(error)[len("report: "):]
    return None
