"""Reports of the brick registry: the report, its JSON and its text tables (the side-by-side
view with PyTorch's ``key_averages()`` is :mod:`.report_key_averages`).

Reading a report (:func:`load_report`) is one schema pass over the parsed JSON: every problem
raises :class:`ReportError` naming the file, the field by its path (``bricks[3].count``) and
what was expected. The rules:

* required top-level fields: ``schema``, ``version``, ``sync_mode``, ``wall_ns``, ``device``,
  ``bricks``, ``paths``; optional: ``created``, ``torch`` (strings), ``metadata`` (an object),
  ``health`` (an object of counters: non-negative integers), ``machine`` (an object: what the
  machine denied the region, see :mod:`.machine`), ``bricks_span_ns`` (an integer: from the
  first brick's start to the last one's end, within ``wall_ns`` as the profiler writes it),
  ``wall_s`` and ``top_level_ns`` (derived figures: a number, an integer);
* every brick entry has the thirteen fields of :class:`BrickStats` (names and paths non-empty
  text, ``kind`` ``"op"``, ``"range"`` or ``"host"``, ``device`` >= -1, counts and nanosecond figures
  integers in [0, 2**63 - 1], percentiles finite numbers >= 0) and optionally ``avg_us`` (a
  finite number >= 0, the figure the contract compares with ``total_ns / count``);
* ``metadata.incomplete``, where present, is a non-empty string: why the profiled run ended early
  (e.g. ``python -m torch_brickdev profile`` of a script that raised or was interrupted);
* no NaN or Infinity anywhere (the writer never writes one), no integer of more than 400
  digits, no object repeating a key, nothing nested more than 100 levels deep;
* unknown keys, at the top level and in brick entries, are ignored (a newer writer may add
  fields); ``device``, ``metadata`` and ``machine`` are kept as written, unknown ``health`` counters too.

:meth:`Report.validate` applies the same rules to a report built or changed in memory.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from typing import TYPE_CHECKING, Iterable, List, Optional, Tuple, Union

from ..argcheck import check_bool, check_str, type_name
from ..terminal import printable
from ._report_schema import (BRICK_FIELDS, SCHEMA, VERSION, ReportError, WrittenFigures,
                             first_unwritable, read_source, Reader)
from ._stats import BrickStats, SyncMode
from ._table_text import Column, Table, fitting_width

# Reading a report needs neither torch nor the native module (the command line's JSON commands):
# what does is imported where it is used.
if TYPE_CHECKING:
    from . import roofline as _roofline
    from . import shapes

__all__ = ["Report", "ReportError", "WrittenFigures", "load_report", "SCHEMA", "VERSION"]


def _entries(view: str, doc: str) -> property:
    """A report's BrickStats of one view (``bricks`` or ``paths``). Report.capture keeps the
    snapshot's rows, made into BrickStats when first read; a list set is kept as given (the
    constructor checks its argument, validate() a changed report)."""
    entries, rows = f"_{view}", f"_{view}_rows"

    def read(self) -> List[BrickStats]:
        if getattr(self, entries) is None:
            setattr(self, entries, [BrickStats(*row) for row in getattr(self, rows)])
            setattr(self, rows, None)
        return getattr(self, entries)

    def write(self, items) -> None:
        setattr(self, entries, items)
        setattr(self, rows, None)

    return property(read, write, doc=doc)


_device_entry_of = (-1, {})  # (process id, the report's "device" entry read in it)


def _device_entry() -> dict:
    """The report's ``device`` entry. Fixed for a process once brick is initialised (a forked
    child gets a runtime of its own): read once per process id."""
    global _device_entry_of
    if _device_entry_of[0] != os.getpid():
        from .. import _C

        _device_entry_of = (os.getpid(), {
            "type": "brick",
            "runtime": _C._runtime_name(),
            "asynchronous": _C._runtime_asynchronous(),
            "backing": _C._backing_device_type(),
            "count": _C._device_count(),
        })
    return dict(_device_entry_of[1])


class Report:
    """One profiled region: every brick (by name and by call path), the wall time of the
    region, the sync mode and the device. Every figure in it is measured.

    ``written``: the derived figures as the file :func:`load_report` read held them (None for a
    report built in memory)."""

    def __init__(self, *, bricks: List[BrickStats], paths: List[BrickStats], wall_ns: int,
                 sync_mode: SyncMode, device: dict, metadata: Optional[dict] = None,
                 health: Optional[dict] = None, created: Optional[str] = None,
                 torch_version: Optional[str] = None, written: Optional[WrittenFigures] = None,
                 machine: Optional[dict] = None, bricks_span_ns: Optional[int] = None):
        self.bricks = _brick_list(bricks, "bricks")
        self.paths = _brick_list(paths, "paths")
        if isinstance(wall_ns, bool) or not isinstance(wall_ns, int):
            raise TypeError(f"Report: wall_ns must be an int (nanoseconds), got {type_name(wall_ns)}")
        if wall_ns < 0:
            raise ValueError(f"Report: wall_ns must be >= 0 (nanoseconds), got {wall_ns}")
        self.wall_ns = int(wall_ns)
        if bricks_span_ns is not None:
            if isinstance(bricks_span_ns, bool) or not isinstance(bricks_span_ns, int):
                raise TypeError(f"Report: bricks_span_ns must be an int (nanoseconds) or None, "
                                f"got {type_name(bricks_span_ns)}")
            if bricks_span_ns < 0:
                raise ValueError(f"Report: bricks_span_ns must be >= 0 (nanoseconds), got "
                                 f"{bricks_span_ns}")
        # From the first brick's start to the last one's end: the part of the wall the bricks
        # ran in (None: not measured, e.g. figures accumulated over several profiles).
        self.bricks_span_ns = bricks_span_ns
        if not isinstance(sync_mode, (SyncMode, str)):  # worded as for the other arguments
            modes = ", ".join(repr(m.value) for m in SyncMode)
            raise TypeError(f"Report: sync_mode must be a SyncMode or a str ({modes}), got "
                            f"{type_name(sync_mode)}")
        self.sync_mode = SyncMode.parse(sync_mode, arg="sync_mode", where="Report")
        for name, value, optional in (("device", device, False), ("metadata", metadata, True),
                                      ("health", health, True), ("machine", machine, True)):
            if not isinstance(value, dict) and not (optional and value is None):
                expected = "a dict or None" if optional else "a dict"
                raise TypeError(f"Report: {name} must be {expected}, got {type_name(value)}")
        for name, value in (("created", created), ("torch_version", torch_version)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"Report: {name} must be a str or None, got {type_name(value)}")
        if written is not None and not isinstance(written, WrittenFigures):
            raise TypeError(f"Report: written must be a WrittenFigures or None, got "
                            f"{type_name(written)}")
        self.device = dict(device)
        self.metadata = dict(metadata or {})
        self.health = dict(health or {})
        # What the machine denied the region (profiler.machine): lets a verdict tell a busy
        # machine from a slow program.
        self.machine = dict(machine or {})
        # When the report was made: its ISO text is made when first read (datetime's formatting
        # costs tens of microseconds cold, in the profiled region's exit).
        self._created = created or None
        self._created_ns = time.time_ns() if self._created is None else 0
        if not torch_version:  # this process's
            import torch

            torch_version = torch.__version__
        self.torch_version = torch_version
        self.written = written

    @property
    def created(self) -> str:
        """When the report was made (UTC, ISO 8601), or as the file read held it."""
        if self._created is None:
            seconds, ns = divmod(self._created_ns, 1_000_000_000)
            self._created = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc) \
                .replace(microsecond=ns // 1000).isoformat()
        return self._created

    @classmethod
    def capture(cls, *, wall_ns: int, sync_mode: Union[SyncMode, str],
                metadata: Optional[dict] = None, machine: Optional[dict] = None,
                rows=None, health: Optional[dict] = None,
                created_ns: Optional[int] = None,
                bricks_span_ns: Optional[int] = None) -> "Report":
        """Builds a report from the registry's current figures: one snapshot, from which both
        views derive, so that they agree even while other threads record. A profile passes what
        it took at its exit instead: ``rows`` (``_C._profiler.capture_rows()``), ``health``
        (the registry's health counters) and ``created_ns`` (``time.time_ns()``)."""
        from ._registry import _native  # its import checks the rows' field order

        rows = (_native.report_rows(["name", "path"]) if rows is None
                else rows.rows())  # tuples in BrickStats' field order
        report = cls(
            bricks=[], paths=[], wall_ns=wall_ns, sync_mode=sync_mode,
            device=_device_entry(),
            metadata=metadata, machine=machine,
            # the counters of the figures' span: since their reset (bp.health(): the process's)
            health=dict(_native.health(since_reset=True)) if health is None else health,
            bricks_span_ns=bricks_span_ns,
        )
        if created_ns is not None:
            report._created_ns = created_ns
        # The figures are the snapshot's, taken now; their BrickStats (about 1 us each) are made
        # when first read.
        report._bricks_rows, report._paths_rows = rows["name"], rows["path"]
        report._bricks = report._paths = None
        return report

    bricks = _entries("bricks", "Every brick aggregated by name.")
    paths = _entries("paths", "Every brick aggregated by call path.")

    @property
    def incomplete(self) -> Optional[str]:
        """Why the profiled run ended early (``metadata["incomplete"]``: the profiled script
        raised or was interrupted; the figures are those of what ran), or None."""
        return self.metadata.get("incomplete")

    def with_metadata(self, **entries) -> "Report":
        """A copy of this report whose metadata also holds ``entries``, e.g. figures known only
        once the profiled region has ended (``report.with_metadata(decode={...})``)."""
        return Report(bricks=self.bricks, paths=self.paths, wall_ns=self.wall_ns,
                      sync_mode=self.sync_mode, device=self.device,
                      metadata={**self.metadata, **entries}, health=self.health,
                      created=self.created, torch_version=self.torch_version,
                      written=self.written, machine=self.machine,
                      bricks_span_ns=self.bricks_span_ns)

    def validate(self) -> "Report":
        """Checks this report, built or changed in memory, by the rules :func:`load_report`
        applies to a file (see the module documentation); returns it. Raises ReportError naming
        the field, e.g. ``Report: bricks[3].total_ns: field 'total_ns' must be an integer ...``."""
        def entry(b):  # a BrickStats as the reader sees an entry; anything else as it is
            return {k: getattr(b, k) for k in BRICK_FIELDS} if isinstance(b, BrickStats) else b

        def entries(items):
            return [entry(b) for b in items] if isinstance(items, (list, tuple)) else items

        mode = self.sync_mode.value if isinstance(self.sync_mode, SyncMode) else self.sync_mode
        Reader("Report").fields({
            "schema": SCHEMA, "version": VERSION, "sync_mode": mode, "wall_ns": self.wall_ns,
            "device": self.device, "metadata": self.metadata, "health": self.health,
            "machine": self.machine, "created": self.created, "torch": self.torch_version,
            "bricks": entries(self.bricks), "paths": entries(self.paths),
            **({} if self.bricks_span_ns is None else {"bricks_span_ns": self.bricks_span_ns}),
        })
        return self

    # ---- queries ----------------------------------------------------------------------------
    def brick(self, name: str) -> BrickStats:
        """The op or range named ``name``; else its host row (an op that ran only on the CPU)."""
        check_str(name, "name", "Report.brick", show=type_name)
        named = [b for b in self.bricks if b.name == name]
        for b in sorted(named, key=lambda b: b.kind == "host"):
            return b
        raise KeyError(f"brick report: no brick named {name!r}")

    def __contains__(self, name: str) -> bool:
        check_str(name, "name", "Report.__contains__", show=type_name)
        return any(b.name == name for b in self.bricks)

    def top_level_ns(self) -> int:
        """Total time of the bricks that have no parent brick (nothing counted twice); host
        rows (ops that ran on the CPU) are not brick time."""
        return sum(p.total_ns for p in self.paths if p.depth == 0 and p.kind != "host")

    @property
    def host_ops(self) -> List[dict]:
        """The ops that ran no brick work (kind ``host``: CPU ops, e.g. data preparation), slowest
        first: name, calls and host time. Their time is the host's, never counted as device
        time (top_level_ns, the share column, the roofline)."""
        rows = [{"name": b.name, "calls": b.count, "host_ns": b.total_ns}
                for b in self.bricks if b.kind == "host"]
        rows.sort(key=lambda r: -r["host_ns"])
        return rows

    # ---- JSON -------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        data = {
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
            "machine": self.machine,
            "bricks": [b.to_dict() for b in self.bricks],
            "paths": [p.to_dict() for p in self.paths],
        }
        if self.bricks_span_ns is not None:
            data["bricks_span_ns"] = self.bricks_span_ns
        return data

    def to_json(self, indent: Optional[int] = 2) -> str:
        """The report as JSON text. Raises ValueError (NaN, Infinity) or TypeError (a value JSON
        cannot hold) naming the field, e.g. ``metadata.decode.tokens_per_s``."""
        if indent is not None and (isinstance(indent, bool) or not isinstance(indent, int)):
            raise TypeError(f"Report.to_json: indent must be an int or None, got {type_name(indent)}")
        if indent is not None and indent < 0:
            raise ValueError(f"Report.to_json: indent must be >= 0 or None, got {indent}")
        data = self.to_dict()
        try:
            return json.dumps(data, indent=indent, allow_nan=False)
        except (TypeError, ValueError) as error:
            # json names neither the field nor the value: find it, to say which one.
            detail = first_unwritable(data) or str(error)
            raise type(error)(f"brick report: cannot write the report as JSON: {detail}") from None

    def write_json(self, path: Union[str, os.PathLike]) -> str:
        """Writes the report; returns the path. Raises OSError naming the path on failure."""
        if not isinstance(path, (str, bytes, os.PathLike)):
            raise TypeError(f"Report.write_json: path must be a str or os.PathLike, got "
                            f"{type_name(path)}")
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
    def table(self, sort_by: str = "total", row_limit: Optional[int] = None, by: str = "name",
              roofline: bool = False, width: Optional[int] = None) -> str:
        """A text table in the style of ``key_averages().table()``.

        ``sort_by``: ``total``, ``avg``, ``count``, ``max``, ``p99`` or ``name``; ``by``: ``name``,
        ``path`` (per call path, indented by depth), ``module`` (the module bricks of
        ``profile(modules=True)``, each with its self and total time, slowest self time first;
        ``sort_by`` does not apply) or ``shape`` (per op and input shapes, dtypes and integer
        arguments, as ``key_averages(group_by_input_shape=True)``: ``profile(record_shapes=True)``;
        slowest total first); ``row_limit``: the first rows only (None: every row); ``roofline``:
        with ``by`` ``name`` or ``path``, the columns of ``profile(roofline=True)``: achieved
        GFLOP/s and GB/s, their percentage of the backing device's peaks, and what bounds it.

        ``width``: the columns a row may take. None (the default): the terminal's width where
        standard output is a terminal, whole rows where it is a file or a pipe; an int: that
        width; 0: whole rows. A row too wide has its names cut in the middle (``…``) first, then
        its least useful columns left out (min, p50, max ...), as its last note says.

        The share column is of the bricks' span (``% span``: from the first brick's start to the
        last one's end, :attr:`bricks_span_ns`) where the report has one, else of the profile's
        wall time (``% wall``), which also holds what ran before the first brick (a script's
        start-up) and after the last.
        """
        keys = {
            "total": lambda b: -b.total_ns, "avg": lambda b: -b.avg_us(), "count": lambda b: -b.count,
            "max": lambda b: -b.max_ns, "p99": lambda b: -b.p99_ns, "name": lambda b: b.name,
        }
        check_str(sort_by, "sort_by", "Report.table", show=type_name)
        if sort_by not in keys:
            raise ValueError(f"brick report: sort_by must be one of {', '.join(keys)}, got {sort_by!r}")
        check_str(by, "by", "Report.table", show=type_name)
        if by not in ("name", "path", "module", "shape"):
            raise ValueError(f"brick report: by must be 'name', 'path', 'module' or 'shape', "
                             f"got {by!r}")
        _check_row_limit(row_limit, "Report.table")
        check_bool(roofline, "roofline", "Report.table")
        width = fitting_width(width, "Report.table")
        roofline_of = {}
        if roofline:
            from . import roofline as _roofline

            if by not in ("name", "path"):
                raise ValueError(f"brick report: table(roofline=True) shows by='name' or 'path', "
                                 f"got by={by!r}")
            roofline_of = {r.path: r for r in self.roofline(by=by)}
            if not roofline_of:
                raise ValueError("brick report: no roofline; profile with roofline=True "
                                 "(python -m torch_brickdev profile --roofline) for "
                                 "table(roofline=True)")
        if by == "module":
            return self._module_table(row_limit, width)
        if by == "shape":
            from . import shapes

            return shapes.shape_table(self.shape_stats(), self.wall_ns, row_limit)
        # Host rows are listed in a note of their own, outside the bricks' columns and shares.
        device_rows = [b for b in (self.bricks if by == "name" else self.paths)
                       if b.kind != "host"]
        rows = (sorted(device_rows, key=keys[sort_by]) if by == "name"
                else _tree_order(device_rows, keys[sort_by]))
        if row_limit is not None:
            rows = rows[:row_limit]
        share_of, share_header, share_note = self._share_base()
        # drop: which columns go first when a row must fit a width (0: kept)
        table = Table("Name" if by == "name" else "Path", [
            Column("Kind", 6, drop=4), Column("Calls", 9, drop=9), Column("Total ms", 12),
            Column("Avg us", 11, drop=6), Column("Min us", 11, drop=1),
            Column("Max us", 11, drop=3), Column("P50 us", 11, drop=2),
            Column("P99 us", 11, drop=5), Column(share_header, 8),
            *(_roofline.table_columns() if roofline else ())])
        for b in rows:
            table.add(_label(b, by), [
                b.kind, str(b.count), f"{b.total_ns / 1e6:.3f}", f"{b.avg_us():.3f}",
                f"{b.min_ns / 1e3:.3f}", f"{b.max_ns / 1e3:.3f}", f"{b.p50_ns / 1e3:.3f}",
                f"{b.p99_ns / 1e3:.3f}", f"{100 * b.total_ns / share_of:.1f}%",
                *(_roofline.table_cells(roofline_of.get(b.path if by == "path" else b.name))
                  if roofline else ())])
        notes = [
            f"sync mode: {self.sync_mode.value}; wall time: {self.wall_ns / 1e6:.3f} ms; "
            f"top-level brick time: {self.top_level_ns() / 1e6:.3f} ms; "
            f"{len(self.bricks) - len(self.host_ops)} bricks",
            share_note,
            *_host_lines(self.host_ops),
            "calls: every call on every thread, a call nested in a call of the same name "
            "included (key_averages() folds it into its parent)",
        ]
        notes.extend(_collective_lines(self.metadata.get("collectives")))
        if roofline:
            notes.extend(_roofline.table_notes(self.metadata["roofline"]))
        # What the profiler could not time is said, never left to be noticed.
        missed = {
            "capture_skipped": "bricks skipped: their stream was being captured into a CUDA graph",
            "timing_failures": "bricks dropped: a device call failed while timing them",
            "unbalanced_exits": "exits without an open brick (started before profiling)",
            "traced_lost": "records or bricks the device's work tracer lost",
            "traced_unattributed": "pieces of traced device work no brick queued",
        }
        for key, meaning in missed.items():
            value = self.health.get(key, 0)
            if value:
                notes.append(f"warning: {value} {meaning} ({key})")
        if self.incomplete:
            notes.append(f"warning: incomplete: {printable(self.incomplete, 300)}")
        return table.lines(width).with_notes(notes)

    def _share_base(self) -> Tuple[int, str, str]:
        """What the tables' share column is of: (its ns, its header, the note that says so)."""
        span = self.bricks_span_ns
        if span:
            return span, "% span", (
                f"% span: of the bricks' span, {span / 1e6:.3f} ms from the first brick's start "
                f"to the last one's end (the wall time also holds "
                f"{max(self.wall_ns - span, 0) / 1e6:.3f} ms before and after them, e.g. a "
                f"script's start-up)")
        return self.wall_ns or 1, "% wall", ("% wall: of the wall time, from the profile's "
                                             "start to its end")

    def module_times(self) -> List[dict]:
        """Per module brick (``profile(modules=True)``): name, calls, total and self time (its
        total less its child modules' totals), slowest self time first. Empty when the report
        has no module bricks."""
        modules = self.metadata.get("modules")
        if not isinstance(modules, list):
            return []
        modules = {m for m in modules if isinstance(m, str)}
        named = {b.name: b for b in self.bricks if b.kind == "range" and b.name in modules}
        children_ns = dict.fromkeys(named, 0)
        for p in self.paths:
            parts = p.path.split("/")
            if parts[-1] not in named:
                continue
            parent = next((n for n in reversed(parts[:-1]) if n in named), None)
            if parent is not None:
                children_ns[parent] += p.total_ns
        rows = [{"name": n, "calls": b.count, "total_ns": b.total_ns,
                 "self_ns": b.total_ns - children_ns[n]} for n, b in named.items()]
        rows.sort(key=lambda r: -r["self_ns"])
        return rows

    def roofline(self, by: str = "path") -> List[_roofline.BrickRoofline]:
        """Per brick (``profile(roofline=True)``): FLOPs, bytes, achieved FLOP/s and bytes/s and
        their fraction of the backing device's peaks, compute- or memory-bound; per call path
        (``by="path"``) or per name (``by="name"``), slowest first; empty without a roofline
        (:mod:`.roofline`)."""
        from . import roofline as _roofline

        return _roofline.roofline_rows(self.metadata, by)

    def shape_stats(self, by: str = "name") -> List[shapes.ShapeStats]:
        """Per op and input signature (``profile(record_shapes=True)``): merged over call paths
        (``by="name"``) or per path (``by="path"``), slowest total first; empty when the profile
        did not record shapes (:mod:`.shapes`)."""
        from . import shapes

        return shapes.shape_stats(self.metadata, by)

    def _module_table(self, row_limit: Optional[int], width: Optional[int]) -> str:
        rows = self.module_times()
        if not rows:
            raise ValueError("brick report: no module bricks; profile with modules=True "
                             "(python -m torch_brickdev profile --modules) for table(by='module')")
        shown = rows[:row_limit] if row_limit is not None else rows
        share_of, share_header, share_note = self._share_base()
        table = Table("Module", [Column("Calls", 9, drop=2), Column("Self ms", 12),
                                 Column("Total ms", 12, drop=3),
                                 Column("Self us/call", 14, drop=1), Column(share_header, 8)])
        for r in shown:
            table.add(r["name"], [str(r["calls"]), f"{r['self_ns'] / 1e6:.3f}",
                                  f"{r['total_ns'] / 1e6:.3f}",
                                  f"{r['self_ns'] / r['calls'] / 1e3:.3f}",
                                  f"{100 * r['self_ns'] / share_of:.1f}%"])
        roots = sum(r["self_ns"] for r in rows)  # self times add up to the outermost modules'
        return table.lines(width).with_notes([
            f"sync mode: {self.sync_mode.value}; wall time: {self.wall_ns / 1e6:.3f} ms; "
            f"module time: {roots / 1e6:.3f} ms ({100 * roots / share_of:.1f}"
            f"{share_header}); {len(rows)} modules, slowest self time first (self: less "
            f"child modules)", share_note])

    def __str__(self) -> str:
        return self.table()


def _host_lines(host_ops: List[dict]) -> List[str]:
    """The table's note on the ops that ran on the CPU, slowest first (none: no line)."""
    if not host_ops:
        return []
    listed = ", ".join(f"{printable(r['name'])} x{r['calls']} ({r['host_ns'] / 1e6:.3f} ms host "
                       f"time)" for r in host_ops[:10])
    more = f", and {len(host_ops) - 10} more" if len(host_ops) > 10 else ""
    ops = "op" if len(host_ops) == 1 else "ops"
    return [f"{len(host_ops)} {ops} ran on the CPU, not on brick (no device time): {listed}{more}"]


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
        line = (f"  {printable(name)}: {c.get('calls', 0)} calls, "
                f"{c.get('bytes', 0) / 2**20:.3f} MiB, "
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


def _check_row_limit(row_limit, func: str) -> None:
    if row_limit is None:
        return
    if isinstance(row_limit, bool) or not isinstance(row_limit, int):
        raise TypeError(f"{func}: row_limit must be an int >= 0 or None, got {type_name(row_limit)}")
    if row_limit < 0:  # rows[:-1] would silently drop the last row
        raise ValueError(f"{func}: row_limit must be >= 0 (None for every row), got {row_limit}")


def _brick_list(items, arg: str) -> List[BrickStats]:
    # A str, bytes or dict is iterable too, but never a list of bricks.
    if isinstance(items, (str, bytes, dict)) or not isinstance(items, Iterable):
        raise TypeError(f"Report: {arg} must be a list of BrickStats, got {type_name(items)}")
    out = list(items)
    for i, item in enumerate(out):
        if not isinstance(item, BrickStats):
            raise TypeError(f"Report: {arg}[{i}] must be a BrickStats, got {type_name(item)}")
    return out


def load_report(source: Union[str, os.PathLike, dict], *, where: str = "load_report",
                arg: str = "source") -> Report:
    """Reads a report written by :meth:`Report.write_json` (a path, or the parsed dict); its
    :attr:`Report.written` holds the derived figures as written.

    Raises ReportError naming the file and the field (``bricks[3].count``) and what was expected
    for a malformed, truncated or wrong-version report (the rules are in the module
    documentation), TypeError when ``source`` is neither a path nor a dict. ``where`` and
    ``arg`` name the caller's function and argument in the messages about ``source`` itself."""
    data, label = read_source(source, where, arg)
    return Report(**Reader(label).fields(data))
