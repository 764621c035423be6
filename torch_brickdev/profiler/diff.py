"""Two reports compared brick by brick: what changed in count, p50, p99 and total, and whether a
change is a regression or inside the runs' own spread.

The verdict reads the per-call distributions the registry keeps. A brick is ``slower`` when its
median call grew by more than ``threshold``, its fastest call grew by as much, and the new median
lies above the base run's 90th percentile. A shared machine makes calls slower now and then
(descheduling, caches), which moves the median and the tail but hardly the fastest call; a
slower kernel moves all three. ``faster`` is the mirror image. A change past the threshold that
the runs' spread explains is ``noise``; a brick whose number of calls changed is ``count``
(reported even when its times are equal: the program did different work); ``new`` and ``gone``
are bricks only one report has. A slower brick that adds less than ``min_share`` of the base
run's wall time is ``small`` (reported, not failed).

A slower brick is ``busy`` (inconclusive, not failed) only on evidence that the machine denied
the new run CPU time in proportion to the slowdown: the time its thread waited for a CPU plus
its share of the hypervisor's steal (:func:`.machine.denied`), beyond the base run's, must cover
``machine.DENIED_COVER`` (half) of the time the run's wall added and of the time the brick
added. Idle time, sleep, I/O and locks are the program's own, and other processes busy on CPUs
of their own did not make it wait: neither counts. With that evidence, a brick that slowed
beyond the rest of the run is still ``slower``: when every brick slowed (the median brick's p50
by more than half the threshold), one slowed more than the slowdown 90 % of the other bricks
stayed within, by the threshold (a busy machine slows ops unevenly); when the run's wall outside
the brick slowed by more than half the threshold, one slowed beyond that by the threshold.

>>> d = diff_reports(load_report("base.json"), load_report("new.json"), threshold=0.10)
>>> print(d.table())            # or d.markdown() for a CI comment, d.to_dict() for JSON
>>> print(d.table(all_rows=True))  # the faster, noise, small and same bricks too
>>> d.regressions               # the slower bricks (and, unless ignore_counts, count changes)
"""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Tuple

from ..argcheck import check_bool, check_int, describe, describe_value
from ..terminal import printable
from . import machine
from ._stats import BrickStats, row_label
from .report import Report

__all__ = ["BrickChange", "ReportDiff", "VERDICTS", "diff_reports"]

#: Verdicts, most severe first (the order of the table).
VERDICTS = ("slower", "count", "new", "gone", "busy", "small", "noise", "faster", "same")
#: The verdicts a table shows unless asked for every row: those that fail or make the diff
#: inconclusive, and the changes in what the program did.
SHOWN_VERDICTS = ("slower", "count", "new", "gone", "busy")

# Brick names are cut to this many characters in a table (their length said).
_NAME_LIMIT = 120


@dataclass(frozen=True)
class BrickChange:
    """One brick in both reports (or one): its figures before and after and the verdict."""

    name: str
    verdict: str
    base_count: int
    new_count: int
    base_p50_ns: Optional[float]
    new_p50_ns: Optional[float]
    base_p99_ns: Optional[float]
    new_p99_ns: Optional[float]
    base_total_ns: int
    new_total_ns: int
    reason: str

    @property
    def p50_ratio(self) -> Optional[float]:
        if not self.base_p50_ns or self.new_p50_ns is None:
            return None
        return self.new_p50_ns / self.base_p50_ns


def _ratio_text(ratio: Optional[float]) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _us(ns: Optional[float]) -> str:
    return "-" if ns is None else f"{ns / 1e3:.2f}"


def _change(name: str, base: Optional[BrickStats], new: Optional[BrickStats],
            threshold: float, floor_ns: float, busy: Optional[str],
            not_busy: str) -> BrickChange:
    """The brick's change. ``busy``: why the machine accounts for a slowdown (None: it does not,
    and ``not_busy``, if not empty, says why, after a slower brick's reason)."""
    def fig(b, attr):
        return getattr(b, attr) if b is not None and b.count else None
    figures = dict(base_count=base.count if base else 0, new_count=new.count if new else 0,
                   base_p50_ns=fig(base, "p50_ns"), new_p50_ns=fig(new, "p50_ns"),
                   base_p99_ns=fig(base, "p99_ns"), new_p99_ns=fig(new, "p99_ns"),
                   base_total_ns=base.total_ns if base else 0,
                   new_total_ns=new.total_ns if new else 0)
    if not figures["base_count"]:
        return BrickChange(name, "new", **figures, reason="only in the new report")
    if not figures["new_count"]:
        return BrickChange(name, "gone", **figures, reason="only in the base report")
    if base.count != new.count:
        return BrickChange(name, "count", **figures,
                           reason=f"{base.count} calls, now {new.count}")
    b50, n50 = base.p50_ns, new.p50_ns
    ratio = n50 / b50 if b50 > 0 else (math.inf if n50 > 0 else 1.0)
    fastest = new.min_ns / base.min_ns if base.min_ns > 0 else (math.inf if new.min_ns else 1.0)
    shown = f"p50 {_ratio_text(ratio)}, min {_ratio_text(fastest)}"
    if ratio > 1 + threshold:
        if fastest > 1 + threshold and n50 > base.p90_ns:
            added = new.total_ns - base.total_ns
            if added < floor_ns:
                return BrickChange(name, "small", **figures, reason=(
                    f"{shown}: slower, but it adds {added / 1e6:.3f} ms, under the "
                    f"{floor_ns / 1e6:.3f} ms that counts (min_share of the base wall)"))
            if busy is not None:
                return BrickChange(name, "busy", **figures,
                                   reason=f"{shown}: slower, but {busy}: inconclusive")
            return BrickChange(name, "slower", **figures, reason=(
                f"{shown}: even the fastest call slowed, the median above the base run's p90 "
                f"({_us(base.p90_ns)} us)" + (f"; {not_busy}" if not_busy else "")))
        return BrickChange(name, "noise", **figures, reason=(
            f"{shown}: inside the runs' spread (base min {_us(base.min_ns)} us, p90 "
            f"{_us(base.p90_ns)} us)"))
    if ratio < 1 / (1 + threshold):
        if fastest < 1 / (1 + threshold) and new.p90_ns < b50:
            return BrickChange(name, "faster", **figures, reason=(
                f"{shown}: even the fastest call sped up, the new run's p90 below the base "
                "median"))
        return BrickChange(name, "noise", **figures, reason=(
            f"{shown}: inside the runs' spread (new min {_us(new.min_ns)} us, p90 "
            f"{_us(new.p90_ns)} us)"))
    return BrickChange(name, "same", **figures, reason=f"{shown}: within {threshold:.0%}")


@dataclass(frozen=True)
class ReportDiff:
    """The bricks of two reports compared; ``changes`` ordered by verdict, then by how much
    their total time moved."""

    changes: List[BrickChange]
    threshold: float
    ignore_counts: bool
    base_wall_ns: int
    new_wall_ns: int

    @property
    def regressions(self) -> List[BrickChange]:
        """The changes that fail: slower bricks, and (unless ignore_counts) changed counts and
        bricks only one report has."""
        failing = ("slower",) if self.ignore_counts else ("slower", "count", "new", "gone")
        return [c for c in self.changes if c.verdict in failing]

    @property
    def passed(self) -> bool:
        return not self.regressions

    @property
    def inconclusive(self) -> bool:
        """No regression, but a brick slowed while the machine was busy: rerun on a quiet one."""
        return self.passed and any(c.verdict == "busy" for c in self.changes)

    def summary(self) -> str:
        counts = {v: sum(c.verdict == v for c in self.changes) for v in VERDICTS}
        shown = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
        wall = (f"wall {self.base_wall_ns / 1e6:.3f} -> {self.new_wall_ns / 1e6:.3f} ms"
                if self.base_wall_ns else "")
        verdict = ("INCONCLUSIVE (the machine denied the new run CPU time; rerun on a quiet one)"
                   if self.inconclusive else "PASS" if self.passed
                   else f"FAIL ({len(self.regressions)} regression(s))")
        return f"verdict: {verdict}; {len(self.changes)} bricks: {shown}; threshold " \
               f"{self.threshold:.0%}" + (f"; {wall}" if wall else "")

    def _rows(self, changes: List[BrickChange]):
        return [(printable(c.name, _NAME_LIMIT), c.verdict, f"{c.base_count}->{c.new_count}"
                 if c.base_count != c.new_count else str(c.new_count),
                 f"{_us(c.base_p50_ns)}->{_us(c.new_p50_ns)}", _ratio_text(c.p50_ratio),
                 f"{_us(c.base_p99_ns)}->{_us(c.new_p99_ns)}",
                 f"{c.base_total_ns / 1e6:.3f}->{c.new_total_ns / 1e6:.3f}", c.reason)
                for c in changes]

    _HEADER = ("brick", "verdict", "calls", "p50 us", "p50", "p99 us", "total ms", "why")

    def _shown(self, row_limit: Optional[int], all_rows: bool, all_rows_option: str,
               where: str) -> Tuple[List[BrickChange], str]:
        """The changes a table lists, and a line saying what it leaves out ("" for nothing)."""
        all_rows = check_bool(all_rows, "all_rows", where)
        row_limit = check_int(row_limit, "row_limit", where, low=1, optional=True)
        listed = [c for c in self.changes if all_rows or c.verdict in SHOWN_VERDICTS]
        hidden = {v: 0 if all_rows or v in SHOWN_VERDICTS else
                  sum(c.verdict == v for c in self.changes) for v in VERDICTS}
        notes = []
        if row_limit is not None and len(listed) > row_limit:
            notes.append(f"{len(listed) - row_limit} more row(s) past the row limit "
                         f"({row_limit})")
            listed = listed[:row_limit]
        if any(hidden.values()):
            notes.append(f"{sum(hidden.values())} row(s) hidden ("
                         + ", ".join(f"{n} {v}" for v, n in hidden.items() if n)
                         + f"); {all_rows_option} shows them")
        return listed, "; ".join(notes)

    def table(self, row_limit: Optional[int] = None, all_rows: bool = False,
              all_rows_option: str = "all_rows=True") -> str:
        """A text table, most severe first, of the bricks that bear on the verdict (slower,
        count, new, gone, busy); ``all_rows`` lists every brick. A line says how many rows it
        left out and what shows them (``all_rows_option``: a command's option, say)."""
        listed, left_out = self._shown(row_limit, all_rows, all_rows_option, "ReportDiff.table()")
        rows = [self._HEADER] + self._rows(listed)
        widths = [max(len(r[i]) for r in rows) for i in range(len(self._HEADER) - 1)]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "  " + r[-1]
                 for r in rows] if listed else ["No brick bears on the verdict."]
        return "\n".join(lines + ([f"({left_out})"] if left_out else []) + [self.summary()])

    def markdown(self, row_limit: Optional[int] = None, all_rows: bool = False,
                 all_rows_option: str = "all_rows=True") -> str:
        """A Markdown table of the bricks that bear on the verdict (``all_rows``: of every
        brick), for a CI comment."""
        listed, left_out = self._shown(row_limit, all_rows, all_rows_option,
                                       "ReportDiff.markdown()")
        lines = [f"**brick profile diff** — {self.summary()}", ""]
        if listed:
            lines.append("| " + " | ".join(self._HEADER) + " |")
            lines.append("|" + "---|" * len(self._HEADER))
            for row in self._rows(listed):
                lines.append("| " + " | ".join(_markdown_cell(cell) for cell in row) + " |")
        else:
            lines.append("No brick bears on the verdict.")
        if left_out:
            lines += ["", _markdown_cell(f"({left_out})")]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"threshold": self.threshold, "ignore_counts": self.ignore_counts,
                "passed": self.passed, "inconclusive": self.inconclusive,
                "summary": self.summary(),
                "regressions": [c.name for c in self.regressions],
                "changes": [dict(asdict(c), p50_ratio=c.p50_ratio) for c in self.changes]}


def _markdown_cell(text: str) -> str:
    """``text`` (printable already) as Markdown shows it literally in a table cell."""
    return text.replace("\\", "\\\\").replace("|", "\\|")


class _Denial:
    """How much more CPU time the machine denied the new run's thread than the base run's."""

    def __init__(self, base: Report, new: Report):
        got = machine.denied(new.machine, new.wall_ns)
        before = machine.denied(base.machine, base.wall_ns)
        # A base run without the figures counts as denied nothing: the new run's own wait must
        # cover the slowdown.
        self.extra_ns = 0.0 if got is None else got.ns - (before.ns if before else 0.0)
        self.added_wall_ns = max(0, new.wall_ns - base.wall_ns)
        self.measured = got is not None
        self._text = "" if got is None else got.text() + (
            f" against {before.text()}" if before else "")

    def covers(self, added_ns: float) -> bool:
        """Whether the extra denied time covers machine.DENIED_COVER of the wall's added time and
        ``added_ns`` (a brick's)."""
        return self.extra_ns > 0 and \
            self.extra_ns >= machine.DENIED_COVER * max(self.added_wall_ns, added_ns)

    def why(self, added_ns: float) -> str:
        needed = max(self.added_wall_ns, added_ns)
        what = (f"the {needed / 1e6:.1f} ms the wall added" if needed == self.added_wall_ns
                else f"the {needed / 1e6:.1f} ms this brick added")
        return (f"the new run's thread was denied {self.extra_ns / 1e6:.1f} ms more CPU time "
                f"than the base run's ({self._text}), {self.extra_ns / max(needed, 1):.0%} of "
                f"{what}")

    def short_of(self, added_ns: float) -> str:
        """Why the machine does not account for a slowdown of ``added_ns``."""
        needed = max(self.added_wall_ns, added_ns)
        if not self.measured:
            return ("no run-queue wait was measured for the new run, so nothing shows the "
                    "machine denied it CPU time")
        extra = max(self.extra_ns, 0.0)
        return (f"the machine denied the new run's thread only {extra / 1e6:.1f} ms more CPU "
                f"time ({self._text}) of the {needed / 1e6:.1f} ms added, under "
                f"{machine.DENIED_COVER:.0%}: the program's own time (work, sleep, I/O, locks)")


# A brick slowed "no more than the rest" when its p50 ratio is within the threshold of the ratio
# this share of the other bricks did not exceed. A slower machine slows ops unevenly: in one
# measured pair of demo runs (the second on the same idle VM 1.2x slower in wall, its thread on a
# CPU throughout), the bricks' p50 ratios had quartiles 1.24x, 1.47x and 1.76x, matmuls 1.15x and
# microsecond ops up to 2x and beyond; measured against the median, six of them were "slower".
_REST_QUANTILE = 0.9


def _p50_ratios(base_by: Dict[str, BrickStats], new_by: Dict[str, BrickStats]) -> List[float]:
    """The ratios of the p50s of the bricks both runs called equally often, ascending."""
    return sorted(new_by[n].p50_ns / b.p50_ns for n, b in base_by.items()
                  if n in new_by and b.count and b.count == new_by[n].count and b.p50_ns > 0)


def _median(ratios: List[float]) -> float:
    """How much the whole run slowed: the median ratio (1.0 when fewer than 5 bricks compare)."""
    if len(ratios) < 5:
        return 1.0
    middle = len(ratios) // 2
    return ratios[middle] if len(ratios) % 2 else (ratios[middle - 1] + ratios[middle]) / 2


def _rest_of(ratios: List[float], ratio: float) -> float:
    """The ratio that _REST_QUANTILE of the other bricks (``ratios`` without one ``ratio``) did
    not exceed (nearest rank)."""
    others = len(ratios) - 1
    rank = max(1, math.ceil(_REST_QUANTILE * others)) - 1  # in the others, 0-based
    # One occurrence of `ratio` leaves the list: the entries after it move one place down.
    return ratios[rank + 1] if bisect.bisect_left(ratios, ratio) <= rank else ratios[rank]


# The time outside a brick judges the machine only when it is at least this share of the base
# run's wall (the wall less a brick that spans nearly all of it is a few gaps, as noisy as they
# are short).
_OUTSIDE_MIN_SHARE = 0.25


def _outside_ratio(base_wall_ns: int, new_wall_ns: int, base: BrickStats,
                   new: BrickStats) -> Optional[float]:
    """How much the wall outside the brick grew from the base run to the new one (None when that
    time is under _OUTSIDE_MIN_SHARE of the base wall)."""
    base_outside = base_wall_ns - base.total_ns
    if base_wall_ns <= 0 or base_outside < _OUTSIDE_MIN_SHARE * base_wall_ns:
        return None
    return (new_wall_ns - new.total_ns) / base_outside


def diff_reports(base: Report, new: Report, *, threshold: float = 0.10, by: str = "name",
                 ignore_counts: bool = False, min_share: float = 0.005) -> ReportDiff:
    """Compares ``new`` with ``base`` brick by brick (``by="name"``, or ``"path"`` for each call
    path). ``threshold``: the relative change of a brick's median call that counts (0.10:
    10 %), when the runs' spread does not explain it. ``min_share``: a slower brick whose total
    grew by less than this share of the base run's wall time (0.005: 0.5 %) is ``small``, not
    a regression (a microsecond op drifting on a shared machine does not fail a build)."""
    where = "diff_reports"
    for arg, value in (("base", base), ("new", new)):
        if not isinstance(value, Report):
            raise TypeError(f"{where}: {arg} must be a Report (see load_report), got "
                            f"{describe(value)}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or \
            not math.isfinite(threshold) or threshold < 0:
        raise ValueError(f"{where}: threshold must be a finite number >= 0 (0.10 for 10 %), got "
                         f"{describe_value(threshold)}")
    if isinstance(min_share, bool) or not isinstance(min_share, (int, float)) or \
            not 0 <= min_share <= 1:
        raise ValueError(f"{where}: min_share must be a number in [0, 1] (0.005 for 0.5 % of "
                         f"the base wall), got {describe_value(min_share)}")
    if by not in ("name", "path"):
        raise ValueError(f"{where}: by must be 'name' or 'path', got {describe_value(by)}")
    ignore_counts = check_bool(ignore_counts, "ignore_counts", where)
    def key(b: BrickStats) -> str:  # an op's host row is compared as a brick of its own
        return row_label(b.name if by == "name" else b.path, b.kind)

    base_by: Dict[str, BrickStats] = {}
    new_by: Dict[str, BrickStats] = {}
    for entries, into in ((base.bricks if by == "name" else base.paths, base_by),
                          (new.bricks if by == "name" else new.paths, new_by)):
        for b in entries:
            into.setdefault(key(b), b)
    names = list(base_by) + [n for n in new_by if n not in base_by]
    floor_ns = min_share * base.wall_ns
    denial = _Denial(base, new)
    ratios = _p50_ratios(base_by, new_by)
    common = _median(ratios)
    everything_slowed = common > 1 + threshold / 2

    def machine_verdict(name: str) -> Tuple[Optional[str], str]:
        """(why the machine accounts for the brick's slowdown, or None; if not, why not)."""
        b, n = base_by.get(name), new_by.get(name)
        if b is None or n is None or not b.p50_ns or b.count != n.count:
            return None, ""  # not a slowdown the machine could explain
        added = n.total_ns - b.total_ns
        if not denial.covers(added):
            return None, denial.short_of(added)
        # What the rest of the run shows of the machine: a brick slowed beyond all of it by the
        # threshold slowed more than the machine did.
        ratio = n.p50_ns / b.p50_ns
        shows = []
        if everything_slowed:
            rest = _rest_of(ratios, ratio)
            shows.append((rest, f"every brick slowed (their median p50 {common:.2f}x, "
                                f"{_REST_QUANTILE:.0%} of the others within {rest:.2f}x)"))
        outside = _outside_ratio(base.wall_ns, new.wall_ns, b, n)
        if outside is not None and outside > 1 + threshold / 2:
            shows.append((outside, f"the run's wall outside this brick slowed {outside:.2f}x "
                                   f"({(base.wall_ns - b.total_ns) / 1e6:.3f} -> "
                                   f"{(new.wall_ns - n.total_ns) / 1e6:.3f} ms)"))
        if shows and ratio > max(r for r, _ in shows) * (1 + threshold):
            return None, ("; ".join(text for _, text in shows) + ", this one beyond that by "
                          "the threshold: more than the machine")
        return denial.why(added), ""

    changes = [_change(n, base_by.get(n), new_by.get(n), threshold, floor_ns,
                       *machine_verdict(n)) for n in names]
    severity = {v: i for i, v in enumerate(VERDICTS)}
    changes.sort(key=lambda c: (severity[c.verdict], -abs(c.new_total_ns - c.base_total_ns)))
    return ReportDiff(changes, threshold, ignore_counts, base.wall_ns, new.wall_ns)
