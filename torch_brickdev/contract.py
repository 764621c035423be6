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
``stability``       coefficient of variation of per-token time across runs < 0.15
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
import json
import math
import os
import statistics
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Union

from .profiler import Report, SyncMode, load_report
from .profiler.report import ReportError

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
# Attribute of a Report returned by load(): the per-call figures as written in the file.
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

    @property
    def passed(self) -> bool:
        return self.status == PASS

    @property
    def failed(self) -> bool:
        return self.status == FAIL


# ---- helpers ----------------------------------------------------------------------------------


def _decode(report: Report) -> dict:
    decode = report.metadata.get("decode") if isinstance(report.metadata, dict) else None
    return decode if isinstance(decode, dict) else {}


def _int_field(decode: dict, name: str) -> Optional[int]:
    value = decode.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _named(report: Report) -> Dict[str, object]:
    """The bricks by name (the first of duplicated names; completeness reports duplicates)."""
    out = {}
    for b in report.bricks:
        out.setdefault(b.name, b)
    return out


def _missing_metadata(decode: dict, *names: str) -> List[str]:
    return [n for n in names if _int_field(decode, n) is None]


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _cv(values: Sequence[float]) -> float:
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean else math.inf


def _result(check_id: str, status: str, message: str, **figures) -> CheckResult:
    return CheckResult(check_id, _TITLES[check_id], status, message, figures)


def _fmt_ms(ns: float) -> str:
    return f"{ns / 1e6:.3f} ms"


# ---- the checks -------------------------------------------------------------------------------


def check_coverage(report: Report) -> CheckResult:
    top, wall = report.top_level_ns(), report.wall_ns
    if wall <= 0:
        return _result("coverage", FAIL, f"wall time is {wall} ns: expected a measured region "
                       "(> 0)", top_level_ns=top, wall_ns=wall)
    ratio = top / wall
    status = PASS if COVERAGE_MIN <= ratio <= COVERAGE_MAX else FAIL
    message = (f"top-level {ratio:.2f} of wall (expected {COVERAGE_MIN}-{COVERAGE_MAX}): "
               f"{_fmt_ms(top)} of {_fmt_ms(wall)}")
    if ratio < COVERAGE_MIN:
        message += "; bricks are hidden (e.g. by graph replay) or work runs outside them"
    elif ratio > COVERAGE_MAX:
        message += "; time is counted twice"
    return _result("coverage", status, message, coverage=ratio, top_level_ns=top, wall_ns=wall)


def check_lmhead_count(report: Report) -> CheckResult:
    decode = _decode(report)
    if _int_field(decode, "tokens") is None:
        return _result("lmhead-count", NA, _NO_METADATA.format("tokens"))
    tokens = decode["tokens"]
    lm = _named(report).get("LmHead")
    count = lm.count if lm is not None else 0
    final = decode.get("final_token")
    how = ("one LmHead per decoded token; the final sampled token is counted as decoded (its "
           "logits come from its own LmHead) and no forward pass runs after it")
    if isinstance(final, str):
        how += f"; final token {final!r}"
    if count == tokens:
        return _result("lmhead-count", PASS, f"LmHead ran {count} times for {tokens} decoded "
                       f"tokens ({how})", lmhead_count=count, tokens=tokens, final_token=final)
    found = "never ran" if lm is None else f"ran {count} times"
    return _result("lmhead-count", FAIL, f"expected LmHead.count == {tokens} decoded tokens "
                   f"({how}); LmHead {found}", lmhead_count=count, tokens=tokens,
                   final_token=final)


def check_token_accounting(report: Report) -> CheckResult:
    decode = _decode(report)
    lm = _named(report).get("LmHead")
    rate = decode.get("tokens_per_s")
    latencies = decode.get("token_latencies_ns")
    missing = []
    if not _finite(rate):
        missing.append("tokens_per_s")
    if not isinstance(latencies, list) or not latencies or not all(_finite(x) for x in latencies):
        missing.append("token_latencies_ns")
    if missing:
        return _result("token-accounting", NA, _NO_METADATA.format(", ".join(missing)))
    if lm is None or lm.count == 0:
        return _result("token-accounting", NA, "no LmHead brick: per-token figures have no "
                       "denominator (see completeness)")
    elapsed = float(sum(latencies))
    total_calls = sum(b.count for b in report.bricks)
    range_calls = sum(b.count for b in report.bricks if b.kind == "range")
    figures = dict(tokens_per_s=rate, lmhead_count=lm.count, decode_ns=elapsed,
                   total_calls=total_calls, range_calls=range_calls)
    if elapsed <= 0:
        return _result("token-accounting", FAIL, f"token latencies sum to {elapsed:.0f} ns: "
                       "expected measured (> 0) latencies", **figures)
    expected = lm.count / elapsed * 1e9
    figures["expected_tokens_per_s"] = expected
    if total_calls == lm.count:
        return _result("token-accounting", FAIL, f"total brick calls ({total_calls}) equal "
                       f"LmHead.count ({lm.count}): the denominator is ambiguous", **figures)
    for calls, label in ((total_calls, "total brick calls"), (range_calls, "range-brick calls")):
        naive = calls / elapsed * 1e9
        if calls != lm.count and abs(rate - naive) <= TOKEN_RATE_TOLERANCE * naive:
            return _result("token-accounting", FAIL, f"tokens_per_s {rate:.1f} is {label} / time "
                           f"({calls} / {_fmt_ms(elapsed)} = {naive:.1f}): per-token figures "
                           f"must divide by LmHead.count ({lm.count}), expected {expected:.1f}",
                           **figures)
    error = abs(rate - expected) / expected
    figures["relative_error"] = error
    if error > TOKEN_RATE_TOLERANCE:
        return _result("token-accounting", FAIL, f"tokens_per_s {rate:.1f}, expected LmHead.count"
                       f" / time = {lm.count} / {_fmt_ms(elapsed)} = {expected:.1f} within "
                       f"{TOKEN_RATE_TOLERANCE:.0%} (off by {error:.1%})", **figures)
    return _result("token-accounting", PASS, f"tokens_per_s {rate:.1f} = LmHead.count / time "
                   f"({lm.count} / {_fmt_ms(elapsed)} = {expected:.1f}, within {error:.2%}); "
                   f"not the {total_calls} total brick calls", **figures)


def check_per_call_ordering(report: Report) -> CheckResult:
    named = _named(report)
    missing = [n for n in ("LmHead", "GateProjection", "RmsNorm")
               if n not in named or named[n].count == 0]
    if missing:
        return _result("per-call-ordering", NA, f"cannot order: brick(s) {', '.join(missing)} "
                       "never ran (see completeness)")
    lm, gate, norm = (named[n].avg_us() for n in ("LmHead", "GateProjection", "RmsNorm"))
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
    problems = []
    seen, duplicates = set(), []
    for b in report.bricks:
        if b.name in seen and b.name not in duplicates:
            duplicates.append(b.name)
        seen.add(b.name)
    if duplicates:
        problems.append(f"duplicate brick name(s) {', '.join(map(repr, duplicates))}")
    zero = [b.name for b in report.bricks if b.count <= 0]
    if zero:
        problems.append(f"brick(s) with count 0 listed: {', '.join(map(repr, zero))}")
    named = _named(report)
    missing = [n for n in DECODE_BRICKS if n not in named or named[n].count <= 0]
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
        for name in sorted(set(path_counts) | set(named)):
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
    raw = getattr(report, _RAW_ATTR, None) or {}
    worst, bad, checked, source = 0.0, [], 0, "file" if raw else "avg_us()"
    for section in ("bricks", "paths"):
        entries = getattr(report, section)
        written = raw.get(section)
        if written is not None and len(written) != len(entries):
            written = None
        for i, b in enumerate(entries):
            if b.count <= 0:
                continue
            canonical = b.total_ns / b.count / 1000.0
            figure = written[i] if written is not None and written[i] is not None else b.avg_us()
            if not _finite(figure):
                bad.append(f"{b.path}: avg_us {figure!r} is not a number")
                continue
            checked += 1
            error = abs(figure - canonical) / canonical if canonical else (0.0 if figure == 0 else math.inf)
            worst = max(worst, error)
            if error > AVG_TOLERANCE:
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
    decode = _decode(report)
    missing = _missing_metadata(decode, "layers", "tokens")
    if missing:
        return _result("structure", NA, _NO_METADATA.format(", ".join(missing)))
    layers, tokens = decode["layers"], decode["tokens"]
    named = _named(report)
    expected = {n: tokens * layers for n in ATTENTION_BRICKS}
    expected["RmsNorm"] = (2 * layers + 1) * tokens
    found = {n: (named[n].count if n in named else 0) for n in expected}
    bad = [f"{n} ran {found[n]} times, expected {expected[n]}" for n in expected
           if found[n] != expected[n]]
    figures = dict(layers=layers, tokens=tokens, expected=expected, found=found)
    if bad:
        return _result("structure", FAIL, f"T={tokens}, L={layers}: " + "; ".join(bad)
                       + " (attention T x L, RmsNorm (2L + 1) x T)", **figures)
    return _result("structure", PASS, f"T={tokens}, L={layers}: attention bricks {tokens * layers}"
                   f" calls each (T x L), RmsNorm {expected['RmsNorm']} ((2L + 1) x T)", **figures)


def check_stability(report: Report) -> CheckResult:
    runs = _decode(report).get("run_mean_token_ns")
    if not isinstance(runs, list) or not all(_finite(x) for x in runs):
        return _result("stability", NA, _NO_METADATA.format("run_mean_token_ns"))
    if len(runs) < 2:
        return _result("stability", NA, f"{len(runs)} run(s) of the decode: the coefficient of "
                       "variation needs at least 2", runs=len(runs))
    mean = statistics.fmean(runs)
    if mean <= 0:
        return _result("stability", FAIL, f"mean per-token time {mean:.0f} ns across "
                       f"{len(runs)} runs: expected measured (> 0) times", runs=len(runs))
    cv = _cv(runs)
    status = PASS if cv < STABILITY_MAX_CV else FAIL
    return _result("stability", status, f"CV of per-token time across {len(runs)} runs {cv:.3f} "
                   f"(expected < {STABILITY_MAX_CV}); run means "
                   + ", ".join(f"{x / 1e3:.1f}" for x in runs) + " us",
                   cv=cv, runs=len(runs), run_mean_token_ns=list(runs))


def check_no_placeholders(report: Report) -> CheckResult:
    problems = []
    if not isinstance(report.wall_ns, int) or report.wall_ns <= 0:
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
            if b.count <= 0:
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
              if n in named and named[n].count]
    if len(totals) >= 2 and len({t * 1.0 / c for t, c in totals}) == 1:
        problems.append(f"all {len(totals)} decode bricks share one avg "
                        f"({totals[0][0] / totals[0][1] / 1e3:.3f} us)")
    decode = _decode(report)
    for key in ("token_latencies_ns", "run_mean_token_ns"):
        values = decode.get(key)
        if isinstance(values, list):
            if not all(_finite(v) and v > 0 for v in values):
                problems.append(f"metadata {key}: expected finite values > 0")
            elif len(values) >= 3 and len(set(values)) == 1:
                problems.append(f"metadata {key}: all {len(values)} values are {values[0]}")
    for key in ("tokens_per_s", "p50_token_ns", "p99_token_ns"):
        if key in decode and not (_finite(decode[key]) and decode[key] > 0):
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
    h = report.health if isinstance(report.health, dict) else {}
    if not h:
        return _result("graph-capture", NA, "report has no health section: cannot tell whether "
                       "the profiler saw every brick")
    problems = []
    for key in ("timing_failures", "pending_events", "unbalanced_exits"):
        value = h.get(key)
        if value is None:
            problems.append(f"health has no {key!r}")
        elif value != 0:
            problems.append(f"{key} {value} (expected 0)")
    for key, value in sorted(h.items()):
        if "captur" in key.lower() and _finite(value) and value > 0:
            problems.append(f"{key} {value}: bricks ran inside a graph capture or replay the "
                            "profiler did not see (expected 0; disable graph replay while "
                            "profiling)")
    if problems:
        return _result("graph-capture", FAIL, "the profiler missed bricks: " + "; ".join(problems),
                       **dict(h))
    return _result("graph-capture", PASS, "the profiler saw every brick: "
                   + ", ".join(f"{k} {v}" for k, v in sorted(h.items())), **dict(h))


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


def load(source: Union[str, os.PathLike, dict, Report]) -> Report:
    """A Report from a path, a parsed dict or a Report (returned as is). Raises ReportError
    naming the file and the field for an unreadable, malformed or wrong-version report.

    A report read from a file or dict keeps the per-call figures (``avg_us``) as written, so
    ``avg-agreement`` checks what a consumer of the file reads."""
    if isinstance(source, Report):
        return source
    report = load_report(source)
    data = source
    if not isinstance(source, dict):
        with open(os.fspath(source), encoding="utf-8") as f:
            data = json.load(f)
    raw = {}
    for section in ("bricks", "paths"):
        raw[section] = [item.get("avg_us") if isinstance(item, dict) else None
                        for item in data.get(section, [])]
    setattr(report, _RAW_ATTR, raw)
    return report


def _with_overrides(report: Report, layers: Optional[int], tokens: Optional[int]) -> Report:
    if layers is None and tokens is None:
        return report
    for name, value in (("layers", layers), ("tokens", tokens)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"decode contract: {name} must be a positive int, got {value!r}")
    view = copy.copy(report)
    view.metadata = dict(report.metadata)
    decode = dict(_decode(report))
    if layers is not None:
        decode["layers"] = layers
    if tokens is not None:
        decode["tokens"] = tokens
    view.metadata["decode"] = decode
    return view


def run_checks(report: Union[Report, dict, str, os.PathLike], *, layers: Optional[int] = None,
               tokens: Optional[int] = None, only: Optional[Iterable[str]] = None
               ) -> List[CheckResult]:
    """Runs the checks (all, or those in ``only``, in :data:`CHECKS` order) on a report.
    ``layers`` / ``tokens`` override (or stand in for) ``metadata["decode"]``."""
    report = _with_overrides(load(report), layers, tokens)
    selected = CHECK_IDS
    if only is not None:
        wanted = [only] if isinstance(only, str) else list(only)
        unknown = [i for i in wanted if i not in CHECK_IDS]
        if unknown:
            raise ValueError(f"decode contract: unknown check id(s) {', '.join(map(repr, unknown))};"
                             f" expected some of {', '.join(CHECK_IDS)}")
        selected = [i for i in CHECK_IDS if i in wanted]
    results = []
    for check_id, fn in CHECKS:
        if check_id in selected:
            try:
                results.append(fn(report))
            except Exception as error:  # a check must never hide the others
                results.append(_result(check_id, FAIL, f"check raised {type(error).__name__}: "
                                       f"{error}"))
    return results


def failures(results: Iterable[CheckResult]) -> List[CheckResult]:
    return [r for r in results if r.status == FAIL]


def format_results(results: Sequence[CheckResult]) -> str:
    """One line per check (``PASS  coverage  top-level 0.93 of wall …``) and a verdict line."""
    results = list(results)
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


def _positive(text: str) -> int:
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


def main(argv: Optional[Sequence[str]] = None, prog: str = "torch_brickdev check") -> int:
    """``check report.json [--layers L] [--tokens T] [--only id,id]``: prints one line per check
    and a verdict; returns 0 when nothing failed, 1 when a check failed, 2 when the report cannot
    be read (the reason, naming file and field, goes to stderr)."""
    parser = argparse.ArgumentParser(prog=prog, description="Check a brick report against the "
                                     "decode-profiling contract (gpu-decode-profiling-v1).")
    parser.add_argument("report", help="a report written by Report.write_json")
    parser.add_argument("--layers", type=_positive, help="decoder layers L (overrides metadata)")
    parser.add_argument("--tokens", type=_positive, help="decoded tokens T (overrides metadata)")
    parser.add_argument("--only", type=_ids, help="comma-separated check ids: "
                        + ", ".join(CHECK_IDS))
    args = parser.parse_args(argv)
    try:
        report = load(args.report)
    except ReportError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 2
    results = run_checks(report, layers=args.layers, tokens=args.tokens, only=args.only)
    print(format_results(results))
    return 1 if failures(results) else 0


if __name__ == "__main__":
    sys.exit(main())
