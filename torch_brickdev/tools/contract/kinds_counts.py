"""The contract check kinds that count calls: ``count`` (bricks run as often as formulas over the
metadata figures say) and ``rate`` (a metadata rate divides by the right brick's calls)."""

from __future__ import annotations

import math
from typing import List

from ...argcheck import show_json
from ...terminal import printable

from .numbers import _finite, _fmt_ms, shown
from .report_view import Subject
from .result import FAIL, NA, PASS, CheckResult, Result

__all__ = ["count", "rate"]


def count(p: dict, s: Subject, result: Result) -> CheckResult:
    expect = p["expect"]
    names: List[str] = []
    for formula in expect.values():
        names += [n for n in formula.names if n not in names]
    values = {n: s.figures.get(n) for n in names}
    problems = [problem for _, problem in values.values() if problem]
    if problems:
        return result(FAIL, "; ".join(problems))
    missing = [n for n, (value, _) in values.items() if value is None]
    if missing:
        return result(NA, s.no_metadata(missing))
    given = {n: value for n, (value, _) in values.items()}
    expected, bad = {}, []
    for brick, formula in expect.items():
        try:
            value = formula.evaluate(given)
        except ValueError as error:  # a step divides by zero or leaves the formulas' bounds
            return result(FAIL, f"{printable(brick, limit=60)}: {error}")
        if not (_finite(value) and value >= 0 and value == int(value)):
            with_figures = ", ".join(f"{k}={shown(v)}" for k, v in given.items())
            return result(FAIL, f"{printable(brick, limit=60)}: {formula.text} = {shown(value)}"
                          + (f" with {with_figures}" if with_figures else "")
                          + ": expected a whole number of calls >= 0")
        expected[brick] = int(value)
    found = {n: (s.named[n].count if n in s.named else 0) for n in expected}
    units = f" {p['units']}" if p["units"] else ""
    for brick, want in expected.items():
        formula = expect[brick].text
        how = units if units else ("" if formula == str(want) else f" = {formula}")
        if brick not in s.named and want != 0:
            bad.append(f"{s.absent(brick)}, expected {want}{how}")
        elif found[brick] != want:
            bad.append(f"{brick} ran {found[brick]!r} times, expected {want}{how}")
    notes = [p["explain"]] if p["explain"] else []
    notes += [f"{n} {s.figures.get(n)[0]!r}" for n in p["show"] if n in s.figures.values]
    note = f" ({'; '.join(notes)})" if notes else ""
    prefix = ", ".join(f"{k}={v}" for k, v in given.items())
    prefix = f"{prefix}: " if prefix else ""
    figures = dict(given, expected=expected, found=found)
    if bad:
        return result(FAIL, prefix + "; ".join(bad) + note, **figures)
    return result(PASS, prefix + "; ".join(
        f"{b} ran {found[b]} times" + (f" for {want}{units}" if units else
                                       ("" if expect[b].text == str(want) else
                                        f" ({expect[b].text})"))
        for b, want in expected.items()) + note, **figures)


def rate(p: dict, s: Subject, result: Result) -> CheckResult:
    report = s.report
    tolerance, per, unit = p["tolerance"], p["per"], p["unit"]
    value, rate_problem = s.figures.get(p["rate"])
    series, series_problem = s.figures.get(p["over"])
    if series is not None and not series:
        series_problem = (f"metadata {s.contract.metadata + '.' if s.contract.metadata else ''}"
                          f"{p['over']} is {show_json(series)}: expected a non-empty list of "
                          "finite numbers > 0")
    problems = [q for q in (rate_problem, series_problem) if q]
    if problems:
        return result(FAIL, "; ".join(problems))
    missing = [n for n, v in ((p["rate"], value), (p["over"], series)) if v is None]
    if missing:
        return result(NA, s.no_metadata(missing))
    brick = s.named.get(per)
    if brick is None or brick.count == 0:
        return result(NA, f"no {per} brick: per-{unit} figures have no denominator (see "
                      "completeness)")
    elapsed = sum(float(x) for x in series)  # > 0: every item is; inf on overflow
    total_calls = sum(b.count for b in report.bricks)
    range_calls = sum(b.count for b in report.bricks if b.kind == "range")
    figures = {p["rate"]: value, f"{per}_count": brick.count, "elapsed_ns": elapsed,
               "total_calls": total_calls, "range_calls": range_calls}
    expected = brick.count / elapsed * 1e9
    if not (math.isfinite(elapsed) and math.isfinite(expected) and expected > 0):
        return result(FAIL, f"{p['over']} sums to {elapsed!r} ns for {brick.count} {per} calls: "
                      f"expected a finite per-{unit} rate", **figures)
    figures["expected"] = expected
    if total_calls == brick.count:
        return result(FAIL, f"total brick calls ({total_calls}) equal {per}.count "
                      f"({brick.count}): the denominator is ambiguous", **figures)
    for calls, label in ((total_calls, "total brick calls"), (range_calls, "range-brick calls")):
        naive = calls / elapsed * 1e9
        if calls != brick.count and math.isfinite(naive) and \
                abs(value - naive) <= tolerance * naive:
            return result(FAIL, f"{p['rate']} {value:.1f} is {label} / time ({calls} / "
                          f"{_fmt_ms(elapsed)} = {naive:.1f}): per-{unit} figures must divide "
                          f"by {per}.count ({brick.count}), expected {expected:.1f}", **figures)
    error = abs(value - expected) / expected
    figures["relative_error"] = error
    if not error <= tolerance:
        return result(FAIL, f"{p['rate']} {value:.1f}, expected {per}.count / time = "
                      f"{brick.count} / {_fmt_ms(elapsed)} = {expected:.1f} within "
                      f"{tolerance:.0%} (off by {error:.1%})", **figures)
    return result(PASS, f"{p['rate']} {value:.1f} = {per}.count / time ({brick.count} / "
                  f"{_fmt_ms(elapsed)} = {expected:.1f}, within {error:.2%}); not the "
                  f"{total_calls} total brick calls", **figures)
