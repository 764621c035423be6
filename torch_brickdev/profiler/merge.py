"""One view across ranks: the reports of a distributed run's ranks merged per brick.

Each rank profiles its own process and writes its own ``report.json`` (its metadata says which
rank it is: :class:`torch_brickdev.profiler.profile` fills ``distributed`` in a process that is
a rank). :func:`merge_reports` lines the ranks' bricks up by name: per brick its calls and total
time on every rank, the min / median / max of the total across ranks, and the slowest rank, so
a straggler (one rank's data loading, an uneven shard) shows as a brick whose max stands far
above its median. ``python -m torch_brickdev merge out/rank*/report.json`` prints the table and
writes the merged report.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

from ..argcheck import describe
from .report import Report, load_report

MERGED_FORMAT = "torch_brickdev.merged_report"
MERGED_VERSION = 1


@dataclass(frozen=True)
class MergedBrick:
    """One brick across ranks; ``calls`` and ``total_ns`` are indexed like :attr:`MergedReport.ranks`,
    with 0 where a rank never ran it (``missing_on`` lists those ranks)."""

    name: str
    kind: str
    calls: List[int]
    total_ns: List[int]
    missing_on: List[int]

    @property
    def min_ns(self) -> int:
        return min(self.total_ns)

    @property
    def median_ns(self) -> float:
        return float(statistics.median(self.total_ns))

    @property
    def max_ns(self) -> int:
        return max(self.total_ns)

    def slowest(self, ranks: Sequence[int]) -> int:
        """The rank with the largest total (the lowest such rank on a tie)."""
        return ranks[self.total_ns.index(self.max_ns)]

    def imbalance(self) -> float:
        """max / median of the per-rank totals (1.0: balanced)."""
        median = self.median_ns
        return self.max_ns / median if median > 0 else (1.0 if self.max_ns == 0 else float("inf"))


class MergedReport:
    """The ranks' reports merged by brick name (see the module documentation)."""

    def __init__(self, ranks: List[int], world_size: Optional[int], wall_ns: List[int],
                 bricks: List[MergedBrick], collectives: Dict[str, Dict[str, list]],
                 sources: List[str]):
        self.ranks, self.world_size, self.wall_ns = ranks, world_size, wall_ns
        self.bricks, self.collectives, self.sources = bricks, collectives, sources

    def brick(self, name: str) -> MergedBrick:
        for b in self.bricks:
            if b.name == name:
                return b
        raise KeyError(f"brick merge: no brick named {name!r} on any rank")

    def to_dict(self) -> dict:
        return {
            "format": MERGED_FORMAT, "version": MERGED_VERSION, "ranks": self.ranks,
            "world_size": self.world_size, "wall_ns": self.wall_ns, "sources": self.sources,
            "bricks": [{
                "name": b.name, "kind": b.kind, "calls": b.calls, "total_ns": b.total_ns,
                "min_ns": b.min_ns, "median_ns": b.median_ns, "max_ns": b.max_ns,
                "slowest_rank": b.slowest(self.ranks), "missing_on": b.missing_on,
            } for b in self.bricks],
            "collectives": self.collectives,
        }

    def write_json(self, path: Union[str, os.PathLike]) -> str:
        path = os.fspath(path)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=2, allow_nan=False)
            f.write("\n")
        return path

    def table(self, row_limit: Optional[int] = None) -> str:
        """Per brick (largest median first): calls per rank, min / median / max of the per-rank
        totals, the slowest rank and max / median."""
        rows = sorted(self.bricks, key=lambda b: (-b.median_ns, b.name))
        if row_limit is not None and row_limit > 0:
            rows = rows[:row_limit]
        width = max([len("Brick")] + [len(b.name) for b in rows])
        header = (f"{'Brick':<{width}}  {'Kind':>5}  {'Calls/rank':>12}  {'Min ms':>9}  "
                  f"{'Median ms':>9}  {'Max ms':>9}  {'Slowest':>7}  {'Max/med':>7}")
        rule = "-" * len(header)
        lines = [f"{len(self.ranks)} ranks ({', '.join(map(str, self.ranks))}) of world size "
                 f"{self.world_size if self.world_size is not None else 'unknown'}; wall ms per "
                 "rank: " + ", ".join(f"{w / 1e6:.3f}" for w in self.wall_ns), rule, header, rule]
        for b in rows:
            calls = str(b.calls[0]) if len(set(b.calls)) == 1 else "/".join(map(str, b.calls))
            lines.append(
                f"{b.name:<{width}}  {b.kind:>5}  {calls:>12}  {b.min_ns / 1e6:9.3f}  "
                f"{b.median_ns / 1e6:9.3f}  {b.max_ns / 1e6:9.3f}  {b.slowest(self.ranks):>7}  "
                f"{b.imbalance():7.2f}" + (f"  missing on rank(s) {b.missing_on}" if b.missing_on else ""))
        lines.append(rule)
        if self.collectives:
            lines.append("collectives (brick c10d backend), per rank: calls, input bytes, "
                         "ms in the collective (enqueue to completion)")
            for name, figures in sorted(self.collectives.items()):
                times = ", ".join(f"{t / 1e6:.3f}" for t in figures["time_ns"])
                lines.append(f"  {name}: calls {figures['calls']}, bytes {figures['bytes']}, "
                             f"group size {figures['group_size']}, ms [{times}]")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _rank_of(report: Report, position: int, label: str) -> tuple:
    info = report.metadata.get("distributed")
    if info is None:
        return position, None
    if not isinstance(info, dict) or not isinstance(info.get("rank"), int) \
            or isinstance(info.get("rank"), bool) or info["rank"] < 0:
        raise ValueError(f"brick merge: {label}: metadata.distributed.rank must be a "
                         f"non-negative integer, got {info!r}")
    return info["rank"], info.get("world_size")


def merge_reports(sources: Sequence[Union[str, os.PathLike, dict, Report]]) -> MergedReport:
    """Merges rank reports (paths, parsed dicts or :class:`Report` objects). A report's rank is
    its ``metadata.distributed.rank`` (its position in ``sources`` when it has none); two reports
    of one rank, or reports of different world sizes, are refused."""
    if isinstance(sources, (str, bytes, os.PathLike)) or not isinstance(sources, Sequence):
        raise TypeError(f"brick merge_reports(): sources must be a list of report paths or reports, "
                        f"got {describe(sources)}")
    if not sources:
        raise ValueError("brick merge_reports(): sources holds no reports to merge; expected one "
                         "report.json per rank")
    loaded = []
    for position, source in enumerate(sources):
        label = os.fspath(source) if isinstance(source, (str, os.PathLike)) else f"sources[{position}]"
        report = source if isinstance(source, Report) else load_report(source, where="merge_reports")
        rank, world = _rank_of(report, position, label)
        loaded.append((rank, world, label, report))
    ranks = [r for r, _, _, _ in loaded]
    duplicates = sorted({r for r in ranks if ranks.count(r) > 1})
    if duplicates:
        raise ValueError("brick merge: rank(s) " + ", ".join(map(str, duplicates)) + " appear in "
                         "more than one report: " + ", ".join(
                             label for r, _, label, _ in loaded if r in duplicates))
    worlds = {w for _, w, _, _ in loaded if w is not None}
    if len(worlds) > 1:
        raise ValueError(f"brick merge: the reports come from different world sizes "
                         f"{sorted(worlds)}; expected the ranks of one run")
    loaded.sort(key=lambda item: item[0])
    ranks = [r for r, _, _, _ in loaded]
    # By name and kind: an op's host row (its calls that ran on the CPU) apart from its brick row.
    by_key = [{(b.name, b.kind): b for b in report.bricks} for _, _, _, report in loaded]
    names: Dict[Tuple[str, str], None] = {}
    for rows in by_key:
        names.update(dict.fromkeys(rows))
    bricks = []
    for name, kind in names:
        calls, totals, missing = [], [], []
        for (rank, _, _, _), rows in zip(loaded, by_key):
            b = rows.get((name, kind))
            calls.append(b.count if b else 0)
            totals.append(b.total_ns if b else 0)
            if b is None:
                missing.append(rank)
        bricks.append(MergedBrick(name, kind, calls, totals, missing))
    collectives: Dict[str, Dict[str, list]] = {}
    for _, _, _, report in loaded:
        for name in (report.metadata.get("collectives") or {}):
            collectives.setdefault(name, {"calls": [], "bytes": [], "group_size": [], "time_ns": []})
    for name, merged in collectives.items():
        for _, _, _, report in loaded:
            figures = (report.metadata.get("collectives") or {}).get(name, {})
            for key in merged:
                merged[key].append(figures.get(key, 0))
    return MergedReport(ranks=ranks, world_size=worlds.pop() if worlds else None,
                        wall_ns=[report.wall_ns for _, _, _, report in loaded], bricks=bricks,
                        collectives=collectives, sources=[label for _, _, label, _ in loaded])
