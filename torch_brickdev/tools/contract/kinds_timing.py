"""The contract check kinds that judge time: ``coverage`` of the wall, per-call ``ordering`` and
ratios, what the ``sync-mode`` measures, run-to-run ``stability`` and per-brick ``budget``s; a
failure the time the machine denied the profiling thread accounts for is inconclusive. Only a
measured denial counts (``profiler.machine.denied``: run-queue wait and steal), in proportion
to what it must explain: the program's own idle time, sleep, I/O and locks fail."""

from __future__ import annotations

import math

from typing import Optional, Tuple

from ...profiler import SyncMode, machine

from .numbers import _fmt_ms, cv
from .report_view import Subject
from .result import FAIL, INCONCLUSIVE, NA, PASS, CheckResult, Result

__all__ = ["budget", "coverage", "ordering", "stability", "sync_mode"]


def _denied(s: Subject) -> Tuple[Optional[float], str]:
    """(the share of the wall the machine denied the profiling thread, or None where no
    run-queue wait was measured; how it reads, or why it is no evidence)."""
    figures = s.report.machine
    got = machine.denied(figures, s.report.wall_ns)
    if got is not None:
        return got.ns / s.report.wall_ns, got.text()
    if figures.get("denied_source") == "off-cpu":
        return None, ("no run-queue wait was measured: the time the thread was off its CPU "
                      "counts its own sleep, I/O and locks too, so it excuses nothing")
    return None, "the report says nothing of what the machine denied the thread"


def _traced(report) -> bool:
    """Whether the report's bricks were timed from the device's record of its work
    (``profile(device_timing="traced")``)."""
    timing = report.metadata.get("device_timing")
    return isinstance(timing, dict) and timing.get("timing") == "traced"


def coverage(p: dict, s: Subject, result: Result) -> CheckResult:
    report = s.report
    low, high = p["min"], p["max"]
    wall = report.wall_ns
    if wall == 0:
        return result(FAIL, f"wall time is {wall!r} ns: expected a measured region (a finite "
                      "number > 0)", wall_ns=wall)
    top = report.top_level_ns()
    if _traced(report):
        # Traced timing: bricks are the device's work, not the wall; what they must cover is all
        # the work the device's tracer recorded (the rest ran outside every brick).
        traced_ns = report.health.get("traced_work_ns")
        if isinstance(traced_ns, bool) or not isinstance(traced_ns, int) or traced_ns <= 0:
            return result(FAIL, f"the bricks were traced (metadata device_timing) but "
                          f"health['traced_work_ns'] is {traced_ns!r}: expected the device work "
                          f"of the profiled region in ns (an int > 0)", top_level_ns=top)
        ratio = top / traced_ns
        status = PASS if low <= ratio <= high else FAIL
        message = (f"top-level {ratio:.2f} of the device work traced (expected {low}-{high}): "
                   f"{_fmt_ms(top)} of {_fmt_ms(traced_ns)} (traced timing: bricks sum their "
                   f"work; the wall, {_fmt_ms(wall)}, also holds the host's time between "
                   f"launches)")
        if ratio < low:
            message += "; work runs outside the bricks"
        elif ratio > high:
            message += "; work is counted twice"
        return result(status, message, coverage=ratio, top_level_ns=top, wall_ns=wall,
                      traced_work_ns=traced_ns)
    ratio = top / wall
    status = PASS if low <= ratio <= high else FAIL
    message = (f"top-level {ratio:.2f} of wall (expected {low}-{high}): {_fmt_ms(top)} of "
               f"{_fmt_ms(wall)}")
    denied, how = _denied(s)
    explained = False
    if ratio < low:
        if denied is not None and ratio + denied >= low:
            # Waiting for a CPU stretched the region: at worst all of it fell between bricks.
            explained = True
            message += (f"; but the thread waited for a CPU {denied:.0%} of the wall (other "
                        f"processes ran; {how}), which accounts for the gap: "
                        f"{ratio:.2f} + {denied:.2f} >= {low}")
        else:
            message += "; bricks are hidden (e.g. by graph replay) or work runs outside them"
            message += (f" (the machine denied the thread only {denied:.0%} of the wall: not a "
                        "busy machine)" if denied is not None else f" ({how})")
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
                  denied_share=denied)


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
    denied, how = _denied(s)
    if not ok and by != "p50" and denied is not None and denied >= p["busy"]:
        # A preempted call of a short brick moves its mean; the median needs most calls slowed.
        median = {n: s.named[n].p50_ns for n in names}
        pairs = [(a, b, 1.0) for a, b in zip(order, order[1:])] + [
            (r["above"], r["below"], r["factor"]) for r in ratios
            if r["modes"] is None or s.mode.value in r["modes"]]
        holds = all(median[a] > factor * median[b] for a, b, factor in pairs)
        # The bricks below whose means broke the order: their calls' time beyond their medians
        # must be the machine's, the time it denied the thread covering most of it.
        broke = {b for a, b, factor in pairs if not value[a] > factor * value[b]}
        beyond_ns = sum(max(0.0, s.named[n].total_ns - s.named[n].count * median[n])
                        for n in broke)
        denied_ns = denied * s.report.wall_ns
        if holds and denied_ns >= machine.DENIED_COVER * beyond_ns:
            return result(INCONCLUSIVE, f"{message}; but the thread waited for a CPU "
                          f"{denied:.0%} of the wall (other processes ran; {how}), "
                          f"{denied_ns / 1e6:.1f} ms against the {beyond_ns / 1e6:.1f} ms "
                          f"{', '.join(sorted(broke))} spent beyond its median calls, and the "
                          "order holds by the median call ("
                          + ", ".join(f"{n} {median[n] / 1e3:.2f} us" for n in names) + ")",
                          **figures, denied_share=denied)
        if holds:
            message += (f"; the order holds by the median call, but the {beyond_ns / 1e6:.1f} "
                        f"ms {', '.join(sorted(broke))} spent beyond its median calls is more "
                        f"than the machine denied the thread ({denied_ns / 1e6:.1f} ms) can "
                        "account for: the program's own")
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
    elif _traced(s.report):
        tracer = s.report.metadata["device_timing"].get("tracer")
        message = (f"event: device time: the device's own record of the work each brick queued "
                   f"(traced by {tracer}); {spread}")
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
        evidence, how = _denied(s)
        if not descheduled:
            message += f"; no run was descheduled (each waited < {busy:.0%} for a CPU)"
        elif evidence is None:
            message += f"; the runs' shares are no evidence of a busy machine ({how})"
        else:
            # Each run less the time its thread waited for a CPU (the waits spread over its
            # tokens like the rest of its time), but not below the fastest run: what the runs
            # would have taken had the machine not denied them the CPU, at most.
            fastest = min(runs)
            net = [max(r * (1 - d), fastest) for r, d in zip(runs, shares)]
            net_cv = cv(net)
            figures["net_of_waits_cv"] = net_cv
            denied = (f"; the machine was busy: the thread waited for a CPU "
                      f"{', '.join(descheduled)} of the run")
            if net_cv < max_cv:
                return result(INCONCLUSIVE, message + denied + f"; less those waits the runs "
                              f"agree (CV {net_cv:.3f}): the machine accounts for the "
                              "difference", **figures)
            message += denied + (f"; less those waits the runs still differ (CV {net_cv:.3f}): "
                                 "more than the machine accounts for")
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
