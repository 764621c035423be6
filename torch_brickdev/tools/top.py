"""``python -m torch_brickdev top``: a live view of the bricks of running processes ("compute
block top"), read from what they publish (:mod:`torch_brickdev.profiler.live`).

    top                       the publishers of this user; watches the only one, or all merged
    top --per-rank            one view per process (per torchrun rank) instead
    top --pid P               watches one process
    top --once [--json]       one reading (two snapshots apart) for scripts and tests
    top --sort p99 --filter attn --modules

Per brick, over the last interval and since the profile started: calls/s, avg, p50, p99 (µs)
and % of the wall. Interactive keys (on a terminal): s next sort column, / filter, m module
bricks only, p pause, q quit. When the watched process ends, top says so and exits.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Dict, List, Optional, Sequence

from ..profiler import live
from ._args import positive_int

SORTS = ("wall", "calls", "avg", "p50", "p99", "total_wall", "name")
_Q = (0.5, 0.99)


def _percentiles(buckets) -> Dict[float, float]:
    from .. import _C

    return {q: _C._profiler.percentile_of_buckets(buckets, q) for q in _Q} if buckets else \
        dict.fromkeys(_Q, 0.0)


def _merge(snapshots: Sequence[dict]) -> Dict[str, dict]:
    """Bricks by name across snapshots (ranks merged): counts, totals and histograms add."""
    merged: Dict[str, dict] = {}
    for snap in snapshots:
        for b in snap["bricks"]:
            m = merged.setdefault(b["name"], {"kind": b["kind"], "count": 0, "total_ns": 0,
                                              "histogram": {}})
            m["count"] += b["count"]
            m["total_ns"] += b["total_ns"]
            for bucket, count in b.get("histogram", []):
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


def render(snapshots: List[dict], table: List[dict], sort: str, name_filter: str,
           modules_only: bool, limit: Optional[int], status: str = "") -> str:
    head = snapshots[0]
    who = ", ".join(f"pid {s['pid']}" + (f" rank {s['rank']}" if s.get("rank") is not None
                                         else "") for s in snapshots)
    command = " ".join(head["argv"])[:80]
    elapsed = (head["time_ns"] - head["started_ns"]) / 1e9
    lines = [f"brick top — {who} — {command}",
             f"sync mode {head['sync_mode']}; profiled {elapsed:.1f} s; sort {sort}"
             + (f"; filter {name_filter!r}" if name_filter else "")
             + ("; module bricks" if modules_only else "") + (f"; {status}" if status else ""),
             ""]
    header = (f"{'brick':<44}{'calls/s':>10}{'avg us':>10}{'p50 us':>10}{'p99 us':>10}"
              f"{'% wall':>8} |{'calls/s':>10}{'avg us':>10}{'p50 us':>10}{'p99 us':>10}"
              f"{'% wall':>8}")
    lines += [f"{'':<44}{'last interval':^48} |{'since start':^48}", header]
    for r in table[:limit] if limit else table:
        i, s = r["interval"], r["start"]
        left = (f"{i['calls_per_s']:>10.1f}{i['avg_us']:>10.2f}{i['p50_us']:>10.2f}"
                f"{i['p99_us']:>10.2f}{100 * i['wall']:>7.1f}%") if i else f"{'-':>48}"
        lines.append(f"{r['name'][:43]:<44}{left} |{s['calls_per_s']:>10.1f}{s['avg_us']:>10.2f}"
                     f"{s['p50_us']:>10.2f}{s['p99_us']:>10.2f}{100 * s['wall']:>7.1f}%")
    return "\n".join(lines)


# ---- reading the publishers -------------------------------------------------------------------


def _watched(pids: Optional[List[int]]) -> List[dict]:
    found = live.publishers()
    if pids:
        found = [d for d in found if d["pid"] in pids]
    return found


def _next_reading(previous: List[dict], pids: List[int], timeout_s: float) -> Optional[List[dict]]:
    """The publishers' next snapshots (each newer than in ``previous``), None when one ended."""
    deadline = time.monotonic() + timeout_s
    seen = {d["pid"]: d["seq"] for d in previous}
    while time.monotonic() < deadline:
        now = _watched(pids)
        if len(now) < len(pids):
            return None
        if all(d["seq"] > seen.get(d["pid"], -1) for d in now):
            return now
        time.sleep(0.05)
    return _watched(pids) if len(_watched(pids)) == len(pids) else None


def main(argv: Optional[Sequence[str]] = None, prog: str = "python -m torch_brickdev top") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=positive_int, action="append",
                        help="watch this process (repeat for several; default: every publisher)")
    parser.add_argument("--once", action="store_true",
                        help="print one reading (waits for a second snapshot) and exit")
    parser.add_argument("--json", action="store_true", help="with --once: the reading as JSON")
    parser.add_argument("--list", action="store_true", help="list the publishers and exit")
    parser.add_argument("--sort", choices=SORTS, default="wall")
    parser.add_argument("--filter", default="", help="show bricks whose name holds this text")
    parser.add_argument("--modules", action="store_true", help="module bricks only")
    parser.add_argument("--rows", type=positive_int, default=None, help="rows to show")
    parser.add_argument("--per-rank", action="store_true",
                        help="one view per process (e.g. per torchrun rank) instead of merged")
    args = parser.parse_args(argv)
    try:
        found = _watched(args.pid)
    except live.LiveError as error:
        print(error, file=sys.stderr)
        return 2
    if args.list:
        for d in found:
            print(f"{d['pid']:>8}  rank {d['rank'] if d.get('rank') is not None else '-':>4}  "
                  f"{' '.join(d['argv'])[:100]}")
        return 0 if found else 1
    if not found:
        what = (f"pid {', '.join(map(str, args.pid))} is not publishing" if args.pid else
                "no brick process of this user is publishing")
        print(f"{what}: run it with profile(live=True), `python -m torch_brickdev profile "
              "--live` or BRICK_LIVE=1", file=sys.stderr)
        return 1
    pids = [d["pid"] for d in found]
    interval = live.MIN_INTERVAL_S
    if args.once or not sys.stdout.isatty():
        return _print_loop(args, found, pids, interval, once=args.once)
    return _interactive(args, found, pids, interval)


def _table(args, before, now, modules_only, name_filter, sort):
    modules = None
    if modules_only:
        modules = [m for s in now for m in (s.get("modules") or [])]
    return select(rows(before, now), sort, name_filter, modules)


def _print_loop(args, found, pids, interval, once: bool) -> int:
    before = found
    while True:
        now = _next_reading(before, pids, 4 * interval)
        if now is None:
            print(f"process {', '.join(map(str, pids))} ended (its profile finished or it "
                  "exited)", file=sys.stderr if once else sys.stdout)
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


def _interactive(args, found, pids, interval) -> int:
    import curses

    def run(screen) -> int:
        curses.curs_set(0)
        screen.timeout(int(interval * 1000))
        before, now = found, found
        sort, name_filter, modules_only, paused = args.sort, args.filter, args.modules, False
        status = "waiting for the next snapshot"
        while True:
            if not paused:
                reading = _next_reading(now, pids, 4 * interval)
                if reading is None:
                    screen.erase()
                    screen.addstr(0, 0, f"process {', '.join(map(str, pids))} ended; press a "
                                  "key")
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
                          " keys: s sort, / filter, m modules, p pause, q quit")
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

    return curses.wrapper(run)


if __name__ == "__main__":
    sys.exit(main())
