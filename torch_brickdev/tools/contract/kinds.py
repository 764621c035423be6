"""The check kinds a contract's checks are instances of, by name (:data:`KIND_BODIES`), and
:func:`run_check`, which runs one check on a report read for its contract (:class:`Subject`).
file.KINDS lists each kind's parameters."""

from __future__ import annotations

from typing import Callable, Dict

from .file import Check
from .kinds_counts import count, rate
from .kinds_integrity import avg_agreement, completeness, health, measured
from .kinds_timing import budget, coverage, ordering, stability, sync_mode
from .numbers import cv
from .report_view import Subject, subject
from .result import FAIL, INCONCLUSIVE, NA, PASS, STATUSES, CheckResult, Result

__all__ = ["CheckResult", "FAIL", "INCONCLUSIVE", "KIND_BODIES", "NA", "PASS", "STATUSES",
           "Subject", "cv", "run_check", "subject"]


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
    if check.async_modes is not None and s.asynchronous and s.mode.value not in check.async_modes:
        return result(NA, f"on an asynchronous device applies in {', '.join(check.async_modes)} "
                      f"mode only: the report was timed in {s.mode.value} mode on "
                      f"{s.report.device.get('runtime', 'an asynchronous runtime')}, where its "
                      f"durations are the launches', not the device's work",
                      sync_mode=s.mode.value)
    try:
        return KIND_BODIES[check.kind](check.params, s, result)
    except Exception as error:  # a check must never hide the others
        return result(FAIL, f"check raised {type(error).__name__}: {error}")


KIND_BODIES: Dict[str, Callable[[dict, Subject, Result], CheckResult]] = {
    "coverage": coverage, "count": count, "rate": rate, "ordering": ordering,
    "sync-mode": sync_mode, "completeness": completeness, "avg-agreement": avg_agreement,
    "stability": stability, "measured": measured, "health": health, "budget": budget,
}
