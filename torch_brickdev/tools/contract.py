"""Checks of the decode-profiling contract (``gpu-decode-profiling-v1``) over a brick report.

A report of an autoregressive decode of ``T`` tokens through an ``L``-layer model (as written by
the demo: fourteen top-level range bricks, ``Embedding`` … ``Sampling``, and
``metadata["decode"]``) is checked against eleven invariants, each a function
``check_xxx(report) -> CheckResult`` listed in :data:`CHECKS` under a stable id:

==================  ======================================================================
``coverage``        top-level brick time / wall time is in [0.85, 1.0]
``lmhead-count``    ``LmHead.count`` equals the decoded tokens
``token-accounting``per-token figures divide by ``LmHead.count``, never by total brick calls
``per-call-ordering`` ``LmHead.avg > GateProjection.avg > RmsNorm.avg`` (and > 10x RmsNorm in
                    immediate and event modes)
``sync-mode``       the sync mode is recognised and says what the durations measure
``completeness``    every brick ran, names are unique, the fourteen decode bricks are present
``avg-agreement``   a report's per-call figure agrees with ``total_ns / count / 1000`` (1%)
``structure``       attention bricks ran ``T x L`` times, RmsNorm ``(2L + 1) x T`` times
``stability``       coefficient of variation of per-token time (each run's median) across
                    runs < 0.15
``no-placeholders`` every figure is a measurement (consistent min/avg/max, nothing zero)
``graph-capture``   the profiler saw every brick: no capture skipped, no timing lost
==================  ======================================================================

Command line: ``python -m torch_brickdev.tools.contract report.json [--layers L] [--tokens T]
[--only id,id]``; exit status 0 when nothing failed, 1 when a check failed, 2 when the report
cannot be read.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from ..argcheck import show_json
from ..profiler import BrickStats, Report, ReportError, SyncMode, WrittenFigures, load_report

from ._args import positive_int

__all__ = [
    "CHECKS",
    "CheckResult",
    "DECODE_BRICKS",
    "ReportError",
    "failures",
    "format_results",
    "load",
    "main",
    "run_checks",
]

#: The top-level range bricks of one decode step, in execution order.
DECODE_BRICKS = (
    "Embedding", "RmsNorm", "QkvProjection", "RopeEmbedding", "AttentionScore",
    "AttentionSoftmax", "AttentionOutput", "OutputProjection", "GateProjection",
    "UpProjection", "Activation", "DownProjection", "LmHead", "Sampling",
)
ATTENTION_BRICKS = ("AttentionScore", "AttentionSoftmax", "AttentionOutput")

COVERAGE_MIN = 0.85
COVERAGE_MAX = 1.0
TOKEN_RATE_TOLERANCE = 0.01
AVG_TOLERANCE = 0.01
ORDERING_FACTOR = 10.0
STABILITY_MAX_CV = 0.15

PASS, FAIL, NA = "pass", "fail", "n/a"
_NO_METADATA = "report has no decode metadata ({}): run the demo or pass them"


@dataclass
class CheckResult:
    """The outcome of one check: ``status`` is ``"pass"``, ``"fail"`` or ``"n/a"``; ``message``
    says what was expected and what was found; ``figures`` holds the numbers behind it."""

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
        if self.status not in (PASS, FAIL, NA) or not isinstance(self.status, str):
            raise ValueError(f"CheckResult: status must be one of {PASS!r}, {FAIL!r}, {NA!r}, "
                             f"got {self.status!r}")
        if not isinstance(self.figures, dict):
            raise TypeError(f"CheckResult: figures must be a dict, got "
                            f"{type(self.figures).__name__}")

    @property
    def passed(self) -> bool:
        return self.status == PASS

    @property
    def failed(self) -> bool:
        return self.status == FAIL


# ---- what the checks read, validated once -------------------------------------------------------
#
# The report reader (load_report) and Report.validate() guarantee every figure of a report:
# integer counts and nanoseconds, finite percentiles, a known sync mode, counters in health.
# The free-form metadata holds any JSON: its decode figures are read once, into _Decode.


def _finite(x) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an int beyond float range: no arithmetic on it is meaningful
        return False


def _positive(x) -> bool:
    return _finite(x) and x > 0


# What each decode figure must be, as the messages say it. A decode of 0 tokens or layers has
# nothing to check; an empty series has no figure to judge (token-accounting needs one).
_INT, _NUMBER, _SERIES = "a positive integer", "a finite number > 0", "a list of finite numbers > 0"
_DECODE_FIGURES = {
    "layers": _INT, "tokens": _INT, "tokens_per_s": _NUMBER, "p50_token_ns": _NUMBER,
    "p99_token_ns": _NUMBER, "token_latencies_ns": _SERIES, "run_median_token_ns": _SERIES,
    "run_mean_token_ns": _SERIES,
}

# The per-run figure the stability check compares: each run's median per-token time (a few
# tokens slowed by another process on the machine move a run's mean, not its median). Reports
# written before the demo recorded medians carry each run's mean only; that is read instead.
STABILITY_FIGURES = ("run_median_token_ns", "run_mean_token_ns")


@dataclass(frozen=True)
class _Decode:
    """``metadata["decode"]`` of a report (with the layers / tokens overrides), read once: each
    figure the checks use, None when absent; ``problems[key]`` says why a present figure is
    unusable (its value is then None)."""

    layers: Optional[int] = None
    tokens: Optional[int] = None
    tokens_per_s: Optional[float] = None
    p50_token_ns: Optional[float] = None
    p99_token_ns: Optional[float] = None
    token_latencies_ns: Optional[Sequence[float]] = None
    run_median_token_ns: Optional[Sequence[float]] = None
    run_mean_token_ns: Optional[Sequence[float]] = None
    sync_mode: object = None  # the mode the run asked for, as written
    final_token: object = None
    problems: Dict[str, str] = field(default_factory=dict)

    def get(self, key: str) -> Tuple[Optional[object], Optional[str]]:
        """``(value, None)``; ``(None, None)`` when absent; ``(None, problem)``."""
        return getattr(self, key), self.problems.get(key)


def _decode_problem(key: str, value) -> Optional[str]:
    """Why ``value`` cannot be the decode figure ``key`` (None when it can)."""
    expected = _DECODE_FIGURES[key]
    if expected == _INT:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    elif expected == _NUMBER:
        ok = _positive(value)
    elif not isinstance(value, (list, tuple)):
        ok = False
    else:
        for i, item in enumerate(value):
            if not _positive(item):
                return f"metadata decode.{key}[{i}] is {show_json(item)}: expected {expected}"
        ok = True
    return None if ok else f"metadata decode.{key} is {show_json(value)}: expected {expected}"


def _read_decode(metadata: dict, overrides: Dict[str, int]) -> _Decode:
    decode = metadata.get("decode")
    decode = {**(decode if isinstance(decode, dict) else {}), **overrides}
    values, problems = {}, {}
    for key in _DECODE_FIGURES:
        if key in decode:
            problem = _decode_problem(key, decode[key])
            if problem:
                problems[key] = problem
            else:
                values[key] = decode[key]
    return _Decode(**values, sync_mode=decode.get("sync_mode"),
                   final_token=decode.get("final_token"), problems=problems)


@dataclass(frozen=True)
class _Subject:
    """A report as the checks read it: validated, the bricks by name (the first of duplicated
    names; completeness reports duplicates), its decode metadata read. ``invalid``: why the
    report breaks the rules of a report (then every check fails, saying so)."""

    report: Report
    mode: Optional[SyncMode] = None
    named: Dict[str, BrickStats] = field(default_factory=dict)
    decode: _Decode = field(default_factory=_Decode)
    written: Optional[WrittenFigures] = None  # of a report read from a file or dict
    invalid: Optional[str] = None


def _subject(report: Report, validated: bool, overrides: Dict[str, int]) -> _Subject:
    """``report`` read for the checks; a report from the reader is ``validated`` already, one
    built or changed in memory is validated here."""
    if not validated:
        try:
            report.validate()
        except ReportError as error:
            return _Subject(report, invalid=str(error))
    named = {}
    for b in report.bricks:
        named.setdefault(b.name, b)
    return _Subject(report, SyncMode.parse(report.sync_mode), named,
                    _read_decode(report.metadata, overrides), report.written)


def _cv(values: Sequence[float]) -> float:
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


def _result(check_id: str, status: str, message: str, /, **figures) -> CheckResult:
    # positional-only: a figure (a health counter, say) may be named "status" or "message"
    return CheckResult(check_id, _TITLES[check_id], status, message, figures)


def _fmt_ms(ns: float) -> str:
    return f"{ns / 1e6:.3f} ms"


_BODIES: Dict[str, Callable[[_Subject], CheckResult]] = {}


def _check(check_id: str):
    """Registers ``body(s: _Subject)`` as the check ``check_id``; returns the public function of
    the same name, which takes a Report (run_checks validates a report once, then runs bodies)."""
    def register(body):
        _BODIES[check_id] = body

        def check(report: Report) -> CheckResult:
            if not isinstance(report, Report):
                raise TypeError(f"{body.__name__}: report must be a Report (see load()), got "
                                f"{type(report).__name__}")
            return _run(check_id, _subject(report, False, {}))

        check.__name__ = check.__qualname__ = body.__name__
        check.__doc__ = body.__doc__
        return check
    return register


def _run(check_id: str, s: _Subject) -> CheckResult:
    if s.invalid is not None:
        return _result(check_id, FAIL, f"the report breaks the rules of a report, so none of its "
                       f"figures is checked: {s.invalid}")
    return _BODIES[check_id](s)


# ---- the checks -------------------------------------------------------------------------------


@_check("coverage")
def check_coverage(s: _Subject) -> CheckResult:
    report = s.report
    wall = report.wall_ns
    if wall == 0:
        return _result("coverage", FAIL, f"wall time is {wall!r} ns: expected a measured region "
                       "(a finite number > 0)", wall_ns=wall)
    top = report.top_level_ns()
    ratio = top / wall
    status = PASS if COVERAGE_MIN <= ratio <= COVERAGE_MAX else FAIL
    message = (f"top-level {ratio:.2f} of wall (expected {COVERAGE_MIN}-{COVERAGE_MAX}): "
               f"{_fmt_ms(top)} of {_fmt_ms(wall)}")
    if ratio < COVERAGE_MIN:
        message += "; bricks are hidden (e.g. by graph replay) or work runs outside them"
    elif ratio > COVERAGE_MAX:
        message += "; time is counted twice"
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
    return _result("coverage", status, message, coverage=ratio, top_level_ns=top, wall_ns=wall)


@_check("lmhead-count")
def check_lmhead_count(s: _Subject) -> CheckResult:
    tokens, problem = s.decode.get("tokens")
    if problem:
        return _result("lmhead-count", FAIL, problem)
    if tokens is None:
        return _result("lmhead-count", NA, _NO_METADATA.format("tokens"))
    lm = s.named.get("LmHead")
    count = lm.count if lm is not None else 0
    final = s.decode.final_token
    how = ("one LmHead per decoded token; the final sampled token is counted as decoded (its "
           "logits come from its own LmHead) and no forward pass runs after it")
    if isinstance(final, str):
        how += f"; final token {final!r}"
    if count == tokens:
        return _result("lmhead-count", PASS, f"LmHead ran {count} times for {tokens} decoded "
                       f"tokens ({how})", lmhead_count=count, tokens=tokens, final_token=final)
    found = "never ran" if lm is None else f"ran {count!r} times"
    return _result("lmhead-count", FAIL, f"expected LmHead.count == {tokens} decoded tokens "
                   f"({how}); LmHead {found}", lmhead_count=count, tokens=tokens,
                   final_token=final)


@_check("token-accounting")
def check_token_accounting(s: _Subject) -> CheckResult:
    report = s.report
    rate, rate_problem = s.decode.get("tokens_per_s")
    latencies, latency_problem = s.decode.get("token_latencies_ns")
    if latencies is not None and not latencies:
        latency_problem = (f"metadata decode.token_latencies_ns is {show_json(latencies)}: "
                           f"expected a non-empty list of finite numbers > 0")
    problems = [p for p in (rate_problem, latency_problem) if p]
    if problems:
        return _result("token-accounting", FAIL, "; ".join(problems))
    missing = [n for n, v in (("tokens_per_s", rate), ("token_latencies_ns", latencies))
               if v is None]
    if missing:
        return _result("token-accounting", NA, _NO_METADATA.format(", ".join(missing)))
    lm = s.named.get("LmHead")
    if lm is None or lm.count == 0:
        return _result("token-accounting", NA, "no LmHead brick: per-token figures have no "
                       "denominator (see completeness)")
    elapsed = sum(float(x) for x in latencies)  # > 0: every latency is; inf on overflow
    total_calls = sum(b.count for b in report.bricks)
    range_calls = sum(b.count for b in report.bricks if b.kind == "range")
    figures = dict(tokens_per_s=rate, lmhead_count=lm.count, decode_ns=elapsed,
                   total_calls=total_calls, range_calls=range_calls)
    expected = lm.count / elapsed * 1e9
    if not (math.isfinite(elapsed) and math.isfinite(expected) and expected > 0):
        return _result("token-accounting", FAIL, f"token latencies sum to {elapsed!r} ns for "
                       f"{lm.count} LmHead calls: expected a finite per-token rate", **figures)
    figures["expected_tokens_per_s"] = expected
    if total_calls == lm.count:
        return _result("token-accounting", FAIL, f"total brick calls ({total_calls}) equal "
                       f"LmHead.count ({lm.count}): the denominator is ambiguous", **figures)
    for calls, label in ((total_calls, "total brick calls"), (range_calls, "range-brick calls")):
        naive = calls / elapsed * 1e9
        if calls != lm.count and math.isfinite(naive) and \
                abs(rate - naive) <= TOKEN_RATE_TOLERANCE * naive:
            return _result("token-accounting", FAIL, f"tokens_per_s {rate:.1f} is {label} / time "
                           f"({calls} / {_fmt_ms(elapsed)} = {naive:.1f}): per-token figures "
                           f"must divide by LmHead.count ({lm.count}), expected {expected:.1f}",
                           **figures)
    error = abs(rate - expected) / expected
    figures["relative_error"] = error
    if not error <= TOKEN_RATE_TOLERANCE:
        return _result("token-accounting", FAIL, f"tokens_per_s {rate:.1f}, expected LmHead.count"
                       f" / time = {lm.count} / {_fmt_ms(elapsed)} = {expected:.1f} within "
                       f"{TOKEN_RATE_TOLERANCE:.0%} (off by {error:.1%})", **figures)
    return _result("token-accounting", PASS, f"tokens_per_s {rate:.1f} = LmHead.count / time "
                   f"({lm.count} / {_fmt_ms(elapsed)} = {expected:.1f}, within {error:.2%}); "
                   f"not the {total_calls} total brick calls", **figures)


@_check("per-call-ordering")
def check_per_call_ordering(s: _Subject) -> CheckResult:
    named = s.named
    missing = [n for n in ("LmHead", "GateProjection", "RmsNorm")
               if n not in named or named[n].count == 0]
    if missing:
        return _result("per-call-ordering", NA, f"cannot order: brick(s) {', '.join(missing)} "
                       "never ran (see completeness)")
    lm, gate, norm = (named[n].avg_us() for n in ("LmHead", "GateProjection", "RmsNorm"))
    mode = s.mode
    need_factor = mode in (SyncMode.IMMEDIATE, SyncMode.EVENT)
    ratio = lm / norm if norm > 0 else math.inf
    figures = dict(lmhead_avg_us=lm, gate_avg_us=gate, rmsnorm_avg_us=norm,
                   lmhead_over_rmsnorm=ratio)
    found = (f"LmHead {lm:.2f} us, GateProjection {gate:.2f} us, RmsNorm {norm:.2f} us "
             f"(LmHead/RmsNorm {ratio:.1f}x)")
    expected = "LmHead > GateProjection > RmsNorm"
    if need_factor:
        expected += f" and LmHead > {ORDERING_FACTOR:g} x RmsNorm ({mode.value} mode)"
    ok = lm > gate > norm and (not need_factor or lm > ORDERING_FACTOR * norm)
    return _result("per-call-ordering", PASS if ok else FAIL,
                   f"{found}; expected {expected}", **figures)


@_check("sync-mode")
def check_sync_mode(s: _Subject) -> CheckResult:
    mode = s.mode
    declared = s.decode.sync_mode
    if declared is not None and str(declared).lower() != mode.value:
        return _result("sync-mode", FAIL, f"the run asked for sync mode {declared!r} but the "
                       f"profiler timed in {mode.value!r}: the mode did not reach the executor",
                       sync_mode=mode.value, declared=declared)
    named = s.named
    avgs = {n: named[n].avg_us() for n in DECODE_BRICKS if n in named and named[n].count}
    cv = _cv(list(avgs.values())) if len(avgs) >= 2 else None
    figures = dict(sync_mode=mode.value, named_bricks=len(avgs), avg_us_cv=cv)
    spread = f"CV of avg_us across {len(avgs)} named bricks {cv:.2f}" if cv is not None else \
        "fewer than 2 named bricks to compare"
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
    return _result("sync-mode", PASS, message, **figures)


@_check("completeness")
def check_completeness(s: _Subject) -> CheckResult:
    report, named = s.report, s.named
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
    missing = [n for n in DECODE_BRICKS if n not in named or named[n].count == 0]
    problems += [f"brick {n!r} never ran" for n in missing]
    # Every name of the per-path view is in the per-name view, with the same number of calls.
    path_counts: Dict[str, int] = {}
    seen_paths, dup_paths = set(), []
    for p in report.paths:
        path_counts[p.name] = path_counts.get(p.name, 0) + p.count
        if p.path in seen_paths:
            dup_paths.append(p.path)
        seen_paths.add(p.path)
    if dup_paths:
        problems.append(f"duplicate path(s) {', '.join(map(repr, dup_paths[:5]))}")
    if report.paths:
        for name in sorted(set(path_counts) | set(named), key=str):
            by_path, by_name = path_counts.get(name, 0), named[name].count if name in named else 0
            if by_path != by_name and name not in duplicates:
                problems.append(f"brick {name!r}: {by_name} calls by name but {by_path} by path")
    figures = dict(bricks=len(report.bricks), paths=len(report.paths), missing=missing,
                   duplicates=duplicates, zero_count=zero)
    if problems:
        return _result("completeness", FAIL, "; ".join(problems) + f" (expected every brick with "
                       f"count > 0 listed once and all {len(DECODE_BRICKS)} decode bricks)",
                       **figures)
    return _result("completeness", PASS, f"{len(report.bricks)} bricks, each listed once with "
                   f"count > 0; all {len(DECODE_BRICKS)} decode bricks present", **figures)


@_check("avg-agreement")
def check_avg_agreement(s: _Subject) -> CheckResult:
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
            error = abs(figure - canonical) / canonical if canonical else (0.0 if figure == 0 else math.inf)
            worst = max(worst, error)
            if not error <= AVG_TOLERANCE:
                bad.append(f"{b.path}: avg_us {figure:.3f}, total_ns/count/1000 = {canonical:.3f} "
                           f"({error:.1%} off)")
    figures = dict(checked=checked, worst_relative_error=worst, source=source)
    if bad:
        shown = "; ".join(bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
        return _result("avg-agreement", FAIL, f"expected avg_us within {AVG_TOLERANCE:.0%} of "
                       f"total_ns / count / 1000: {shown}", **figures)
    return _result("avg-agreement", PASS, f"{checked} per-call figures ({source}) within "
                   f"{AVG_TOLERANCE:.0%} of total_ns / count / 1000 (worst {worst:.2e})", **figures)


@_check("structure")
def check_structure(s: _Subject) -> CheckResult:
    (layers, layers_problem), (tokens, tokens_problem) = (
        s.decode.get("layers"), s.decode.get("tokens"))
    problems = [p for p in (layers_problem, tokens_problem) if p]
    if problems:
        return _result("structure", FAIL, "; ".join(problems))
    missing = [n for n, v in (("layers", layers), ("tokens", tokens)) if v is None]
    if missing:
        return _result("structure", NA, _NO_METADATA.format(", ".join(missing)))
    named = s.named
    expected = {n: tokens * layers for n in ATTENTION_BRICKS}
    expected["RmsNorm"] = (2 * layers + 1) * tokens
    found = {n: (named[n].count if n in named else 0) for n in expected}
    bad = [f"{n} ran {found[n]!r} times, expected {expected[n]}" for n in expected
           if found[n] != expected[n]]
    figures = dict(layers=layers, tokens=tokens, expected=expected, found=found)
    if bad:
        return _result("structure", FAIL, f"T={tokens}, L={layers}: " + "; ".join(bad)
                       + " (attention T x L, RmsNorm (2L + 1) x T)", **figures)
    return _result("structure", PASS, f"T={tokens}, L={layers}: attention bricks {tokens * layers}"
                   f" calls each (T x L), RmsNorm {expected['RmsNorm']} ((2L + 1) x T)", **figures)


@_check("stability")
def check_stability(s: _Subject) -> CheckResult:
    key = next((k for k in STABILITY_FIGURES if s.decode.get(k) != (None, None)),
               STABILITY_FIGURES[0])
    what = "median" if key == "run_median_token_ns" else "mean"
    runs, problem = s.decode.get(key)
    if problem:
        return _result("stability", FAIL, problem)
    if runs is None:
        return _result("stability", NA, _NO_METADATA.format(" or ".join(STABILITY_FIGURES)))
    if len(runs) < 2:
        return _result("stability", NA, f"{len(runs)} run(s) of the decode: the coefficient of "
                       "variation needs at least 2", runs=len(runs))
    cv = _cv(runs)
    status = PASS if cv < STABILITY_MAX_CV else FAIL
    return _result("stability", status, f"CV of per-token time ({what} of each run) across "
                   f"{len(runs)} runs {cv:.3f} (expected < {STABILITY_MAX_CV}); run {what}s "
                   + ", ".join(f"{x / 1e3:.1f}" for x in runs) + " us",
                   cv=cv, runs=len(runs), figure=key, **{key: list(runs)})


@_check("no-placeholders")
def check_no_placeholders(s: _Subject) -> CheckResult:
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
    totals = [(named[n].total_ns, named[n].count) for n in DECODE_BRICKS
              if n in named and named[n].count]
    if len(totals) >= 2 and len({t * 1.0 / c for t, c in totals}) == 1:
        problems.append(f"all {len(totals)} decode bricks share one avg "
                        f"({totals[0][0] / totals[0][1] / 1e3:.3f} us)")
    for key in ("token_latencies_ns", *STABILITY_FIGURES):
        values, problem = s.decode.get(key)
        if problem:
            problems.append(f"metadata {key}: expected finite values > 0 ({problem})")
        elif values is not None and len(values) >= 3 and len(set(values)) == 1:
            problems.append(f"metadata {key}: all {len(values)} values are {values[0]}")
    for key in ("tokens_per_s", "p50_token_ns", "p99_token_ns"):
        if key in s.decode.problems:
            problems.append(s.decode.problems[key])
    figures = dict(problems=len(problems))
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more"
                                           if len(problems) > 5 else "")
        return _result("no-placeholders", FAIL, f"expected measured figures: {shown}", **figures)
    return _result("no-placeholders", PASS, f"{len(report.bricks)} bricks and "
                   f"{len(report.paths)} paths consistent (min <= avg <= max, p50 in range, "
                   f"range bricks > 0 ns, wall {_fmt_ms(report.wall_ns)})", **figures)


@_check("graph-capture")
def check_graph_capture(s: _Subject) -> CheckResult:
    h = s.report.health
    if not h:
        return _result("graph-capture", NA, "report has no health section: cannot tell whether "
                       "the profiler saw every brick")
    problems = []
    for key in ("timing_failures", "pending_events", "unbalanced_exits"):
        if key not in h:
            problems.append(f"health has no {key!r}")
        elif h[key] != 0:
            problems.append(f"{key} {h[key]!r} (expected 0)")
    for key, value in sorted(h.items()):
        if "captur" in key.lower() and value != 0:
            problems.append(f"{key} {value!r}: bricks ran inside a graph capture or replay the "
                            "profiler did not see (expected 0; disable graph replay while "
                            "profiling)")
    figures = dict(h)
    if problems:
        return _result("graph-capture", FAIL, "the profiler missed bricks: " + "; ".join(problems),
                       **figures)
    return _result("graph-capture", PASS, "the profiler saw every brick: "
                   + ", ".join(f"{k} {v}" for k, v in sorted(figures.items())), **figures)


_TITLES = {
    "coverage": "top-level brick time covers the wall time",
    "lmhead-count": "one LmHead per decoded token",
    "token-accounting": "per-token figures divide by LmHead.count",
    "per-call-ordering": "LmHead > GateProjection > RmsNorm per call",
    "sync-mode": "the sync mode reaches the executor",
    "completeness": "every brick that ran is reported once",
    "avg-agreement": "avg_us = total_ns / count / 1000",
    "structure": "attention T x L, RmsNorm (2L + 1) x T",
    "stability": "per-token time is stable across runs",
    "no-placeholders": "every figure is measured",
    "graph-capture": "the profiler sees every brick",
}

#: The checks in order: (id, function).
CHECKS: List[tuple] = [
    ("coverage", check_coverage),
    ("lmhead-count", check_lmhead_count),
    ("token-accounting", check_token_accounting),
    ("per-call-ordering", check_per_call_ordering),
    ("sync-mode", check_sync_mode),
    ("completeness", check_completeness),
    ("avg-agreement", check_avg_agreement),
    ("structure", check_structure),
    ("stability", check_stability),
    ("no-placeholders", check_no_placeholders),
    ("graph-capture", check_graph_capture),
]
CHECK_IDS = tuple(i for i, _ in CHECKS)


# ---- running ----------------------------------------------------------------------------------


def _load(source, func: str, arg: str) -> Tuple[Report, bool]:
    """The report, and whether the reader validated it just now."""
    if isinstance(source, Report):
        return source, False
    if not isinstance(source, (dict, str, bytes, os.PathLike)):
        raise TypeError(f"{func}: {arg} must be a Report, a report dict or the path of a report "
                        f"file, got {type(source).__name__}")
    return load_report(source, where=func, arg=arg), True


def load(source: Union[str, os.PathLike, dict, Report]) -> Report:
    """A Report from a path, a parsed dict or a Report (returned as is). Raises ReportError
    naming the file and the field for an unreadable, malformed or wrong-version report.

    A report read from a file or dict keeps the derived figures as written (``avg_us`` of each
    entry, ``wall_s``, ``top_level_ns``), so the checks see what a consumer of the file reads:
    ``avg-agreement`` and ``coverage`` compare them with what they derive from."""
    return _load(source, "load", "source")[0]


def _overrides(layers: Optional[int], tokens: Optional[int]) -> Dict[str, int]:
    """The decode figures given to run_checks, which stand in for the report's."""
    given = {}
    for name, value, what in (("layers", layers, "decoder layers"), ("tokens", tokens,
                                                                     "decoded tokens")):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"run_checks: {name} ({what}) must be a positive int or None, got "
                            f"{type(value).__name__}")
        if value < 1:
            raise ValueError(f"run_checks: {name} ({what}) must be a positive int, got {value!r}")
        given[name] = value
    return given


def _selected(only) -> Sequence[str]:
    if only is None:
        return CHECK_IDS
    if isinstance(only, str):
        wanted = [only]
    elif isinstance(only, (bytes, dict)) or not isinstance(only, Iterable):
        raise TypeError(f"run_checks: only must be a check id or an iterable of check ids, got "
                        f"{type(only).__name__}")
    else:
        wanted = list(only)
    for item in wanted:
        if not isinstance(item, str):
            raise TypeError(f"run_checks: only must hold check ids (str), got "
                            f"{type(item).__name__} {item!r}")
    if not wanted:  # no check at all would make a vacuous PASS verdict
        raise ValueError(f"run_checks: only names no check; expected some of "
                         f"{', '.join(CHECK_IDS)} (or None for all)")
    unknown = [i for i in wanted if i not in CHECK_IDS]
    if unknown:
        raise ValueError(f"run_checks: only: unknown check id(s) {', '.join(map(repr, unknown))};"
                         f" expected some of {', '.join(CHECK_IDS)}")
    return [i for i in CHECK_IDS if i in wanted]


def run_checks(report: Union[Report, dict, str, os.PathLike], *, layers: Optional[int] = None,
               tokens: Optional[int] = None, only: Optional[Iterable[str]] = None
               ) -> List[CheckResult]:
    """Runs the checks (all, or those in ``only``, in :data:`CHECKS` order) on a report.
    ``layers`` / ``tokens`` override (or stand in for) ``metadata["decode"]``."""
    selected = _selected(only)
    report, validated = _load(report, "run_checks", "report")
    return _run_all(_subject(report, validated, _overrides(layers, tokens)), selected)


def _run_all(subject: _Subject, selected: Sequence[str]) -> List[CheckResult]:
    results = []
    for check_id in selected:
        try:
            results.append(_run(check_id, subject))
        except Exception as error:  # a check must never hide the others
            results.append(_result(check_id, FAIL, f"check raised {type(error).__name__}: "
                                   f"{error}"))
    return results


def _results_list(results, func: str) -> List[CheckResult]:
    if isinstance(results, (str, bytes, dict)) or not isinstance(results, Iterable):
        raise TypeError(f"{func}: results must be a list of CheckResult (from run_checks), got "
                        f"{type(results).__name__}")
    results = list(results)
    for i, r in enumerate(results):
        if not isinstance(r, CheckResult):
            raise TypeError(f"{func}: results[{i}] must be a CheckResult, got "
                            f"{type(r).__name__}")
    return results


def failures(results: Iterable[CheckResult]) -> List[CheckResult]:
    return [r for r in _results_list(results, "failures") if r.status == FAIL]


def format_results(results: Sequence[CheckResult]) -> str:
    """One line per check (``PASS  coverage  top-level 0.93 of wall …``) and a verdict line."""
    results = _results_list(results, "format_results")
    if not results:  # "verdict: PASS" over no check would be a verdict on nothing
        raise ValueError("format_results: results is empty; expected the results of at least "
                         "one check (from run_checks)")
    return _format(results)


def _format(results: List[CheckResult]) -> str:
    width = max([len(r.id) for r in results] + [1])
    lines = [f"{r.status.upper():<4}  {r.id:<{width}}  {r.message}" for r in results]
    failed = [r.id for r in results if r.status == FAIL]
    passed = sum(r.status == PASS for r in results)
    na = sum(r.status == NA for r in results)
    counts = f"{passed} passed, {len(failed)} failed, {na} n/a of {len(results)} checks"
    if failed:
        lines.append(f"verdict: FAIL ({counts}; failed: {', '.join(failed)})")
    else:
        lines.append(f"verdict: PASS ({counts})")
    return "\n".join(lines)


def _ids(text: str) -> List[str]:
    wanted = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in wanted if t not in CHECK_IDS]
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(f"unknown check id(s) {', '.join(unknown) or text!r}; "
                                         f"expected some of {', '.join(CHECK_IDS)}")
    return [i for i in CHECK_IDS if i in wanted]  # in the order of CHECKS, as run_checks runs them


def _emit(text: str, stream) -> None:
    """Prints ``text``; what the stream's encoding cannot hold is written as escapes (a brick or
    metadata name must not turn a verdict into a UnicodeEncodeError traceback)."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    stream.write(text.encode(encoding, "backslashreplace").decode(encoding, "replace") + "\n")


def main(argv: Optional[Sequence[str]] = None, prog: str = "torch_brickdev check") -> int:
    """``check report.json [--layers L] [--tokens T] [--only id,id]``: prints one line per check
    and a verdict; returns 0 when nothing failed, 1 when a check failed, 2 when the report cannot
    be read or the arguments are wrong (the reason, naming file and field, goes to stderr)."""
    if argv is not None:
        if not isinstance(argv, (list, tuple)):
            raise TypeError(f"main: argv must be a list of str or None, got {type(argv).__name__}")
        for i, item in enumerate(argv):
            if not isinstance(item, str):
                raise TypeError(f"main: argv[{i}] must be a str, got {type(item).__name__}")
    if not isinstance(prog, str):
        raise TypeError(f"main: prog must be a str, got {type(prog).__name__}")
    parser = argparse.ArgumentParser(prog=prog, description="Check a brick report against the "
                                     "decode-profiling contract (gpu-decode-profiling-v1).")
    parser.add_argument("report", help="a report written by Report.write_json")
    parser.add_argument("--layers", type=positive_int,
                        help="decoder layers L (overrides metadata)")
    parser.add_argument("--tokens", type=positive_int,
                        help="decoded tokens T (overrides metadata)")
    parser.add_argument("--only", type=_ids, help="comma-separated check ids: "
                        + ", ".join(CHECK_IDS))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # usage errors (2) and --help (0) return, as the rest does
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
    try:
        report = load_report(args.report, where="load")
    except ReportError as error:
        _emit(f"{prog}: {error}", sys.stderr)
        return 2
    overrides = {name: value for name, value in (("layers", args.layers),
                                                 ("tokens", args.tokens)) if value is not None}
    results = _run_all(_subject(report, True, overrides), args.only or CHECK_IDS)
    _emit(_format(results), sys.stdout)
    return 1 if any(r.failed for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
