"""The profiler's shared types: what a sync mode is, where ops can be timed and what one
brick's figures are.

A leaf: the registry's surface (_registry.py), the report (report.py) and the session above both
(session.py) import it; it imports nothing of theirs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import Iterable, Optional, Union

from ..argcheck import describe


class SyncMode(str, enum.Enum):
    """What a brick's duration measures (see the module documentation)."""

    IMMEDIATE = "immediate"
    DEFERRED = "deferred"
    EVENT = "event"

    @classmethod
    def parse(cls, mode: Union["SyncMode", str], *, arg: str = "mode",
              where: str = "brick profiler: SyncMode.parse()") -> "SyncMode":
        """The member named ``mode`` (case-insensitive). ``arg`` and ``where`` name the caller's
        argument and function in error messages."""
        if isinstance(mode, SyncMode):
            return mode
        valid = ", ".join(repr(m.value) for m in cls)
        if not isinstance(mode, str):
            raise TypeError(
                f"{where}: {arg} must be a SyncMode or a str ({valid}), "
                f"got {describe(mode)}"
            )
        try:
            return cls(mode.lower())
        except ValueError:
            raise ValueError(
                f"{where}: {arg}={mode!r} is not a sync mode; expected one of {valid}"
            ) from None


#: Where a profile times ops (``profile(ops=...)``): every op the dispatcher runs, or brick's
#: kernels only.
OP_TIMINGS = ("dispatcher", "kernels")

#: What gives a profile's Event mode its device times (``profile(device_timing=...)``): device
#: events around each brick, or the device's own record of the work (a work tracer).
DEVICE_TIMINGS = ("events", "traced")


def shapes_refused(ops: str, record_shapes: bool, roofline: bool) -> Optional[str]:
    """The option asking for input shapes that ``ops`` cannot give (``"roofline"`` or
    ``"record_shapes"``), or None. ``ops="kernels"`` records no input shapes: they are the
    dispatcher's, and the roofline is computed from them."""
    if ops != "kernels":
        return None
    return "roofline" if roofline else "record_shapes" if record_shapes else None


#: What a brick is: an op, a range (``record_function``, a module), or ``host``: the calls of an op
#: that ran no brick work (no kernel, copy or brick allocation: a CPU op), with their host time,
#: which is never device time.
BRICK_KINDS = ("op", "range", "host")


def row_label(name: str, kind: str) -> str:
    """A brick's name where rows are keyed by name alone (diff, top): an op's host row, its calls
    that ran on the CPU, apart from its brick row."""
    return f"{name} [host]" if kind == "host" else name


@dataclass(frozen=True)
class BrickStats:
    """Figures of one brick: an op (``aten::mm``) or a range (``record_function("MLP")``).

    Aggregated by name, ``path`` is the name itself; aggregated by call path (``by="path"``),
    it holds the ancestors too (``"Layer0/MLP/aten::mm"``) and ``depth`` their number.
    """

    name: str
    path: str
    kind: str  # one of BRICK_KINDS
    device: int  # brick device index; -1 when recorded on several devices
    depth: int
    count: int
    total_ns: int
    min_ns: int
    max_ns: int
    last_ns: int
    p50_ns: float
    p90_ns: float
    p99_ns: float

    def avg_us(self) -> float:
        """The canonical per-call figure: ``total_ns / count / 1000``."""
        return self.total_ns / self.count / 1000.0 if self.count else 0.0

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["avg_us"] = self.avg_us()
        return d


#: A brick's figures, in order: the fields of :class:`BrickStats`. A report's brick entries
#: (_report_schema.BRICK_FIELDS) and the native registry's rows and snapshot entries
#: (``_C._profiler.REPORT_FIELDS``) are checked against them when their modules load.
BRICK_STATS_FIELDS = tuple(f.name for f in fields(BrickStats))


def check_brick_fields(names: Iterable[str], source: str, remedy: str = "") -> None:
    """Raises ImportError unless ``names`` (``source``'s fields of a brick) are
    :data:`BRICK_STATS_FIELDS`, in their order."""
    names = tuple(names)
    if names != BRICK_STATS_FIELDS:
        raise ImportError(
            f"brick profiler: {source} ({', '.join(names)}) are not BrickStats' fields in their "
            f"order ({', '.join(BRICK_STATS_FIELDS)}){'; ' + remedy if remedy else ''}")
