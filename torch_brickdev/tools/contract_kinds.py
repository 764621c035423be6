"""The check kinds a contract's checks are instances of: each ``kind(check, subject)`` reads a
validated report (:class:`Subject`) and returns a :class:`CheckResult` whose message says what
was expected and what was found. contract_file.KINDS lists each kind's parameters."""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..argcheck import show_json
from ..profiler import BrickStats, Report, ReportError, SyncMode, WrittenFigures

from .contract_file import Check, Contract, FIGURE_KINDS

__all__ = ["CheckResult", "FAIL", "INCONCLUSIVE", "KIND_BODIES", "NA", "PASS", "STATUSES",
           "Subject", "cv", "run_check", "subject"]

PASS, FAIL, NA = "pass", "fail", "n/a"
# A timing check whose failure the time the machine denied the process explains: neither a pass
# nor a defect of the program or the profiler.
INCONCLUSIVE = "inconclusive"
STATUSES = (PASS, FAIL, INCONCLUSIVE, NA)


@dataclass
class CheckResult:
    """The outcome of one check: ``status`` is ``"pass"``, ``"fail"``, ``"inconclusive"`` (a
    timing check whose failure a busy machine explains) or ``"n/a"``; ``message`` says what was
    expected and what was found; ``figures`` holds the numbers behind it."""

    id: str
    title: str
    status: str
    message: str
    figures: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in ("id", "title", "message"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"CheckResult: {name} must be a str, got "
                                f"{type(getattr(self, name)).__name__}")
        if not isinstance(self.status, str) or self.status not in STATUSES:
            raise ValueError(f"CheckResult: status must be one of "
                             f"{', '.join(map(repr, STATUSES))}, got {self.status!r}")
        if not isinstance(self.figures, dict):
            raise TypeError(f"CheckResult: figures must be a dict, got "
                            f"{type(self.figures).__name__}")

    @property
    def passed(self) -> bool:
        return self.status == PASS

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    @property
    def inconclusive(self) -> bool:
        return self.status == INCONCLUSIVE


# ---- what the checks read, validated once -------------------------------------------------------
#
# The report reader (load_report) and Report.validate() guarantee every figure of a report:
# integer counts and nanoseconds, finite percentiles, a known sync mode, counters in health.
# The free-form metadata holds any JSON: the figures a contract declares are read once.


def _finite(x) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an int beyond float range: no arithmetic on it is meaningful
        return False


def _positive(x) -> bool:
    return _finite(x) and x > 0


def _figure_problem(where: str, key: str, kind: str, value) -> Optional[str]:
    """Why ``value`` cannot be the figure ``key`` declared as ``kind`` (None when it can)."""
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
                return f"metadata {where}{key}[{i}] is {show_json(item)}: expected {expected}"
        ok = True
    elif not isinstance(value, (list, tuple)):
        ok = False
    else:
        for i, item in enumerate(value):
            if not _positive(item):
                return f"metadata {where}{key}[{i}] is {show_json(item)}: expected {expected}"
        ok = True
    return None if ok else f"metadata {where}{key} is {show_json(value)}: expected {expected}"


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
            problem = _figure_problem(where, key, kind, table[key])
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
    for b in report.bricks:
        named.setdefault(b.name, b)
    return Subject(report, contract, SyncMode.parse(report.sync_mode), named,
                   read_figures(report.metadata, contract, overrides), report.written)


def cv(values: Sequence[float]) -> float:
    """Sample standard deviation / mean; NaN when a value is not finite, Infinity when the mean
    is not > 0. Scaled by the largest value first, so that no sum can overflow."""
    if not all(_finite(v) for v in values):
        return math.nan
    xs = [float(v) for v in values]
    scale = max(abs(x) for x in xs)
    if scale == 0:
        return math.inf
    xs = [x / scale for x in xs]
    mean = math.fsum(xs) / len(xs)
    if mean <= 0:
        return math.inf
    variance = math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    return math.sqrt(variance) / mean


def _denied(s: Subject) -> Optional[Tuple[float, str]]:
    """(share of the wall the profiling thread waited for a CPU, how it was measured) from the
    report's machine section; None when the report has none (or an unusable one)."""
    share = s.report.machine.get("denied_share")
    if not _finite(share) or not 0 <= share <= 1:
        return None
    source = s.report.machine.get("denied_source")
    return float(share), source if isinstance(source, str) else "unknown"


def _fmt_ms(ns: float) -> str:
    return f"{ns / 1e6:.3f} ms"


def run_check(check: Check, s: Subject) -> CheckResult:
    """Runs one check on a subject; never raises for what the report holds."""
    def result(status: str, message: str, /, **figures) -> CheckResult:
        # positional-only: a figure (a health counter, say) may be named "status" or "message"
        return CheckResult(check.id, check.title, status, message, figures)
    if s.invalid is not None:
        return result(FAIL, f"the report breaks the rules of a report, so none of its figures "
                      f"is checked: {s.invalid}")
    if check.modes is not None and s.mode.value not in check.modes:
        return result(NA, f"applies in {', '.join(check.modes)} mode only; the report was timed "
                      f"in {s.mode.value} mode", sync_mode=s.mode.value)
    try:
        return KIND_BODIES[check.kind](check.params, s, result)
    except Exception as error:  # a check must never hide the others
        return result(FAIL, f"check raised {type(error).__name__}: {error}")


# ---- the kinds ---------------------------------------------------------------------------------

Result = Callable[..., CheckResult]


def coverage(p: dict, s: Subject, result: Result) -> CheckResult:
    report = s.report
    low, high = p["min"], p["max"]
    wall = report.wall_ns
    if wall == 0:
        return result(FAIL, f"wall time is {wall!r} ns: expected a measured region (a finite "
                      "number > 0)", wall_ns=wall)
    top = report.top_level_ns()
    ratio = top / wall
    status = PASS if low <= ratio <= high else FAIL
    message = (f"top-level {ratio:.2f} of wall (expected {low}-{high}): {_fmt_ms(top)} of "
               f"{_fmt_ms(wall)}")
    denied = _denied(s)
    explained = False
    if ratio < low:
        if denied is not None and ratio + denied[0] >= low:
            # Waiting for a CPU stretched the region: at worst all of it fell between bricks.
            explained = True
            message += (f"; but the thread waited for a CPU {denied[0]:.0%} of the wall (other "
                        f"processes ran; {denied[1]}), which accounts for the gap: "
                        f"{ratio:.2f} + {denied[0]:.2f} >= {low}")
        else:
            message += "; bricks are hidden (e.g. by graph replay) or work runs outside them"
            if denied is not None:
                message += (f" (the machine denied the thread only {denied[0]:.0%} of the "
                            "wall: not a busy machine)")
    elif ratio > high:
        message += "; time is counted twice"
    if explained:
        status = INCONCLUSIVE
    # The file's own copies of the figures must agree with what they derive from.
    written_top, written_wall_s = (s.written.top_level_ns, s.written.wall_s) if s.written \
        else (None, None)
    if written_top is not None and written_top != top:
        status = FAIL
        message += (f"; the file's top_level_ns {written_top} disagrees with its top-level "
                    f"paths ({top} ns)")
    if written_wall_s is not None and not abs(written_wall_s - wall / 1e9) <= 1e-9 * max(
            1.0, wall / 1e9):
        status = FAIL
        message += (f"; the file's wall_s {written_wall_s!r} disagrees with wall_ns / 1e9 "
                    f"({wall / 1e9!r})")
    return result(status, message, coverage=ratio, top_level_ns=top, wall_ns=wall,
                  denied_share=denied[0] if denied else None)


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
        value = formula.evaluate(given)
        if not (_finite(value) and value >= 0 and value == int(value)):
            return result(FAIL, f"{brick}: {formula.text} = {value!r} with "
                          + ", ".join(f"{k}={v}" for k, v in given.items())
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


_METRIC_US = {"avg": lambda b: b.avg_us(), "p50": lambda b: b.p50_ns / 1e3,
              "p90": lambda b: b.p90_ns / 1e3, "p99": lambda b: b.p99_ns / 1e3,
              "total": lambda b: b.total_ns / 1e3}


def ordering(p: dict, s: Subject, result: Result) -> CheckResult:
    order, ratios, by = p["order"], p["ratios"], p["by"]
    names = list(order) + [n for r in ratios for n in (r["above"], r["below"])
                           if n not in order]
    names = list(dict.fromkeys(names))
    required = set(s.contract.bricks)
    missing = [n for n in names if n not in s.named or s.named[n].count == 0]
    if missing:
        unseen = [n for n in missing if n not in required]
        if unseen:  # not covered by completeness: the contract's expectation fails here
            return result(FAIL, "cannot order: " + "; ".join(s.absent(n) for n in unseen))
        return result(NA, f"cannot order: brick(s) {', '.join(missing)} never ran (see "
                      "completeness)")
    value = {n: _METRIC_US[by](s.named[n]) for n in names}
    figures = {f"{n}_{by}_us": value[n] for n in names}
    found = ", ".join(f"{n} {value[n]:.2f} us" for n in names)
    shown, ok, expected = [], len(order) < 2 or all(
        value[a] > value[b] for a, b in zip(order, order[1:])), [" > ".join(order)] if order \
        else []
    for r in ratios:
        above, below, factor = r["above"], r["below"], r["factor"]
        ratio = value[above] / value[below] if value[below] > 0 else math.inf
        figures[f"{above}_over_{below}"] = ratio
        shown.append(f"{above}/{below} {ratio:.1f}x")
        if r["modes"] is None or s.mode.value in r["modes"]:
            mode = f" ({s.mode.value} mode)" if r["modes"] is not None else ""
            expected.append(f"{above} > {factor:g} x {below}{mode}")
            ok = ok and value[above] > factor * value[below]
    if shown:
        found += f" ({', '.join(shown)})"
    what = "" if by == "avg" else f" ({by} per call)"
    message = f"{found}; expected {' and '.join(expected)}{what}"
    denied = _denied(s)
    if not ok and by != "p50" and denied is not None and denied[0] >= p["busy"]:
        # A preempted call of a short brick moves its mean; the median needs most calls slowed.
        median = {n: s.named[n].p50_ns for n in names}
        holds = all(median[a] > median[b] for a, b in zip(order, order[1:])) and all(
            median[r["above"]] > r["factor"] * median[r["below"]] for r in ratios
            if r["modes"] is None or s.mode.value in r["modes"])
        if holds:
            return result(INCONCLUSIVE, f"{message}; but the thread waited for a CPU "
                          f"{denied[0]:.0%} of the wall (other processes ran; {denied[1]}) and "
                          f"the order holds by the median call ("
                          + ", ".join(f"{n} {median[n] / 1e3:.2f} us" for n in names) + ")",
                          **figures, denied_share=denied[0])
    return result(PASS if ok else FAIL, message, **figures)


def sync_mode(p: dict, s: Subject, result: Result) -> CheckResult:
    mode = s.mode
    declared = s.figures.get(p["declared"])[0] if p["declared"] else None
    if declared is not None and str(declared).lower() != mode.value:
        return result(FAIL, f"the run asked for sync mode {declared!r} but the profiler timed "
                      f"in {mode.value!r}: the mode did not reach the executor",
                      sync_mode=mode.value, declared=declared)
    compared = s.contract.bricks or [b.name for b in s.report.bricks]
    avgs = {n: s.named[n].avg_us() for n in compared if n in s.named and s.named[n].count}
    spread_cv = cv(list(avgs.values())) if len(avgs) >= 2 else None
    figures = dict(sync_mode=mode.value, named_bricks=len(avgs), avg_us_cv=spread_cv)
    spread = (f"CV of avg_us across {len(avgs)} named bricks {spread_cv:.2f}"
              if spread_cv is not None else "fewer than 2 named bricks to compare")
    if mode is SyncMode.DEFERRED:
        message = (f"deferred: launch cost, not device time: durations measure the CPU side of "
                   f"launching each brick (on an asynchronous device they cluster near one "
                   f"value); {spread}")
    elif mode is SyncMode.IMMEDIATE:
        message = (f"immediate: device time: the device is synchronized at every brick's start "
                   f"and stop; {spread}")
    else:
        message = (f"event: device time: device events recorded on the stream at every brick's "
                   f"start and stop; {spread}")
    return result(PASS, message, **figures)


def completeness(p: dict, s: Subject, result: Result) -> CheckResult:
    report, named, required = s.report, s.named, s.contract.bricks
    problems = []
    seen, duplicates = set(), []
    for b in report.bricks:
        if b.name in seen and b.name not in duplicates:
            duplicates.append(b.name)
        seen.add(b.name)
    if duplicates:
        problems.append(f"duplicate brick name(s) {', '.join(map(repr, duplicates))}")
    zero = [b.name for b in report.bricks if b.count == 0]
    if zero:
        problems.append(f"brick(s) with count 0 listed: {', '.join(map(repr, zero))}")
    missing = [n for n in required if n not in named or named[n].count == 0]
    problems += [s.absent(n) for n in missing]
    # Every name of the per-path view is in the per-name view, with the same number of calls.
    path_counts: Dict[str, int] = {}
    seen_paths, dup_paths = set(), []
    for q in report.paths:
        path_counts[q.name] = path_counts.get(q.name, 0) + q.count
        if q.path in seen_paths:
            dup_paths.append(q.path)
        seen_paths.add(q.path)
    if dup_paths:
        problems.append(f"duplicate path(s) {', '.join(map(repr, dup_paths[:5]))}")
    if report.paths:
        for name in sorted(set(path_counts) | set(named), key=str):
            by_path, by_name = path_counts.get(name, 0), named[name].count if name in named else 0
            if by_path != by_name and name not in duplicates:
                problems.append(f"brick {name!r}: {by_name} calls by name but {by_path} by path")
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


def _series_word(key: str) -> str:
    return "median" if "median" in key else "mean" if "mean" in key else key


def stability(p: dict, s: Subject, result: Result) -> CheckResult:
    series, max_cv, unit = p["series"], p["max_cv"], p["unit"]
    key = next((k for k in series if s.figures.get(k) != (None, None)), series[0])
    what = _series_word(key)
    runs, problem = s.figures.get(key)
    if problem:
        return result(FAIL, problem)
    if runs is None:
        return result(NA, s.no_metadata([" or ".join(series)]))
    if len(runs) < 2:
        return result(NA, f"{len(runs)} run(s): the coefficient of variation needs at least 2",
                      runs=len(runs))
    spread = cv(runs)
    status = PASS if spread < max_cv else FAIL
    message = (f"CV of per-{unit} time ({what} of each run) across {len(runs)} runs "
               f"{spread:.3f} (expected < {max_cv}); run {what}s "
               + ", ".join(f"{x / 1e3:.1f}" for x in runs) + " us")
    figures = dict(cv=spread, runs=len(runs), figure=key, **{key: list(runs)})
    shares, shares_problem = s.figures.get(p["denied"]) if p["denied"] else (None, None)
    if status == FAIL and shares_problem:  # cannot excuse a failure, says why
        message += f"; {shares_problem}"
    if status == FAIL and shares is not None and len(shares) == len(runs):
        busy = p["busy"]
        figures[p["denied"]] = list(shares)
        descheduled = [f"run {i + 1} {d:.0%}" for i, d in enumerate(shares) if d >= busy]
        quiet = [r for r, d in zip(runs, shares) if d < busy]
        if descheduled:
            denied = (f"; the machine was busy: the thread waited for a CPU "
                      f"{', '.join(descheduled)} of the run")
            if len(quiet) < 2:
                return result(INCONCLUSIVE, message + denied + f"; fewer than 2 runs ran "
                              f"undisturbed (< {busy:.0%}), so stability cannot be judged",
                              **figures)
            quiet_cv = cv(quiet)
            figures["undisturbed_cv"] = quiet_cv
            if quiet_cv < max_cv:
                return result(INCONCLUSIVE, message + denied + f"; the {len(quiet)} undisturbed "
                              f"runs agree (CV {quiet_cv:.3f}): the runs that differ are the "
                              "ones the machine descheduled", **figures)
            message += denied + f"; the {len(quiet)} undisturbed runs differ too (CV " \
                                f"{quiet_cv:.3f})"
        else:
            message += f"; no run was descheduled (each waited < {busy:.0%} for a CPU)"
    return result(status, message, **figures)


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


_LIMIT_FIGURES = {"avg_us": ("avg", lambda b, wall: b.avg_us(), "us"),
                  "p50_us": ("p50", lambda b, wall: b.p50_ns / 1e3, "us"),
                  "p99_us": ("p99", lambda b, wall: b.p99_ns / 1e3, "us"),
                  "max_us": ("max", lambda b, wall: b.max_ns / 1e3, "us"),
                  "share": ("share of wall", lambda b, wall: b.total_ns / wall, "")}


def budget(p: dict, s: Subject, result: Result) -> CheckResult:
    wall = s.report.wall_ns
    over, within, figures = [], [], {}
    for name, limits in p["limits"].items():
        brick = s.named.get(name)
        if brick is None or brick.count == 0:
            over.append(s.absent(name) + ": its budget cannot be checked")
            continue
        for key, limit in limits.items():
            label, measure, unit = _LIMIT_FIGURES[key]
            if key == "share" and wall == 0:
                over.append(f"{name}: wall time is 0 ns, so no share of it can be checked")
                continue
            value = measure(brick, wall)
            figures[f"{name}_{key}"] = value
            shown = (f"{value:.1%} (budget {limit:.1%})" if key == "share" else
                     f"{value:.2f} {unit} (budget {limit:g} {unit})")
            (over if value > limit else within).append(f"{name} {label} {shown}")
    if over:
        return result(FAIL, "over budget: " + "; ".join(over)
                      + (f"; within: {'; '.join(within)}" if within else ""), **figures)
    return result(PASS, "within budget: " + "; ".join(within), **figures)


KIND_BODIES: Dict[str, Callable[[dict, Subject, Result], CheckResult]] = {
    "coverage": coverage, "count": count, "rate": rate, "ordering": ordering,
    "sync-mode": sync_mode, "completeness": completeness, "avg-agreement": avg_agreement,
    "stability": stability, "measured": measured, "health": health, "budget": budget,
}
