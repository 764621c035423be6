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

Command line: ``python -m torch_brickdev.contract report.json [--layers L] [--tokens T]
[--only id,id]``; exit status 0 when nothing failed, 1 when a check failed, 2 when the report
cannot be read.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .profiler import Report, SyncMode
from .profiler.report import ReportError, _read, _show

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
# Attribute of a Report returned by load(): the derived figures as written in the file
# (``avg_us`` per entry, ``wall_s``, ``top_level_ns``), to compare with what they derive from.
_RAW_ATTR = "_contract_raw_avg_us"


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


# ---- helpers ----------------------------------------------------------------------------------
#
# A Report from load() holds validated figures (integers, finite numbers); a Report built or
# altered in memory, and the free-form metadata of any report, may hold anything. Every
# comparison below is written so that NaN (for which every comparison is False) and Infinity
# fail a check instead of slipping through a ``not (x > y)``.


def _expect_report(report, func: str) -> None:
    if not isinstance(report, Report):
        raise TypeError(f"{func}: report must be a Report (see load()), got "
                        f"{type(report).__name__}")


def _decode(report: Report) -> dict:
    decode = report.metadata.get("decode") if isinstance(report.metadata, dict) else None
    return decode if isinstance(decode, dict) else {}


def _finite(x) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an int beyond float range: no arithmetic on it is meaningful
        return False


def _positive(x) -> bool:
    return _finite(x) and x > 0


def _call_count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _decode_int(decode: dict, name: str) -> Tuple[Optional[int], Optional[str]]:
    """``(value, None)``; ``(None, None)`` when absent; ``(None, problem)`` when present but not
    a positive integer (a decode of 0 tokens or layers has nothing to check)."""
    if name not in decode:
        return None, None
    value = decode[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None, f"metadata decode.{name} is {_show(value)}: expected a positive integer"
    return value, None


def _decode_number(decode: dict, name: str) -> Tuple[Optional[float], Optional[str]]:
    """A finite number > 0, as :func:`_decode_int`."""
    if name not in decode:
        return None, None
    value = decode[name]
    if not _positive(value):
        return None, f"metadata decode.{name} is {_show(value)}: expected a finite number > 0"
    return value, None


def _decode_series(decode: dict, name: str, allow_empty: bool
                   ) -> Tuple[Optional[list], Optional[str]]:
    """A list of finite numbers > 0, as :func:`_decode_int`."""
    if name not in decode:
        return None, None
    values = decode[name]
    expected = "a " + ("" if allow_empty else "non-empty ") + "list of finite numbers > 0"
    if not isinstance(values, (list, tuple)) or not (values or allow_empty):
        return None, f"metadata decode.{name} is {_show(values)}: expected {expected}"
    for i, value in enumerate(values):
        if not _positive(value):
            return None, f"metadata decode.{name}[{i}] is {_show(value)}: expected {expected}"
    return values, None


def _named(report: Report) -> Dict[str, object]:
    """The bricks by name (the first of duplicated names; completeness reports duplicates)."""
    out = {}
    for b in report.bricks:
        out.setdefault(b.name, b)
    return out


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


def _written(report: Report) -> dict:
    raw = getattr(report, _RAW_ATTR, None)
    return raw if isinstance(raw, dict) else {}


# ---- the checks -------------------------------------------------------------------------------


def check_coverage(report: Report) -> CheckResult:
    _expect_report(report, "check_coverage")
    wall = report.wall_ns
    if not _positive(wall):
        return _result("coverage", FAIL, f"wall time is {wall!r} ns: expected a measured region "
                       "(a finite number > 0)", wall_ns=wall)
    odd = [p.path for p in report.paths if p.depth == 0
           and not (_finite(p.total_ns) and p.total_ns >= 0)]
    if odd:
        return _result("coverage", FAIL, f"top-level brick(s) {', '.join(map(repr, odd[:5]))} "
                       "have no measured total_ns (expected finite numbers >= 0)", wall_ns=wall)
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
    written = _written(report)
    written_top, written_wall_s = written.get("top_level_ns"), written.get("wall_s")
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


def check_lmhead_count(report: Report) -> CheckResult:
    _expect_report(report, "check_lmhead_count")
    decode = _decode(report)
    tokens, problem = _decode_int(decode, "tokens")
    if problem:
        return _result("lmhead-count", FAIL, problem)
    if tokens is None:
        return _result("lmhead-count", NA, _NO_METADATA.format("tokens"))
    lm = _named(report).get("LmHead")
    count = lm.count if lm is not None else 0
    final = decode.get("final_token")
    how = ("one LmHead per decoded token; the final sampled token is counted as decoded (its "
           "logits come from its own LmHead) and no forward pass runs after it")
    if isinstance(final, str):
        how += f"; final token {final!r}"
    if _call_count(count) and count == tokens:
        return _result("lmhead-count", PASS, f"LmHead ran {count} times for {tokens} decoded "
                       f"tokens ({how})", lmhead_count=count, tokens=tokens, final_token=final)
    found = "never ran" if lm is None else f"ran {count!r} times"
    return _result("lmhead-count", FAIL, f"expected LmHead.count == {tokens} decoded tokens "
                   f"({how}); LmHead {found}", lmhead_count=count, tokens=tokens,
                   final_token=final)


def check_token_accounting(report: Report) -> CheckResult:
    _expect_report(report, "check_token_accounting")
    decode = _decode(report)
    rate, rate_problem = _decode_number(decode, "tokens_per_s")
    latencies, latency_problem = _decode_series(decode, "token_latencies_ns", allow_empty=False)
    problems = [p for p in (rate_problem, latency_problem) if p]
    if problems:
        return _result("token-accounting", FAIL, "; ".join(problems))
    missing = [n for n, v in (("tokens_per_s", rate), ("token_latencies_ns", latencies))
               if v is None]
    if missing:
        return _result("token-accounting", NA, _NO_METADATA.format(", ".join(missing)))
    lm = _named(report).get("LmHead")
    if lm is None or lm.count == 0:
        return _result("token-accounting", NA, "no LmHead brick: per-token figures have no "
                       "denominator (see completeness)")
    if not _call_count(lm.count) or not all(_call_count(b.count) for b in report.bricks):
        return _result("token-accounting", FAIL, "brick counts are not call counts (integers "
                       ">= 0): per-token figures have no denominator", lmhead_count=lm.count)
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


def check_per_call_ordering(report: Report) -> CheckResult:
    _expect_report(report, "check_per_call_ordering")
    named = _named(report)
    missing = [n for n in ("LmHead", "GateProjection", "RmsNorm")
               if n not in named or named[n].count == 0]
    if missing:
        return _result("per-call-ordering", NA, f"cannot order: brick(s) {', '.join(missing)} "
                       "never ran (see completeness)")
    counts = [f"{n} {named[n].count!r}" for n in ("LmHead", "GateProjection", "RmsNorm")
              if not _call_count(named[n].count)]
    if counts:  # avg_us() of a count None is 0.0: it would order
        return _result("per-call-ordering", FAIL, f"call counts {', '.join(counts)}: expected "
                       "integers >= 0 to divide by")
    lm, gate, norm = (named[n].avg_us() for n in ("LmHead", "GateProjection", "RmsNorm"))
    odd = [f"{n} {v!r}" for n, v in (("LmHead", lm), ("GateProjection", gate), ("RmsNorm", norm))
           if not (_finite(v) and v >= 0)]
    if odd:
        return _result("per-call-ordering", FAIL, f"per-call figures {', '.join(odd)} us: "
                       "expected finite numbers >= 0 to order", lmhead_avg_us=lm,
                       gate_avg_us=gate, rmsnorm_avg_us=norm)
    mode = report.sync_mode if isinstance(report.sync_mode, SyncMode) else None
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


def check_sync_mode(report: Report) -> CheckResult:
    _expect_report(report, "check_sync_mode")
    raw = getattr(report, "sync_mode", None)
    try:
        mode = SyncMode.parse(raw) if raw is not None else None
    except (TypeError, ValueError):
        mode = None
    if mode is None:
        valid = ", ".join(m.value for m in SyncMode)
        return _result("sync-mode", FAIL, f"sync mode {raw!r} is missing or unknown: expected one "
                       f"of {valid}", sync_mode=None if raw is None else str(raw))
    declared = _decode(report).get("sync_mode")
    if declared is not None and str(declared).lower() != mode.value:
        return _result("sync-mode", FAIL, f"the run asked for sync mode {declared!r} but the "
                       f"profiler timed in {mode.value!r}: the mode did not reach the executor",
                       sync_mode=mode.value, declared=declared)
    named = _named(report)
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


def check_completeness(report: Report) -> CheckResult:
    _expect_report(report, "check_completeness")
    problems = []
    seen, duplicates = set(), []
    for b in report.bricks:
        if b.name in seen and b.name not in duplicates:
            duplicates.append(b.name)
        seen.add(b.name)
    if duplicates:
        problems.append(f"duplicate brick name(s) {', '.join(map(repr, duplicates))}")
    zero = [b.name for b in report.bricks if not b.count > 0]  # NaN is not > 0 either
    if zero:
        problems.append(f"brick(s) with count 0 listed: {', '.join(map(repr, zero))}")
    named = _named(report)
    missing = [n for n in DECODE_BRICKS if n not in named or not named[n].count > 0]
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


def check_avg_agreement(report: Report) -> CheckResult:
    _expect_report(report, "check_avg_agreement")
    raw = _written(report)
    worst, bad, checked, source = 0.0, [], 0, "file" if raw else "avg_us()"
    for section in ("bricks", "paths"):
        entries = getattr(report, section)
        written = raw.get(section)
        if not isinstance(written, list) or len(written) != len(entries):
            written = None
        for i, b in enumerate(entries):
            figure = written[i] if written is not None else None
            if not _call_count(b.count):
                bad.append(f"{b.path}: count {b.count!r} is not a call count (an integer >= 0)")
                continue
            if b.count == 0:
                # Nothing ran: any time or per-call figure is a disagreement, not a pass.
                if b.total_ns != 0 or figure not in (None, 0):
                    bad.append(f"{b.path}: ran 0 times but total_ns {b.total_ns!r}, avg_us "
                               f"{figure!r} (expected 0)")
                continue
            if not (_finite(b.total_ns) and b.total_ns >= 0):
                bad.append(f"{b.path}: total_ns {b.total_ns!r} is not a finite number >= 0")
                continue
            canonical = b.total_ns / b.count / 1000.0
            if figure is None:
                figure = b.avg_us()
            if not _finite(figure):
                bad.append(f"{b.path}: avg_us {figure!r} is not a number")
                continue
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


def check_structure(report: Report) -> CheckResult:
    _expect_report(report, "check_structure")
    decode = _decode(report)
    (layers, layers_problem), (tokens, tokens_problem) = (
        _decode_int(decode, "layers"), _decode_int(decode, "tokens"))
    problems = [p for p in (layers_problem, tokens_problem) if p]
    if problems:
        return _result("structure", FAIL, "; ".join(problems))
    missing = [n for n, v in (("layers", layers), ("tokens", tokens)) if v is None]
    if missing:
        return _result("structure", NA, _NO_METADATA.format(", ".join(missing)))
    named = _named(report)
    expected = {n: tokens * layers for n in ATTENTION_BRICKS}
    expected["RmsNorm"] = (2 * layers + 1) * tokens
    found = {n: (named[n].count if n in named else 0) for n in expected}
    bad = [f"{n} ran {found[n]!r} times, expected {expected[n]}" for n in expected
           if not (_call_count(found[n]) and found[n] == expected[n])]
    figures = dict(layers=layers, tokens=tokens, expected=expected, found=found)
    if bad:
        return _result("structure", FAIL, f"T={tokens}, L={layers}: " + "; ".join(bad)
                       + " (attention T x L, RmsNorm (2L + 1) x T)", **figures)
    return _result("structure", PASS, f"T={tokens}, L={layers}: attention bricks {tokens * layers}"
                   f" calls each (T x L), RmsNorm {expected['RmsNorm']} ((2L + 1) x T)", **figures)


# The per-run figure the stability check compares: each run's median per-token time (a few
# tokens slowed by another process on the machine move a run's mean, not its median). Reports
# written before the demo recorded medians carry each run's mean only; that is read instead.
STABILITY_FIGURES = ("run_median_token_ns", "run_mean_token_ns")


def check_stability(report: Report) -> CheckResult:
    _expect_report(report, "check_stability")
    decode = _decode(report)
    key = next((k for k in STABILITY_FIGURES if k in decode), STABILITY_FIGURES[0])
    what = "median" if key == "run_median_token_ns" else "mean"
    runs, problem = _decode_series(decode, key, allow_empty=True)
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


def check_no_placeholders(report: Report) -> CheckResult:
    _expect_report(report, "check_no_placeholders")
    problems = []
    if not _call_count(report.wall_ns) or report.wall_ns <= 0:
        problems.append(f"wall_ns is {report.wall_ns!r}, expected > 0")
    for section in ("bricks", "paths"):
        for b in getattr(report, section):
            where = f"{section[:-1]} {b.path!r}"
            values = dict(total_ns=b.total_ns, min_ns=b.min_ns, max_ns=b.max_ns,
                          p50_ns=b.p50_ns, p90_ns=b.p90_ns, p99_ns=b.p99_ns)
            odd = [k for k, v in values.items() if not _finite(v)]
            if odd:
                problems.append(f"{where}: {', '.join(odd)} not a finite number")
                continue
            negative = [k for k, v in values.items() if v < 0]
            if negative:
                problems.append(f"{where}: {', '.join(negative)} negative")
                continue
            if not _call_count(b.count):
                problems.append(f"{where}: count {b.count!r} is not a call count")
                continue
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
    named = _named(report)
    totals = [(named[n].total_ns, named[n].count) for n in DECODE_BRICKS
              if n in named and _call_count(named[n].count) and named[n].count
              and _finite(named[n].total_ns)]
    if len(totals) >= 2 and len({t * 1.0 / c for t, c in totals}) == 1:
        problems.append(f"all {len(totals)} decode bricks share one avg "
                        f"({totals[0][0] / totals[0][1] / 1e3:.3f} us)")
    decode = _decode(report)
    for key in ("token_latencies_ns", *STABILITY_FIGURES):
        values, problem = _decode_series(decode, key, allow_empty=True)
        if problem:
            problems.append(f"metadata {key}: expected finite values > 0 ({problem})")
        elif values is not None and len(values) >= 3 and len(set(values)) == 1:
            problems.append(f"metadata {key}: all {len(values)} values are {values[0]}")
    for key in ("tokens_per_s", "p50_token_ns", "p99_token_ns"):
        if key in decode and not _positive(decode[key]):
            problems.append(f"metadata {key} is {decode[key]!r}, expected a finite value > 0")
    figures = dict(problems=len(problems))
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more"
                                           if len(problems) > 5 else "")
        return _result("no-placeholders", FAIL, f"expected measured figures: {shown}", **figures)
    return _result("no-placeholders", PASS, f"{len(report.bricks)} bricks and "
                   f"{len(report.paths)} paths consistent (min <= avg <= max, p50 in range, "
                   f"range bricks > 0 ns, wall {_fmt_ms(report.wall_ns)})", **figures)


def check_graph_capture(report: Report) -> CheckResult:
    _expect_report(report, "check_graph_capture")
    h = report.health if isinstance(report.health, dict) else {}
    if not h:
        return _result("graph-capture", NA, "report has no health section: cannot tell whether "
                       "the profiler saw every brick")

    def zero(value) -> bool:  # a counter at 0; False, 0.0 or NaN are not counters
        return _call_count(value) and value == 0

    problems = []
    for key in ("timing_failures", "pending_events", "unbalanced_exits"):
        if key not in h:
            problems.append(f"health has no {key!r}")
        elif not zero(h[key]):
            problems.append(f"{key} {h[key]!r} (expected 0)")
    for key, value in sorted(h.items(), key=lambda kv: str(kv[0])):
        if "captur" in str(key).lower() and not zero(value):
            problems.append(f"{key} {value!r}: bricks ran inside a graph capture or replay the "
                            "profiler did not see (expected 0; disable graph replay while "
                            "profiling)")
    figures = {str(k): v for k, v in h.items()}
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


def _load(source, func: str, arg: str) -> Report:
    if isinstance(source, Report):
        return source
    if not isinstance(source, (dict, str, bytes, os.PathLike)):
        raise TypeError(f"{func}: {arg} must be a Report, a report dict or the path of a report "
                        f"file, got {type(source).__name__}")
    report, written = _read(source, func, arg)
    setattr(report, _RAW_ATTR, written)
    return report


def load(source: Union[str, os.PathLike, dict, Report]) -> Report:
    """A Report from a path, a parsed dict or a Report (returned as is). Raises ReportError
    naming the file and the field for an unreadable, malformed or wrong-version report.

    A report read from a file or dict keeps the derived figures as written (``avg_us`` of each
    entry, ``wall_s``, ``top_level_ns``), so the checks see what a consumer of the file reads:
    ``avg-agreement`` and ``coverage`` compare them with what they derive from."""
    return _load(source, "load", "source")


def _with_overrides(report: Report, layers: Optional[int], tokens: Optional[int]) -> Report:
    for name, value, what in (("layers", layers, "decoder layers"), ("tokens", tokens,
                                                                     "decoded tokens")):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"run_checks: {name} ({what}) must be a positive int or None, got "
                            f"{type(value).__name__}")
        if value < 1:
            raise ValueError(f"run_checks: {name} ({what}) must be a positive int, got {value!r}")
    if layers is None and tokens is None:
        return report
    view = copy.copy(report)
    view.metadata = dict(report.metadata) if isinstance(report.metadata, dict) else {}
    decode = dict(_decode(report))
    if layers is not None:
        decode["layers"] = layers
    if tokens is not None:
        decode["tokens"] = tokens
    view.metadata["decode"] = decode
    return view


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
    report = _with_overrides(_load(report, "run_checks", "report"), layers, tokens)
    results = []
    for check_id, fn in CHECKS:
        if check_id in selected:
            try:
                results.append(fn(report))
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


def _positive_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def _ids(text: str) -> List[str]:
    wanted = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in wanted if t not in CHECK_IDS]
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(f"unknown check id(s) {', '.join(unknown) or text!r}; "
                                         f"expected some of {', '.join(CHECK_IDS)}")
    return wanted


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
    parser.add_argument("--layers", type=_positive_arg,
                        help="decoder layers L (overrides metadata)")
    parser.add_argument("--tokens", type=_positive_arg,
                        help="decoded tokens T (overrides metadata)")
    parser.add_argument("--only", type=_ids, help="comma-separated check ids: "
                        + ", ".join(CHECK_IDS))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # usage errors (2) and --help (0) return, as the rest does
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
    try:
        report = load(args.report)
    except ReportError as error:
        _emit(f"{prog}: {error}", sys.stderr)
        return 2
    results = run_checks(report, layers=args.layers, tokens=args.tokens, only=args.only)
    _emit(format_results(results), sys.stdout)
    return 1 if failures(results) else 0


if __name__ == "__main__":
    sys.exit(main())
