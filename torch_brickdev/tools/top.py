"""``python -m torch_brickdev top``: a live view of the bricks of running processes ("compute
block top"), read from what they publish (:mod:`torch_brickdev.profiler.live`).

    top                       the publishers of this user; watches the only one, or all merged
    top --per-rank            one view per process (per torchrun rank) instead
    top --pid P               watches one process
    top --once [--json]       one reading (two snapshots apart) for scripts and tests
    top --sort p99 --filter attn --modules
    top --list                the publishers (exit 1, saying where it looked, when there are none)

Per brick, over the last interval and since the profile started: calls/s, avg, p50, p99 (µs)
and % of the wall. Interactive keys (on a terminal): s next sort column, / filter, m module
bricks only, p pause, q quit. When the watched process ends, top says so and exits. Tables fit
the terminal's width (narrow ones lose the since-start figures first); names and arguments print
with control and bidi characters escaped. A file in the live directory that is no snapshot is
skipped with a one-line note (on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import unicodedata
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from ..profiler import live
from ..profiler._stats import row_label
from ..terminal import printable, terminal_columns
from ._args import positive_int

SORTS = ("wall", "calls", "avg", "p50", "p99", "total_wall", "name")
_Q = (0.5, 0.99)


def _percentiles(buckets) -> Dict[float, float]:
    from .. import _C

    return {q: _C._profiler.percentile_of_buckets(buckets, q) for q in _Q} if buckets else \
        dict.fromkeys(_Q, 0.0)


def _merge(snapshots: Sequence[dict]) -> Dict[str, dict]:
    """Bricks by name and kind across snapshots (ranks merged): counts, totals and histograms
    add; an op's host row (its calls that ran on the CPU) stays apart from its brick row."""
    merged: Dict[str, dict] = {}
    for snap in snapshots:
        for b in snap["bricks"]:
            m = merged.setdefault(row_label(b["name"], b["kind"]),
                                  {"kind": b["kind"], "count": 0, "total_ns": 0, "histogram": {}})
            m["count"] += b["count"]
            m["total_ns"] += b["total_ns"]
            for bucket, count in b["histogram"]:
                m["histogram"][bucket] = m["histogram"].get(bucket, 0) + count
    return merged


def rows(before: Optional[List[dict]], now: List[dict]) -> List[dict]:
    """Per brick: the figures over the interval between two readings (None before the second)
    and since the start."""
    current = _merge(now)
    previous = _merge(before) if before else {}
    elapsed_s = max(1e-9, (now[0]["time_ns"] - now[0]["started_ns"]) / 1e9)
    interval_s = (now[0]["time_ns"] - before[0]["time_ns"]) / 1e9 if before else None
    ranks = len(now)
    out = []
    for name, b in current.items():
        p = previous.get(name, {"count": 0, "total_ns": 0, "histogram": {}})
        since = _percentiles(sorted(b["histogram"].items()))
        row = {"name": name, "kind": b["kind"], "calls": b["count"],
               "start": {"calls_per_s": b["count"] / elapsed_s,
                         "avg_us": b["total_ns"] / b["count"] / 1e3 if b["count"] else 0.0,
                         "p50_us": since[0.5] / 1e3, "p99_us": since[0.99] / 1e3,
                         "wall": b["total_ns"] / (elapsed_s * 1e9 * ranks)},
               "interval": None}
        if interval_s:
            calls = b["count"] - p["count"]
            total = b["total_ns"] - p["total_ns"]
            delta = [(k, v - p["histogram"].get(k, 0)) for k, v in sorted(b["histogram"].items())
                     if v - p["histogram"].get(k, 0) > 0]
            q = _percentiles(delta)
            row["interval"] = {"calls_per_s": calls / interval_s,
                               "avg_us": total / calls / 1e3 if calls else 0.0,
                               "p50_us": q[0.5] / 1e3, "p99_us": q[0.99] / 1e3,
                               "wall": total / (interval_s * 1e9 * ranks)}
        out.append(row)
    return out


def _key(sort: str):
    def value(row, part="interval"):
        figures = row[part] or row["start"]
        return figures
    return {
        "wall": lambda r: -value(r)["wall"], "calls": lambda r: -value(r)["calls_per_s"],
        "avg": lambda r: -value(r)["avg_us"], "p50": lambda r: -value(r)["p50_us"],
        "p99": lambda r: -value(r)["p99_us"], "total_wall": lambda r: -r["start"]["wall"],
        "name": lambda r: r["name"],
    }[sort]


def select(table: List[dict], sort: str, name_filter: str, modules: Optional[List[str]]):
    shown = [r for r in table if name_filter.lower() in r["name"].lower()]
    if modules is not None:
        wanted = set(modules)
        shown = [r for r in shown if r["name"] in wanted]
    return sorted(shown, key=_key(sort))


# ---- the table, fitted to the terminal -------------------------------------------------------


@dataclass(frozen=True)
class _Column:
    part: str  # "interval" (the last interval) or "start" (since the start)
    key: str  # the row's figure
    title: str
    width: int


_PARTS = (("interval", "last interval", "interval"), ("start", "since start", "start"))
_FIGURES = (("calls_per_s", "calls/s", 10), ("avg_us", "avg us", 10), ("p50_us", "p50 us", 10),
            ("p99_us", "p99 us", 10), ("wall", "% wall", 8))
_COLUMNS = tuple(_Column(part, key, title, width) for part, _, _ in _PARTS
                 for key, title, width in _FIGURES)
# What a narrow terminal loses first: the since-start figures, then the interval's detail. The
# interval's % wall, and the column the rows are sorted by, stay.
_DROPPED_FIRST = (("start", "p50_us"), ("start", "p99_us"), ("start", "avg_us"),
                  ("start", "calls_per_s"), ("interval", "p50_us"), ("start", "wall"),
                  ("interval", "p99_us"), ("interval", "avg_us"), ("interval", "calls_per_s"))
_SORTED_BY = {"wall": ("interval", "wall"), "calls": ("interval", "calls_per_s"),
              "avg": ("interval", "avg_us"), "p50": ("interval", "p50_us"),
              "p99": ("interval", "p99_us"), "total_wall": ("start", "wall")}
_NAME_WIDTH = (16, 44)  # the brick column's least and most
_SEPARATOR = " |"
_FULL_WIDTH = _NAME_WIDTH[1] + sum(c.width for c in _COLUMNS) + len(_SEPARATOR)


def _width() -> int:
    """The terminal's columns; where the output is no terminal, the whole table's."""
    return terminal_columns(default=_FULL_WIDTH)


def _cells(char: str) -> int:
    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def _cut(text: str, width: int) -> str:
    """``text`` (printable already) in at most ``width`` terminal columns: cut with an ellipsis
    where it is longer."""
    if text.isascii():
        return text if len(text) <= width else text[:max(0, width - 1)] + "…"
    widths = [_cells(c) for c in text]
    if sum(widths) <= width:
        return text
    used, end = 0, 0
    while end < len(text) and used + widths[end] <= width - 1:
        used += widths[end]
        end += 1
    return text[:end] + "…"


def _padded(text: str, width: int) -> str:
    """Someone's text (a brick name) in exactly ``width`` columns: escaped, cut, padded."""
    shown = _cut(printable(text), width)
    return shown + " " * (width - sum(_cells(c) for c in shown))


def _layout(width: int, sort: str) -> Tuple[int, List[_Column]]:
    """The brick column's width and the figure columns that fit in ``width``."""
    kept = list(_COLUMNS)

    def figures_width() -> int:
        parts = {c.part for c in kept}
        return sum(c.width for c in kept) + (len(_SEPARATOR) if len(parts) > 1 else 0)

    for part, key in _DROPPED_FIRST:
        if _NAME_WIDTH[0] + figures_width() <= width:
            break
        if (part, key) != _SORTED_BY.get(sort):
            kept = [c for c in kept if (c.part, c.key) != (part, key)]
    return max(_NAME_WIDTH[0], min(_NAME_WIDTH[1], width - figures_width())), kept


def _cell(column: _Column, figures: Optional[dict]) -> str:
    if figures is None:  # the interval's, before a second reading
        return f"{'-':>{column.width}}"
    value = figures[column.key]
    if column.key == "wall":
        return f"{100 * value:>{column.width - 1}.1f}%"
    return f"{value:>{column.width}.{1 if column.key == 'calls_per_s' else 2}f}"


def render(snapshots: List[dict], table: List[dict], sort: str, name_filter: str,
           modules_only: bool, limit: Optional[int], status: str = "",
           width: Optional[int] = None) -> str:
    """The view as text, every line within ``width`` columns (the terminal's by default)."""
    width = _width() if width is None else width
    head = snapshots[0]
    who = ", ".join(f"pid {s['pid']}" + (f" rank {s['rank']}" if s.get("rank") is not None
                                         else "") for s in snapshots)
    elapsed = (head["time_ns"] - head["started_ns"]) / 1e9
    name_width, columns = _layout(width, sort)
    parts = [(part, [c for c in columns if c.part == part], titles) for part, *titles in _PARTS]
    parts = [(part, kept, titles) for part, kept, titles in parts if kept]

    def line(name: str, cell) -> str:
        return name + _SEPARATOR.join("".join(cell(c) for c in kept) for _, kept, _ in parts)

    def group_title(kept, titles) -> str:
        span = sum(c.width for c in kept)
        title = titles[0] if len(titles[0]) <= span else titles[1]
        return f"{_cut(title, span):^{span}}"

    lines = [f"brick top — {who} — {printable(' '.join(head['argv']))}",
             f"sync mode {printable(head['sync_mode'])}; profiled {elapsed:.1f} s; sort {sort}"
             + (f"; filter {printable(repr(name_filter))}" if name_filter else "")
             + ("; module bricks" if modules_only else "") + (f"; {status}" if status else ""),
             "",
             " " * name_width + _SEPARATOR.join(group_title(kept, titles)
                                                for _, kept, titles in parts),
             line(f"{'brick':<{name_width}}", lambda c: f"{c.title:>{c.width}}")]
    for r in table[:limit] if limit else table:
        lines.append(line(_padded(r["name"], name_width - 1) + " ",
                          lambda c: _cell(c, r[c.part])))
    return "\n".join(_cut(text, width) for text in lines)


# ---- reading the publishers -------------------------------------------------------------------


class _Reader:
    """The publishers (those of ``pids`` where given), read again on each call; each file that
    is no snapshot is told, once, to ``tell``."""

    def __init__(self, pids: Optional[List[int]], tell: Callable[[str], None], buckets: bool):
        self.pids = pids
        self.tell = tell
        self.buckets = buckets  # histograms checked: the readings whose percentiles are shown
        self.directory = ""
        self._told: Set[str] = set()

    def __call__(self) -> List[dict]:
        found = live.scan(self.buckets)
        self.directory = found.directory
        for note in found.skipped:
            if note not in self._told:
                self._told.add(note)
                self.tell(f"skipped {printable(note)}")
        if self.pids:
            return [d for d in found.publishers if d["pid"] in self.pids]
        return found.publishers


def _next_reading(read: _Reader, previous: List[dict], timeout_s: float) -> Optional[List[dict]]:
    """The publishers' next snapshots (each newer than in ``previous``), None when one ended."""
    deadline = time.monotonic() + timeout_s
    seen = {d["pid"]: d["seq"] for d in previous}
    while True:
        now = read()
        if {d["pid"] for d in now} != set(seen):
            return None
        if all(d["seq"] > seen[d["pid"]] for d in now) or time.monotonic() >= deadline:
            return now
        time.sleep(0.05)


def _nobody(pids: Optional[List[int]], directory: str) -> str:
    what = (f"pid {', '.join(map(str, pids))} is not publishing" if pids else
            "no brick process of this user is publishing")
    return (f"{what} in {printable(directory)}: run it with profile(live=True), `python -m "
            "torch_brickdev profile --live` or BRICK_LIVE=1")


def _tell(note: str) -> None:
    print(note, file=sys.stderr, flush=True)


def main(argv: Optional[Sequence[str]] = None, prog: str = "python -m torch_brickdev top") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=positive_int, action="append",
                        help="watch this process (repeat for several; default: every publisher)")
    parser.add_argument("--once", action="store_true",
                        help="print one reading (waits for a second snapshot) and exit")
    parser.add_argument("--json", action="store_true", help="with --once: the reading as JSON")
    parser.add_argument("--list", action="store_true",
                        help="list the publishers and exit (1 when there are none)")
    parser.add_argument("--sort", choices=SORTS, default="wall")
    parser.add_argument("--filter", default="", help="show bricks whose name holds this text")
    parser.add_argument("--modules", action="store_true", help="module bricks only")
    parser.add_argument("--rows", type=positive_int, default=None, help="rows to show")
    parser.add_argument("--per-rank", action="store_true",
                        help="one view per process (e.g. per torchrun rank) instead of merged")
    args = parser.parse_args(argv)
    read = _Reader(args.pid, _tell, buckets=not args.list)
    try:
        found = read()
        if not found:
            print(_nobody(args.pid, read.directory), file=sys.stderr)
            return 1
        read.pids = [d["pid"] for d in found]  # the ones watched: a later one is not shown
        if args.list:
            width = _width()
            for d in found:
                rank = d["rank"] if d["rank"] is not None else "-"
                print(_cut(f"{d['pid']:>8}  rank {rank:>4}  {printable(' '.join(d['argv']))}",
                           width))
            return 0
        if args.once or not sys.stdout.isatty():
            return _print_loop(args, read, found, once=args.once)
        return _interactive(args, read, found)
    except live.LiveError as error:  # the directory became one that cannot be trusted
        print(printable(error), file=sys.stderr)
        return 2


def _table(args, before, now, modules_only, name_filter, sort):
    modules = None
    if modules_only:
        modules = [m for s in now for m in (s.get("modules") or [])]
    return select(rows(before, now), sort, name_filter, modules)


def _ended(pids: List[int]) -> str:
    return f"process {', '.join(map(str, pids))} ended"


def _print_loop(args, read: _Reader, found: List[dict], once: bool) -> int:
    before = found
    while True:
        now = _next_reading(read, before, 4 * live.MIN_INTERVAL_S)
        if now is None:
            print(f"{_ended(read.pids)} (its profile finished or it exited)",
                  file=sys.stderr if once else sys.stdout)
            return 1 if once else 0
        if args.per_rank and len(now) > 1 and not args.json:
            # one view per process (rank), each from its own two snapshots
            old = {d["pid"]: d for d in before}
            print("\n\n".join(
                render([snap], _table(args, [old[snap["pid"]]] if snap["pid"] in old else None,
                                      [snap], args.modules, args.filter, args.sort),
                       args.sort, args.filter, args.modules, args.rows) for snap in now),
                flush=True)
            if once:
                return 0
            before = now
            continue
        table = _table(args, before, now, args.modules, args.filter, args.sort)
        if args.json:
            print(json.dumps({"publishers": [{k: s[k] for k in ("pid", "rank", "argv", "seq",
                                                                 "sync_mode")} for s in now],
                              "rows": table[:args.rows] if args.rows else table}))
        else:
            print(render(now, table, args.sort, args.filter, args.modules, args.rows), flush=True)
        if once:
            return 0
        before = now


def _interactive(args, read: _Reader, found: List[dict]) -> int:
    import curses

    skipped: List[str] = []
    read.tell = skipped.append  # on the screen's status line, not under it

    def run(screen) -> int:
        curses.curs_set(0)
        screen.timeout(int(live.MIN_INTERVAL_S * 1000))
        before, now = found, found
        sort, name_filter, modules_only, paused = args.sort, args.filter, args.modules, False
        status = "waiting for the next snapshot"
        while True:
            if not paused:
                reading = _next_reading(read, now, 4 * live.MIN_INTERVAL_S)
                if reading is None:
                    screen.erase()
                    screen.addstr(0, 0, f"{_ended(read.pids)}; press a key")
                    screen.timeout(-1)
                    screen.getch()
                    return 0
                before, now = now, reading
                status = ""
            table = _table(args, before if before is not now else None, now, modules_only,
                           name_filter, sort)
            height, width = screen.getmaxyx()
            text = render(now, table, sort, name_filter, modules_only, max(1, height - 6),
                          ("paused; " if paused else "") + status +
                          " keys: s sort, / filter, m modules, p pause, q quit"
                          + (f"; {len(skipped)} file(s) {skipped[-1]}" if skipped else ""),
                          width=width - 1)
            screen.erase()
            for y, line in enumerate(text.splitlines()[:height - 1]):
                screen.addnstr(y, 0, line, width - 1)
            screen.refresh()
            key = screen.getch()
            if key in (ord("q"), 27):
                return 0
            if key == ord("s"):
                sort = SORTS[(SORTS.index(sort) + 1) % len(SORTS)]
            elif key == ord("m"):
                modules_only = not modules_only
            elif key == ord("p"):
                paused = not paused
            elif key == ord("/"):
                curses.echo()
                screen.addstr(height - 1, 0, "filter: ")
                name_filter = screen.getstr(height - 1, 8, 60).decode(errors="replace")
                curses.noecho()

    code = curses.wrapper(run)
    for note in skipped:  # where the screen's status line showed only the last
        _tell(note)
    return code


if __name__ == "__main__":
    sys.exit(main())
