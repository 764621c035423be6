"""A roofline per brick: how much arithmetic and memory traffic each brick's ops carry, the rates
it achieved, and their fraction of what the backing device can do.

Work, per op signature (:mod:`.shapes`). The op is run once on ``meta`` tensors of the recorded
sizes and dtypes (with the recorded integer arguments, and the schema's defaults where a value was
not recorded) under PyTorch's ``FlopCounterMode``, whose formulas are those of
``torch.profiler``'s ``with_flops=True`` (``torch.utils.flop_counter``): matmuls, convolutions
and attention count their multiply-adds as two FLOPs, and a composite op (``aten::linear``,
``aten::conv2d``) counts the ops it decomposes into. Bytes: the op's tensor inputs read once and
its outputs written once (outputs that are views of an input move nothing), the least traffic
the op can have. An op whose signature cannot be rebuilt (a data-dependent output size, a value
of a kind not recorded and without a default) has no estimate: the bricks that hold it say how
many calls went unestimated, never a silent zero.

Every op brick gets its own calls' work. A range brick sums the work of its *outermost* ops, the
ops with no op between them and the range: a nested op is part of its parent op's work
(``aten::linear`` holds its ``aten::addmm``), so nothing counts twice. The rates are work over
the brick's measured time.

Peaks, per backing device and dtype (:mod:`.roofline_peaks`): a matmul's FLOP/s and a copy's
bytes/s, measured on brick itself, cached per machine, measured again while provisional (taken on
a busy machine); :func:`measure_peaks`, ``peaks(refresh=True)`` or ``BRICK_ROOFLINE_REFRESH=1``
measure them again now. A brick's fractions are of the peaks of its dominant dtype;
it is *compute*-bound when its arithmetic intensity (FLOPs per byte) reaches the device's ridge
point (peak FLOP/s over peak bytes/s), else *memory*-bound.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from ..terminal import printable
from ._table_text import Column
from .roofline_peaks import FLOAT_DTYPES, entry_problem, measure_peaks, peaks, provisional

__all__ = ["BrickRoofline", "OpWork", "compute", "measure_peaks", "op_work", "peaks",
           "roofline_rows"]

_TORCH_DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32,
    "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
    "complex64": torch.complex64, "complex128": torch.complex128,
}


@dataclass(frozen=True)
class OpWork:
    """One call's work: FLOPs and the bytes it reads and writes at least."""

    flops: int
    bytes: int


class _Unbuildable(Exception):
    """A signature that cannot be rebuilt as a call on meta tensors."""


def _meta_tensor(shape, dtype: str):
    if dtype not in _TORCH_DTYPES or not all(isinstance(s, int) for s in shape):
        raise _Unbuildable(f"a tensor of dtype {dtype} and sizes {shape}")
    return torch.empty(shape, dtype=_TORCH_DTYPES[dtype], device="meta")


def _argument(argument, shape, dtype: str, value):
    """The Python value of one recorded input for schema argument ``argument``. A tensor has no
    value; a bool argument has one (both are "bool")."""
    if dtype in _TORCH_DTYPES and value is None:
        return _meta_tensor(shape, dtype)
    if dtype == "Undefined" or dtype == "None":
        return None
    if dtype == "TensorList":
        # an optional tensor list's none entries are recorded as [] (no sizes): as none
        element = str(argument.type)
        return [None if s == [] and "Optional" in element else torch.empty(s, device="meta")
                for s in shape]
    if value is not None:
        return value
    if dtype == "float":
        return 1.0  # a scalar factor: no formula or size depends on its value
    if argument.has_default_value():
        return argument.default_value
    if dtype == "Device":
        return torch.device("meta")
    raise _Unbuildable(f"argument {argument.name!r} ({dtype}) was not recorded")


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


@functools.lru_cache(maxsize=None)
def _stands_for():
    """Brick's kernels for the ops PyTorch routes devices other than CPU and CUDA to (no meta
    kernel of their own): their work is that of the op they stand for, with the arguments
    adapted."""
    aten = torch.ops.aten
    return {
        "aten::convolution_overrideable": (aten.convolution.default, lambda a: a),
        # convolution_backward takes the bias's sizes (None: no bias gradient's shape needed)
        "aten::convolution_backward_overrideable": (
            aten.convolution_backward.default, lambda a: a[:3] + [None] + a[3:]),
        # CUDA-backed SDPA: CUDA's flash kernel, which takes no mask
        "aten::_scaled_dot_product_fused_attention_overrideable": (
            aten._scaled_dot_product_flash_attention.default, lambda a: a[:3] + a[4:]),
    }


def op_work(name: str, overload: str, shapes: list, dtypes: list, values: list) -> Optional[OpWork]:
    """One call's work, from its recorded signature; None when it cannot be rebuilt."""
    namespace, _, op_name = name.partition("::")
    packet = getattr(getattr(torch.ops, namespace, None), op_name, None) if op_name else None
    op = getattr(packet, overload or "default", None) if packet is not None else None
    if op is None:
        return None
    schema = op._schema
    if len(shapes) != len(schema.arguments) or len(dtypes) != len(shapes):
        return None
    from torch.utils.flop_counter import FlopCounterMode

    args, kwargs = [], {}
    try:
        for argument, shape, dtype, value in zip(schema.arguments, shapes, dtypes, values):
            built = _argument(argument, shape, dtype, value)
            if argument.kwarg_only:
                kwargs[argument.name] = built
            else:
                args.append(built)
        run = op
        if name in _stands_for() and not kwargs:
            run, adapt = _stands_for()[name]
            args = adapt(args)
        with FlopCounterMode(display=False) as counter:
            out = run(*args, **kwargs)
    except Exception:  # noqa: BLE001 - _Unbuildable, or an op the meta device cannot run
        return None
    inputs = list(_tensors(args)) + list(_tensors(list(kwargs.values())))
    # An output that aliases an input (a view; aten::to to the dtype it has) moves nothing; one
    # that does not was written, even where the schema allows an alias (aten::to converting).
    # An in-place op's output is its input, written.
    results = list(_tensors(out))
    fresh = [r for r in results if not any(torch._C._is_alias_of(r, i) for i in inputs)]
    in_place = any(r.alias_info is not None and r.alias_info.is_write for r in schema.returns)
    written = sum(r.nbytes for r in (results if in_place else fresh))
    read = 0 if results and not fresh and not in_place else sum(t.nbytes for t in inputs)
    return OpWork(flops=int(counter.get_total_flops()), bytes=read + written)


# ---- per brick ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class BrickRoofline:
    """A brick's work and rates. ``flops_per_s`` and ``bytes_per_s`` are achieved over its
    measured time; the fractions are of the backing device's peaks for ``dtype``."""

    path: str
    flops: int
    bytes: int
    total_ns: int
    unestimated_calls: int  # calls of its ops whose work could not be estimated
    dtype: str
    flops_per_s: float
    bytes_per_s: float
    flops_fraction: float
    bytes_fraction: float
    intensity: Optional[float]  # FLOPs per byte; None without bytes
    bound: str  # "compute", "memory", or "-" (no work: views, metadata ops, or none estimated)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _numel(shape) -> int:
    count = 1
    for size in shape:
        count *= size if isinstance(size, int) else 1
    return count


def _dominant_dtype(row) -> str:
    """The floating dtype of an op call's largest tensor input; 0-dim tensors (the Python numbers
    PyTorch wraps as float64 tensors) do not decide. float32 when none does."""
    tensors = [(_numel(shape), dtype) for shape, dtype, value in
               zip(row.shapes, row.dtypes, row.values)
               if dtype in FLOAT_DTYPES and value is None and shape]
    return max(tensors)[1] if tensors else "float32"


def compute(report_paths, shape_rows, measure=peaks) -> dict:
    """The roofline of every brick path with estimated work, as ``metadata["roofline"]`` holds
    it: ``{"peaks": {dtype: entry}, "bricks": [BrickRoofline dicts]}``."""
    kinds = {p.path: p.kind for p in report_paths}
    totals = {p.path: p.total_ns for p in report_paths}
    work: Dict[tuple, Optional[OpWork]] = {}
    flops: Dict[str, int] = {}
    nbytes: Dict[str, int] = {}
    unestimated: Dict[str, int] = {}
    dtype_flops: Dict[str, Dict[str, int]] = {}
    for row in shape_rows:
        if row.kind != "op":  # calls that ran on the CPU: no brick work, in no brick's roofline
            continue
        ancestors = row.path.split("/")[:-1]
        prefixes = ["/".join(ancestors[:i + 1]) for i in range(len(ancestors))]
        # The op's own brick, and the ranges it is the outermost op of: an enclosing op's work
        # already holds it, and so does every brick above that op.
        nearest_op = max((i for i, p in enumerate(prefixes) if kinds.get(p) == "op"), default=-1)
        key = (row.name, row.overload, json.dumps(row.shapes), json.dumps(row.dtypes),
               json.dumps(row.values))
        if key not in work:
            work[key] = op_work(row.name, row.overload, row.shapes, row.dtypes, row.values)
        w = work[key]
        dtype = _dominant_dtype(row)
        for brick in prefixes[nearest_op + 1:] + [row.path]:
            if w is None:
                unestimated[brick] = unestimated.get(brick, 0) + row.calls
                continue
            flops[brick] = flops.get(brick, 0) + w.flops * row.calls
            nbytes[brick] = nbytes.get(brick, 0) + w.bytes * row.calls
            per_dtype = dtype_flops.setdefault(brick, {})
            per_dtype[dtype] = per_dtype.get(dtype, 0) + max(w.flops, 1) * row.calls
    peak_of: Dict[str, dict] = {}
    bricks = []
    for path in sorted(set(flops) | set(unestimated), key=lambda p: -totals.get(p, 0)):
        if path not in totals:
            continue
        total_ns = totals[path]
        dtype = max(dtype_flops.get(path, {"float32": 1}).items(), key=lambda kv: kv[1])[0]
        f, b = flops.get(path, 0), nbytes.get(path, 0)
        if f == 0 and b == 0:
            dtype = next(iter(peak_of), "float32")  # no work: no peak of its own to measure
        if dtype not in peak_of:
            peak_of[dtype] = measure(dtype)
        bricks.append(_brick_roofline(path, f, b, total_ns, unestimated.get(path, 0), dtype,
                                      peak_of[dtype]).to_dict())
    return {"peaks": peak_of, "bricks": bricks}


def _brick_roofline(path: str, flops: int, nbytes: int, total_ns: int, unestimated_calls: int,
                    dtype: str, peak: Optional[dict]) -> BrickRoofline:
    """A brick's rates over its measured time, against ``peak`` (None: the fractions are 0 and
    the bound unknown)."""
    seconds = total_ns / 1e9 if total_ns else float("inf")
    intensity = flops / nbytes if nbytes else None
    if (flops == 0 and nbytes == 0) or not peak:
        bound = "-"  # no work (a view, a metadata op, nothing estimated), or no peak to compare
    else:
        ridge = peak["flops_per_s"] / peak["bytes_per_s"]
        bound = "compute" if intensity is None or intensity >= ridge else "memory"
    return BrickRoofline(
        path=path, flops=flops, bytes=nbytes, total_ns=total_ns,
        unestimated_calls=unestimated_calls, dtype=dtype,
        flops_per_s=flops / seconds, bytes_per_s=nbytes / seconds,
        flops_fraction=flops / seconds / peak["flops_per_s"] if peak else 0.0,
        bytes_fraction=nbytes / seconds / peak["bytes_per_s"] if peak else 0.0,
        intensity=intensity, bound=bound)


def roofline_rows(metadata: dict, by: str = "path") -> List[BrickRoofline]:
    """The rows a report's ``metadata["roofline"]`` holds, per call path (``by="path"``) or per
    brick name (``by="name"``: the paths of a name summed, the path being the name); empty
    without one."""
    if by not in ("path", "name"):
        raise ValueError(f"brick report: roofline(by=...): by must be 'path' or 'name', got {by!r}")
    data = metadata.get("roofline")
    if data is None:
        return []
    if not isinstance(data, dict) or not isinstance(data.get("bricks"), list):
        raise ValueError("brick report: metadata.roofline must be an object with a 'bricks' list")
    rows = []
    for i, entry in enumerate(data["bricks"]):
        if not isinstance(entry, dict) or set(entry) != set(BrickRoofline.__dataclass_fields__):
            raise ValueError(f"brick report: metadata.roofline.bricks[{i}] must be an object with "
                             f"the fields {', '.join(BrickRoofline.__dataclass_fields__)}")
        rows.append(BrickRoofline(**entry))
    peaks_of = data.get("peaks") or {}
    if not isinstance(peaks_of, dict):
        raise ValueError("brick report: metadata.roofline.peaks must be an object of entries "
                         "by dtype")
    for dtype, entry in peaks_of.items():
        problem = entry_problem(entry)
        if problem is not None:
            raise ValueError(f"brick report: metadata.roofline.peaks[{dtype!r}] {problem}")
    if by == "name":
        rows = _by_name(rows, peaks_of)
    return rows


def _by_name(rows: List[BrickRoofline], peaks_of: dict) -> List[BrickRoofline]:
    groups: Dict[str, List[BrickRoofline]] = {}
    for r in rows:
        groups.setdefault(r.path.rpartition("/")[2], []).append(r)
    merged = []
    for name, group in groups.items():
        # a name nested in itself would count its inner calls twice: only the outermost paths
        outer = [r for r in group if not any(
            o is not r and r.path.startswith(o.path + "/") for o in group)]
        dtype = max(outer, key=lambda r: r.flops).dtype
        merged.append(_brick_roofline(
            name, sum(r.flops for r in outer), sum(r.bytes for r in outer),
            sum(r.total_ns for r in outer), sum(r.unestimated_calls for r in outer), dtype,
            peaks_of.get(dtype)))
    merged.sort(key=lambda r: -r.total_ns)
    return merged


# ---- the table's columns -----------------------------------------------------------------------

def table_columns() -> List[Column]:
    """The roofline's columns of ``Report.table(roofline=True)``; the bytes' go first when a row
    must fit a width (after the timing columns but the total)."""
    return [Column("GFLOP/s", 10), Column("GB/s", 9, drop=7), Column("%pk F", 7),
            Column("%pk B", 7, drop=8), Column("bound", 9)]


def table_cells(row: Optional[BrickRoofline]) -> List[str]:
    if row is None:
        return ["-"] * 5
    unestimated = "*" if row.unestimated_calls else ""
    return [f"{row.flops_per_s / 1e9:.2f}", f"{row.bytes_per_s / 1e9:.2f}",
            f"{100 * row.flops_fraction:.1f}", f"{100 * row.bytes_fraction:.1f}",
            row.bound + unestimated]


def table_notes(data: dict) -> List[str]:
    lines = []
    for dtype, peak in sorted((data.get("peaks") or {}).items()):
        lines.append(f"roofline peaks ({dtype}): {peak['flops_per_s'] / 1e9:.1f} GFLOP/s, "
                     f"{peak['bytes_per_s'] / 1e9:.1f} GB/s (memory "
                     f"{peak['memory_bytes_per_s'] / 1e9:.1f} GB/s); {printable(peak['how'])}, "
                     f"{printable(peak['measured_at'])}")
        if provisional(peak):
            denied = peak.get("denied_share")
            waited = f" {denied:.0%} of the time" if isinstance(denied, (int, float)) else ""
            lines.append(
                f"warning: the {dtype} peaks are provisional: measured while the thread waited "
                f"for a CPU{waited} (other processes ran), so they may be low and %pk over 100 "
                f"may mean that; the next profile with roofline=True in a new process measures "
                f"them again, or now: torch_brickdev.profiler.roofline.peaks("
                f"{dtype!r}, refresh=True) or BRICK_ROOFLINE_REFRESH=1")
    lines.append("roofline: FLOPs as torch.utils.flop_counter counts them; bytes: inputs read and "
                 "outputs written once; * some calls' work could not be estimated")
    return lines
