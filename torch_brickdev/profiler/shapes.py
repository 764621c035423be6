"""Input shapes per op: ``profile(record_shapes=True)``.

While a profile records shapes, every op call's *signature* — its inputs' shapes and dtypes, and
the values of its int, bool and int-list arguments (a view's sizes, a convolution's stride) — is
kept beside its brick, and each (op brick, signature) pair gets the calls and the time brick
measured for them: the rows of torch.profiler's ``key_averages(group_by_input_shape=True)``, from
brick's own timing in the profile's sync mode. The calls of an op's signatures add up to the op's
calls. The rows are the report's ``metadata["shapes"]`` (so a report read back has them), and
``report.shape_stats()`` / ``report.table(by="shape")`` show them.

Off by default: recording shapes makes PyTorch copy each op's inputs for the callback and brick
build and look up each call's signature under a lock (cost measured in docs/benchmarks.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from .. import _C
from ..argcheck import type_name

__all__ = ["ShapeStats", "capture", "shape_stats", "shape_table"]

# c10's dtype names, as torch names them.
_DTYPE_NAMES = {
    "Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
    "Long": "int64", "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8",
    "Bool": "bool", "ComplexFloat": "complex64", "ComplexDouble": "complex128",
    "ComplexHalf": "complex32", "Float8_e4m3fn": "float8_e4m3fn", "Float8_e5m2": "float8_e5m2",
}

_TENSOR_DTYPES = set(_DTYPE_NAMES.values()) | {"Undefined"}


@dataclass(frozen=True)
class ShapeStats:
    """One op with one input signature, at one call path (or, merged by :func:`shape_stats`
    with ``by="name"``, over every path: ``path`` is then the name)."""

    name: str
    overload: str  # the overload the calls took: "Tensor" for aten::add.Tensor, "" for none
    path: str
    device: int
    shapes: list  # per input: a tensor's sizes, a tensor list's sizes, [] for anything else
    dtypes: list  # per input: "float32", ..., "TensorList", or the kind of value ("int", "None")
    values: list  # per input: an int, bool or int list's value, None otherwise
    calls: int
    total_ns: int
    min_ns: int
    max_ns: int
    # "op", or "host" for the calls that ran no brick work (a CPU op's: host time, no device
    # time), kept apart from the op's brick calls as the report's bricks keep them. A report
    # written before rows had a kind is read as "op".
    kind: str = "op"

    def label(self) -> str:
        """The name as tables and diffs show it: a host row's with " [host]"."""
        return self.name if self.kind == "op" else f"{self.name} [{self.kind}]"

    def avg_us(self) -> float:
        return self.total_ns / self.calls / 1000.0 if self.calls else 0.0

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["avg_us"] = self.avg_us()
        return d


def capture() -> List[dict]:
    """The registry's rows of the region that recorded shapes, as the report's
    ``metadata["shapes"]`` holds them."""
    rows = []
    for path, name, overload, device, shapes, dtypes, values, calls, total, low, high, kind in \
            _C._profiler.shape_rows():
        rows.append(dict(name=name, overload=overload, path=path, device=device,
                         shapes=json.loads(shapes),
                         dtypes=[_DTYPE_NAMES.get(d, d) for d in json.loads(dtypes)],
                         values=json.loads(values), calls=calls, total_ns=total, min_ns=low,
                         max_ns=high, kind=kind))
    return rows


_FIELDS = {"name": str, "overload": str, "path": str, "device": int, "shapes": list, "dtypes": list,
           "values": list, "calls": int, "total_ns": int, "min_ns": int, "max_ns": int}
_KINDS = ("op", "host")


def _row(entry, index: int) -> ShapeStats:
    if not isinstance(entry, dict):
        raise ValueError(f"brick report: metadata.shapes[{index}] must be an object, got "
                         f"{type_name(entry)}")
    for field, kind in _FIELDS.items():
        value = entry.get(field)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"brick report: metadata.shapes[{index}].{field} must be "
                             f"{'an' if kind is int else 'a'} {kind.__name__}, got {value!r}")
    row_kind = entry.get("kind", "op")  # absent in reports written before rows had a kind
    if row_kind not in _KINDS:
        raise ValueError(f"brick report: metadata.shapes[{index}].kind must be one of "
                         f"{', '.join(map(repr, _KINDS))}, got {row_kind!r}")
    return ShapeStats(**{field: entry[field] for field in _FIELDS}, kind=row_kind)


def shape_stats(metadata: dict, by: str = "name") -> List[ShapeStats]:
    """The rows a report's metadata holds, per call path (``by="path"``) or merged over paths
    per (op, signature) (``by="name"``), slowest total first. Empty when the profile did not
    record shapes."""
    if by not in ("name", "path"):
        raise ValueError(f"brick report: shape_stats(by=...): by must be 'name' or 'path', "
                         f"got {by!r}")
    entries = metadata.get("shapes")
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise ValueError(f"brick report: metadata.shapes must be a list, got "
                         f"{type_name(entries)}")
    rows = [_row(entry, i) for i, entry in enumerate(entries)]
    if by == "name":
        merged: Dict[Tuple[str, ...], ShapeStats] = {}
        for r in rows:
            key = (r.name, r.overload, json.dumps(r.shapes), json.dumps(r.dtypes),
                   json.dumps(r.values), r.kind)
            seen = merged.get(key)
            device = r.device if seen is None or seen.device == r.device else -1
            merged[key] = r if seen is None else ShapeStats(
                name=r.name, overload=r.overload, path=r.name, device=device, shapes=r.shapes, dtypes=r.dtypes,
                values=r.values, calls=seen.calls + r.calls, total_ns=seen.total_ns + r.total_ns,
                min_ns=min(seen.min_ns, r.min_ns), max_ns=max(seen.max_ns, r.max_ns),
                kind=r.kind)
        rows = [r if r.path == r.name else ShapeStats(**{**r.__dict__, "path": r.name})
                for r in merged.values()]
    rows.sort(key=lambda r: -r.total_ns)
    return rows


def _signature_text(r: ShapeStats) -> str:
    parts = []
    for shape, dtype, value in zip(r.shapes, r.dtypes, r.values):
        if dtype == "None":
            parts.append("None")
        elif value is not None:
            parts.append(json.dumps(value))
        elif dtype == "TensorList":
            parts.append(json.dumps(shape))
        elif dtype in _TENSOR_DTYPES:
            parts.append(f"{dtype}{json.dumps(shape)}")
        else:
            parts.append(dtype)  # a value not recorded: its kind ("float", "Device")
    return "(" + ", ".join(parts) + ")"


def shape_table(rows: List[ShapeStats], wall_ns: int, row_limit: Optional[int]) -> str:
    """The rows as a text table: op, inputs (dtype and sizes per tensor; the value of an int,
    bool or int-list argument), calls, total, average, min and max, share of wall."""
    if not rows:
        raise ValueError("brick report: no input shapes; profile with record_shapes=True "
                         "(python -m torch_brickdev profile --record-shapes) for table(by='shape')")
    shown = rows[:row_limit] if row_limit is not None else rows
    width = max(len("Name"), *(len(r.label()) for r in shown)) + 2
    inputs = [_signature_text(r) for r in shown]
    input_width = min(max(len("Inputs"), *(len(i) for i in inputs)), 70) + 2
    header = (f"{'Name':<{width}}{'Inputs':<{input_width}}{'Calls':>9}{'Total ms':>12}"
              f"{'Avg us':>11}{'Min us':>11}{'Max us':>11}{'% wall':>8}")
    rule = "-" * len(header)
    wall = wall_ns or 1
    lines = [rule, header, rule]
    for r, text in zip(shown, inputs):
        if len(text) > input_width - 2:
            text = text[:input_width - 5] + "..."
        lines.append(f"{r.label():<{width}}{text:<{input_width}}{r.calls:>9}"
                     f"{r.total_ns / 1e6:>12.3f}{r.avg_us():>11.3f}{r.min_ns / 1e3:>11.3f}"
                     f"{r.max_ns / 1e3:>11.3f}{100 * r.total_ns / wall:>7.1f}%")
    lines.append(rule)
    lines.append(f"{len(rows)} (op, inputs) rows, slowest total first; the calls of an op's rows "
                 "add up to its calls; [host]: calls that ran on the CPU, not on brick (no device "
                 "time)")
    return "\n".join(lines)
