"""Reports of the brick registry: JSON, a text table, and a side-by-side view with
``key_averages()`` of PyTorch's legacy profiler."""

from __future__ import annotations

import datetime
import json
import math
import os
from typing import Iterable, List, Optional, Union

import torch

from .. import _C
from ._registry import BrickStats, SyncMode, health, stats

SCHEMA = "torch_brickdev.report"
VERSION = 1

_BRICK_FIELDS = {
    "name": str, "path": str, "kind": str, "device": int, "depth": int, "count": int,
    "total_ns": int, "min_ns": int, "max_ns": int, "last_ns": int,
    "p50_ns": (int, float), "p90_ns": (int, float), "p99_ns": (int, float),
}


class ReportError(ValueError):
    """A report that cannot be read: names the file and the field."""


class Report:
    """One profiled region: every brick (by name and by call path), the wall time of the
    region, the sync mode and the device. Every figure in it is measured."""

    def __init__(self, *, bricks: List[BrickStats], paths: List[BrickStats], wall_ns: int,
                 sync_mode: SyncMode, device: dict, metadata: Optional[dict] = None,
                 health: Optional[dict] = None, created: Optional[str] = None,
                 torch_version: Optional[str] = None):
        self.bricks = list(bricks)
        self.paths = list(paths)
        self.wall_ns = int(wall_ns)
        self.sync_mode = SyncMode.parse(sync_mode)
        self.device = dict(device)
        self.metadata = dict(metadata or {})
        self.health = dict(health or {})
        self.created = created or datetime.datetime.now(datetime.timezone.utc).isoformat()
        self.torch_version = torch_version or torch.__version__

    @classmethod
    def capture(cls, *, wall_ns: int, sync_mode: Union[SyncMode, str],
                metadata: Optional[dict] = None) -> "Report":
        """Builds a report from the registry's current figures."""
        return cls(
            bricks=stats("name"), paths=stats("path"), wall_ns=wall_ns, sync_mode=sync_mode,
            device={
                "type": "brick",
                "runtime": _C._runtime_name(),
                "backing": _C._backing_device_type(),
                "count": _C._device_count(),
            },
            metadata=metadata, health=health(),
        )

    # ---- queries ----------------------------------------------------------------------------
    def brick(self, name: str) -> BrickStats:
        for b in self.bricks:
            if b.name == name:
                return b
        raise KeyError(f"brick report: no brick named {name!r}")

    def __contains__(self, name: str) -> bool:
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
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def write_json(self, path: Union[str, os.PathLike]) -> str:
        """Writes the report; returns the path. Raises OSError naming the path on failure."""
        path = os.fspath(path)
        text = self.to_json()
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as error:
            raise OSError(error.errno, f"brick report: cannot write {path!r}: {error.strerror}") from None
        return path

    # ---- text -------------------------------------------------------------------------------
    def table(self, sort_by: str = "total", row_limit: Optional[int] = None, by: str = "name") -> str:
        """A text table in the style of ``key_averages().table()``.

        ``sort_by``: ``total``, ``avg``, ``count``, ``max``, ``p99`` or ``name``; ``by``: ``name``
        or ``path`` (per call path, indented by depth).
        """
        keys = {
            "total": lambda b: -b.total_ns, "avg": lambda b: -b.avg_us(), "count": lambda b: -b.count,
            "max": lambda b: -b.max_ns, "p99": lambda b: -b.p99_ns, "name": lambda b: b.name,
        }
        if sort_by not in keys:
            raise ValueError(f"brick report: sort_by must be one of {', '.join(keys)}, got {sort_by!r}")
        if by not in ("name", "path"):
            raise ValueError(f"brick report: by must be 'name' or 'path', got {by!r}")
        rows = sorted(self.bricks, key=keys[sort_by]) if by == "name" else list(self.paths)
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
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _label(b: BrickStats, by: str) -> str:
    return b.name if by == "name" else "  " * b.depth + b.name


def _require(mapping: dict, field: str, types, where: str):
    if field not in mapping:
        raise ReportError(f"{where}: missing field {field!r}")
    value = mapping[field]
    if isinstance(value, bool) or not isinstance(value, types):
        expected = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
        raise ReportError(f"{where}: field {field!r} must be {expected}, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ReportError(f"{where}: field {field!r} must be finite, got {value}")
    return value


def _parse_bricks(items, where: str) -> List[BrickStats]:
    if not isinstance(items, list):
        raise ReportError(f"{where}: must be a list, got {type(items).__name__}")
    bricks = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise ReportError(f"{at}: must be an object, got {type(item).__name__}")
        values = {f: _require(item, f, t, at) for f, t in _BRICK_FIELDS.items()}
        for f in ("count", "total_ns", "min_ns", "max_ns", "last_ns"):
            if values[f] < 0:
                raise ReportError(f"{at}: field {f!r} must not be negative, got {values[f]}")
        if values["kind"] not in ("op", "range"):
            raise ReportError(f"{at}: field 'kind' must be 'op' or 'range', got {values['kind']!r}")
        bricks.append(BrickStats(**values))
    return bricks


def load_report(source: Union[str, os.PathLike, dict]) -> Report:
    """Reads a report written by :meth:`Report.write_json` (a path, or the parsed dict).

    Raises ReportError naming the file and the field for a malformed, truncated or
    wrong-version report."""
    where = "report"
    if isinstance(source, dict):
        data = source
    else:
        where = os.fspath(source)
        try:
            with open(where, encoding="utf-8") as f:
                data = json.load(f)
        except json.JSONDecodeError as error:
            raise ReportError(f"{where}: not valid JSON ({error.msg} at line {error.lineno}, "
                              f"column {error.colno}); is the file truncated?") from None
        except OSError as error:
            raise ReportError(f"{where}: cannot read: {error.strerror}") from None
    if not isinstance(data, dict):
        raise ReportError(f"{where}: must hold a JSON object, got {type(data).__name__}")
    if data.get("schema") != SCHEMA:
        raise ReportError(f"{where}: field 'schema' must be {SCHEMA!r}, got {data.get('schema')!r}")
    version = _require(data, "version", int, where)
    if version != VERSION:
        raise ReportError(f"{where}: field 'version' is {version}; this reader understands {VERSION}")
    mode = _require(data, "sync_mode", str, where)
    try:
        mode = SyncMode.parse(mode)
    except ValueError as error:
        raise ReportError(f"{where}: field 'sync_mode': {error}") from None
    wall_ns = _require(data, "wall_ns", int, where)
    if wall_ns < 0:
        raise ReportError(f"{where}: field 'wall_ns' must not be negative, got {wall_ns}")
    device = _require(data, "device", dict, where)
    metadata = data.get("metadata", {})
    if not isinstance(metadata, dict):
        raise ReportError(f"{where}: field 'metadata' must be an object, got {type(metadata).__name__}")
    return Report(
        bricks=_parse_bricks(_require(data, "bricks", list, where), f"{where}: bricks"),
        paths=_parse_bricks(_require(data, "paths", list, where), f"{where}: paths"),
        wall_ns=wall_ns, sync_mode=mode, device=device, metadata=metadata,
        health=data.get("health") if isinstance(data.get("health"), dict) else {},
        created=data.get("created") if isinstance(data.get("created"), str) else None,
        torch_version=data.get("torch") if isinstance(data.get("torch"), str) else None,
    )


def compare_with_key_averages(prof, report: Report, row_limit: Optional[int] = None) -> str:
    """Rows of ``prof.key_averages()`` (PyTorch's legacy profiler) beside the registry's figures
    for the same names. The legacy path truncates each event's device time to whole
    microseconds; the registry keeps nanoseconds, so short ops differ most. PyTorch also folds
    an op nested directly in an op of the same name into it, so such names count more calls
    in the registry."""
    # key_averages() may split one name into rows (with and without device time): merge them.
    legacy = {}
    for avg in prof.key_averages():
        count, total = legacy.get(avg.key, (0, 0.0))
        legacy[avg.key] = (count + avg.count, total + getattr(avg, "device_time_total", 0.0))
    rows = []
    for key, (count, legacy_total) in legacy.items():
        brick = next((b for b in report.bricks if b.name == key), None)
        rows.append((key, count, legacy_total, brick))
    rows.sort(key=lambda r: -(r[3].total_ns if r[3] else 0))
    if row_limit is not None:
        rows = rows[:row_limit]
    width = max([4] + [len(r[0]) for r in rows]) + 2
    header = (f"{'Name':<{width}}{'legacy calls':>13}{'legacy BRICK us':>17}"
              f"{'brick calls':>12}{'brick total us':>16}{'brick avg us':>14}{'diff':>8}")
    lines = ["-" * len(header), header, "-" * len(header)]
    for name, count, legacy_total, brick in rows:
        if brick is None:
            lines.append(f"{name:<{width}}{count:>13}{legacy_total:>17.1f}{'-':>12}{'-':>16}{'-':>14}{'-':>8}")
            continue
        total_us = brick.total_ns / 1e3
        diff = f"{100 * (legacy_total - total_us) / total_us:+.0f}%" if total_us else "-"
        lines.append(f"{name:<{width}}{count:>13}{legacy_total:>17.1f}{brick.count:>12}"
                     f"{total_us:>16.1f}{brick.avg_us():>14.3f}{diff:>8}")
    lines.append("-" * len(header))
    return "\n".join(lines)
