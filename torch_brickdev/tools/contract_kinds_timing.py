"""The contract check kinds that judge time: ``coverage`` of the wall, per-call ``ordering`` and
ratios, what the ``sync-mode`` measures, run-to-run ``stability`` and per-brick ``budget``s; a
failure the time the machine denied the process explains is inconclusive."""

from __future__ import annotations

import math

from ..profiler import SyncMode

from .contract_numbers import _fmt_ms, cv
from .contract_result import FAIL, INCONCLUSIVE, NA, PASS, CheckResult, Result
from .contract_subject import Subject, _denied

__all__ = ["budget", "coverage", "ordering", "stability", "sync_mode"]


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
