"""The contract check kinds that judge the report itself: ``completeness`` (every brick listed
once), ``avg-agreement`` (per-call figures agree with totals), ``measured`` (every figure is a
measurement) and ``health`` (the profiler saw every brick)."""

from __future__ import annotations

import math
from typing import Dict

from .numbers import _fmt_ms
from .report_view import Subject
from .result import FAIL, NA, PASS, CheckResult, Result

__all__ = ["avg_agreement", "completeness", "health", "measured"]


def completeness(p: dict, s: Subject, result: Result) -> CheckResult:
    """Every brick listed once, by its name and kind: an op's calls that ran no brick work are
    its host row (kind "host"), the same name in another kind, not a duplicate."""
    report, named, required = s.report, s.named, s.contract.bricks
    problems = []
    seen, duplicates = set(), []
    for b in report.bricks:
        if (b.name, b.kind) in seen and b.name not in duplicates:
            duplicates.append(b.name)
        seen.add((b.name, b.kind))
    if duplicates:
        problems.append(f"duplicate brick name(s) {', '.join(map(repr, duplicates))}")
    zero = [b.name for b in report.bricks if b.count == 0]
    if zero:
        problems.append(f"brick(s) with count 0 listed: {', '.join(map(repr, zero))}")
    missing = [n for n in required if n not in named or named[n].count == 0]
    problems += [s.absent(n) for n in missing]
    # Every name of the per-path view is in the per-name view, with the same number of calls.
    path_counts: Dict[tuple, int] = {}
    seen_paths, dup_paths = set(), []
    for q in report.paths:
        path_counts[q.name, q.kind] = path_counts.get((q.name, q.kind), 0) + q.count
        if (q.path, q.kind) in seen_paths:
            dup_paths.append(q.path)
        seen_paths.add((q.path, q.kind))
    if dup_paths:
        problems.append(f"duplicate path(s) {', '.join(map(repr, dup_paths[:5]))}")
    if report.paths:
        name_counts = {(b.name, b.kind): b.count for b in report.bricks}
        for key in sorted(set(path_counts) | set(name_counts), key=str):
            by_path, by_name = path_counts.get(key, 0), name_counts.get(key, 0)
            if by_path != by_name and key[0] not in duplicates:
                kind = "" if key[1] != "host" else " (host)"
                problems.append(f"brick {key[0]!r}{kind}: {by_name} calls by name but {by_path} "
                                "by path")
    figures = dict(bricks=len(report.bricks), paths=len(report.paths), missing=missing,
                   duplicates=duplicates, zero_count=zero)
    wanted = f" and all {len(required)} required bricks" if required else ""
    if problems:
        return result(FAIL, "; ".join(problems) + f" (expected every brick with count > 0 "
                      f"listed once{wanted})", **figures)
    present = f"; all {len(required)} required bricks present" if required else ""
    return result(PASS, f"{len(report.bricks)} bricks, each listed once with count > 0"
                  f"{present}", **figures)


def avg_agreement(p: dict, s: Subject, result: Result) -> CheckResult:
    tolerance = p["tolerance"]
    raw = s.written
    worst, bad, checked, source = 0.0, [], 0, "file" if raw else "avg_us()"
    for section in ("bricks", "paths"):
        entries = getattr(s.report, section)
        written = getattr(raw, f"{section}_avg_us") if raw else None
        if written is not None and len(written) != len(entries):  # entries changed in memory
            written = None
        for i, b in enumerate(entries):
            figure = written[i] if written is not None else None
            if b.count == 0:
                # Nothing ran: any time or per-call figure is a disagreement, not a pass.
                if b.total_ns != 0 or figure not in (None, 0):
                    bad.append(f"{b.path}: ran 0 times but total_ns {b.total_ns!r}, avg_us "
                               f"{figure!r} (expected 0)")
                continue
            canonical = b.total_ns / b.count / 1000.0
            if figure is None:
                figure = b.avg_us()
            checked += 1
            error = abs(figure - canonical) / canonical if canonical else (
                0.0 if figure == 0 else math.inf)
            worst = max(worst, error)
            if not error <= tolerance:
                bad.append(f"{b.path}: avg_us {figure:.3f}, total_ns/count/1000 = {canonical:.3f} "
                           f"({error:.1%} off)")
    figures = dict(checked=checked, worst_relative_error=worst, source=source)
    if bad:
        shown = "; ".join(bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
        return result(FAIL, f"expected avg_us within {tolerance:.0%} of total_ns / count / "
                      f"1000: {shown}", **figures)
    return result(PASS, f"{checked} per-call figures ({source}) within {tolerance:.0%} of "
                  f"total_ns / count / 1000 (worst {worst:.2e})", **figures)


def measured(p: dict, s: Subject, result: Result) -> CheckResult:
    report = s.report
    problems = []
    if report.wall_ns == 0:
        problems.append(f"wall_ns is {report.wall_ns!r}, expected > 0")
    for section in ("bricks", "paths"):
        for b in getattr(report, section):
            where = f"{section[:-1]} {b.path!r}"
            if b.count == 0:
                continue
            if b.kind == "range" and b.total_ns <= 0:
                problems.append(f"{where}: ran {b.count} times in {b.total_ns} ns")
            # min <= total/count <= max, in integers (no rounding).
            if not (b.min_ns * b.count <= b.total_ns <= b.max_ns * b.count):
                problems.append(f"{where}: avg {b.total_ns / b.count:.0f} ns outside "
                                f"[min {b.min_ns}, max {b.max_ns}]")
            if not (b.min_ns - 1 <= b.p50_ns <= b.max_ns + 1):
                problems.append(f"{where}: p50 {b.p50_ns:.0f} ns outside "
                                f"[min {b.min_ns}, max {b.max_ns}]")
    named = s.named
    totals = [(named[n].total_ns, named[n].count) for n in s.contract.bricks
              if n in named and named[n].count]
    if len(totals) >= 2 and len({t * 1.0 / c for t, c in totals}) == 1:
        problems.append(f"all {len(totals)} required bricks share one avg "
                        f"({totals[0][0] / totals[0][1] / 1e3:.3f} us)")
    for key in p["series"]:
        values, problem = s.figures.get(key)
        if problem:
            problems.append(f"metadata {key}: expected finite values > 0 ({problem})")
        elif values is not None and len(values) >= 3 and len(set(values)) == 1:
            problems.append(f"metadata {key}: all {len(values)} values are {values[0]}")
    for key, kind in s.contract.figures.items():
        if kind == "number" and key in s.figures.problems:
            problems.append(s.figures.problems[key])
    figures = dict(problems=len(problems))
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more"
                                           if len(problems) > 5 else "")
        return result(FAIL, f"expected measured figures: {shown}", **figures)
    return result(PASS, f"{len(report.bricks)} bricks and {len(report.paths)} paths consistent "
                  f"(min <= avg <= max, p50 in range, range bricks > 0 ns, wall "
                  f"{_fmt_ms(report.wall_ns)})", **figures)


def health(p: dict, s: Subject, result: Result) -> CheckResult:
    h = s.report.health
    if not h:
        return result(NA, "report has no health section: cannot tell whether the profiler saw "
                      "every brick")
    problems = []
    for key in p["zero"]:
        if key not in h:
            problems.append(f"health has no {key!r}")
        elif h[key] != 0:
            problems.append(f"{key} {h[key]!r} (expected 0)")
    for key, value in sorted(h.items()):
        if key not in p["zero"] and value != 0 and \
                any(part in key.lower() for part in p["zero_matching"]):
            problems.append(f"{key} {value!r}: bricks ran inside a graph capture or replay the "
                            "profiler did not see (expected 0; disable graph replay while "
                            "profiling)")
    figures = dict(h)
    if problems:
        return result(FAIL, "the profiler missed bricks: " + "; ".join(problems), **figures)
    return result(PASS, "the profiler saw every brick: "
                  + ", ".join(f"{k} {v}" for k, v in sorted(figures.items())), **figures)
