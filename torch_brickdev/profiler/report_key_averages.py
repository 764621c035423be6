"""A report beside PyTorch's own profilers: ``key_averages()`` of the legacy profiler or
``torch.profiler`` next to the registry's figures for the same names, and the calls PyTorch folds
away (:func:`folded_by_pytorch`)."""

from __future__ import annotations

from typing import Optional

from ..argcheck import type_name
from ._kineto import is_brick_activity
from .report import Report, _check_row_limit

__all__ = ["compare_with_key_averages", "folded_by_pytorch"]


def folded_by_pytorch(report: Report) -> dict:
    """Calls per name that PyTorch's profilers fold away: ``key_averages()`` (through
    ``EventList``) drops an op whose parent has the same name and no other child, lifting its
    device time into the parent (``aten::div_`` calling ``aten::div_``, ``aten::mul`` calling
    ``aten::mul``). The registry counts every call, so for such a name its count is PyTorch's
    plus these. Read from the report's call paths: a path whose parent path has this one child
    path and the same name."""
    if not isinstance(report, Report):
        raise TypeError(f"folded_by_pytorch: report must be a Report, got {type_name(report)}")
    children = {}
    for p in report.paths:
        parent, _, _ = p.path.rpartition("/")
        children.setdefault(parent, []).append(p)
    folded = {}
    for parent, kids in children.items():
        if len(kids) == 1 and parent and parent.rpartition("/")[2] == kids[0].name:
            folded[kids[0].name] = folded.get(kids[0].name, 0) + kids[0].count
    return folded


def compare_with_key_averages(prof, report: Report, row_limit: Optional[int] = None) -> str:
    """Rows of ``prof.key_averages()`` (PyTorch's legacy profiler or ``torch.profiler``) beside
    the registry's figures for the same names.

    How the counts relate. The registry counts every call of every op and range, on every
    thread, nested same-name calls included. PyTorch's ``key_averages()`` differs in three ways,
    all accounted for here:

    * it splits one name into two rows, the calls whose device time truncates to 0 us and the
      others (``is_legacy``; the legacy path reads device time in whole microseconds): the rows
      are merged;
    * it folds a call nested alone in a call of the same name into it: the ``folded`` column
      (:func:`folded_by_pytorch`), so ``brick calls - folded == torch calls``;
    * it sees only threads that carry its thread-local state: work PyTorch's autograd engine
      runs on its device threads outside a graph task's state (e.g. buffers it allocates during
      ``backward()``) is in the registry only, and shows as a difference left over.

    The legacy path truncates each event's device time to whole microseconds; the registry keeps
    nanoseconds, so short ops differ most in time. The rows brick's torch.profiler plugin adds
    (``brick::`` device activities, launches) are left out: their time is in their ops' rows.
    ``row_limit``: the first rows only (None: every row)."""
    if not callable(getattr(prof, "key_averages", None)):
        raise TypeError(f"compare_with_key_averages: prof must be a profiler with key_averages() "
                        f"(torch.profiler.profile or torch.autograd.profiler.profile), got "
                        f"{type_name(prof)}")
    if not isinstance(report, Report):
        raise TypeError(f"compare_with_key_averages: report must be a Report, got {type_name(report)}")
    _check_row_limit(row_limit, "compare_with_key_averages")
    # key_averages() may split one name into rows (with and without device time): merge them.
    legacy = {}
    for avg in prof.key_averages():
        if is_brick_activity(avg.key):
            continue
        count, total = legacy.get(avg.key, (0, 0.0))
        legacy[avg.key] = (count + avg.count, total + getattr(avg, "device_time_total", 0.0))
    folded = folded_by_pytorch(report)
    rows = []
    for key, (count, legacy_total) in legacy.items():
        brick = report.brick(key) if key in report else None  # its brick row, not its host row
        rows.append((key, count, legacy_total, brick))
    rows.sort(key=lambda r: -(r[3].total_ns if r[3] else 0))
    if row_limit is not None:
        rows = rows[:row_limit]
    width = max([4] + [len(r[0]) for r in rows]) + 2
    header = (f"{'Name':<{width}}{'torch calls':>13}{'torch BRICK us':>17}"
              f"{'brick calls':>12}{'folded':>8}{'brick total us':>16}{'brick avg us':>14}"
              f"{'diff':>8}")
    lines = ["-" * len(header), header, "-" * len(header)]
    for name, count, legacy_total, brick in rows:
        if brick is None:
            lines.append(f"{name:<{width}}{count:>13}{legacy_total:>17.1f}{'-':>12}{'-':>8}"
                         f"{'-':>16}{'-':>14}{'-':>8}")
            continue
        total_us = brick.total_ns / 1e3
        diff = f"{100 * (legacy_total - total_us) / total_us:+.0f}%" if total_us else "-"
        lines.append(f"{name:<{width}}{count:>13}{legacy_total:>17.1f}{brick.count:>12}"
                     f"{folded.get(name, 0):>8}{total_us:>16.1f}{brick.avg_us():>14.3f}{diff:>8}")
    lines.append("-" * len(header))
    lines.append("calls: brick counts every call on every thread; torch calls + folded == brick "
                 "calls, except work only the registry's global callback sees (autograd device "
                 "threads outside a graph task)")
    return "\n".join(lines)
