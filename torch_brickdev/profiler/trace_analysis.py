"""HolisticTraceAnalysis (HTA) over brick's per-rank torch.profiler traces.

HTA finds communication in a trace by the names of NCCL's kernels only (``^nccl.*Kernel``, in
``hta.utils.utils``). Brick's collectives are device activities named by their engine,
``brick::gloo:all_reduce`` on the host runtime (gloo runs them) and ``brick::nccl:all_reduce`` on
CUDA backing, on each device's ``collectives`` track, from the enqueue until the engine completed
them. :func:`trace_analysis` makes HTA count those as communication too, then loads the traces,
so that HTA's multi-rank analyses (communication/computation overlap, temporal and idle-time
breakdowns, critical path) read brick's collectives as they read NCCL's kernels.

HTA's default straggler metric looks for kernels named ``ncclKernel*`` only (a name NCCL itself
stopped using: its kernels are ``ncclDevKernel_*`` now). :func:`late_collective_stragglers`
computes that metric over brick's collectives and both generations of NCCL names, with the ranks'
collectives matched by order; pass it to
``get_potential_stragglers(straggler_identification_impl=...)``.
"""

from __future__ import annotations

import os
import re

from ..argcheck import check_int, check_path, describe

__all__ = ["BRICK_COLLECTIVE_PATTERN", "late_collective_stragglers", "recognise_brick_collectives",
           "trace_analysis"]

# The device activities of brick's collectives (csrc/distributed/process_group.cpp names them).
BRICK_COLLECTIVE_PATTERN = r"^brick::(gloo|nccl|c10d):"
_COLLECTIVE_NAMES = re.compile(f"{BRICK_COLLECTIVE_PATTERN}|^nccl(Dev)?Kernel")


def recognise_brick_collectives() -> None:
    """Extends HTA's pattern for communication kernels with brick's collectives (idempotent;
    NCCL's kernels stay recognised)."""
    from hta.utils import utils

    current = utils.NCCL_KERNEL_RE.pattern
    if BRICK_COLLECTIVE_PATTERN not in current:
        utils.NCCL_KERNEL_RE = re.compile(f"(?:{current})|(?:{BRICK_COLLECTIVE_PATTERN})")


def trace_analysis(trace_dir: str, **kwargs):
    """``hta.trace_analysis.TraceAnalysis(trace_dir=trace_dir, **kwargs)`` with brick's
    collectives recognised as communication. ``trace_dir`` holds one torch.profiler trace per rank
    (e.g. from ``torch.profiler.tensorboard_trace_handler``), each with its ``distributedInfo``.
    Raises ImportError naming the package when HTA is not installed."""
    trace_dir = check_path(trace_dir, "trace_dir", "brick profiler: trace_analysis()")
    if not os.path.isdir(trace_dir):
        raise FileNotFoundError(f"brick profiler: trace_analysis(): no such folder: {trace_dir}")
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError as error:
        raise ImportError("brick profiler: trace_analysis() needs HolisticTraceAnalysis "
                          "(pip install HolisticTraceAnalysis)") from error
    recognise_brick_collectives()
    return TraceAnalysis(trace_dir=trace_dir, **kwargs)


def late_collective_stragglers(df, symbol_table, n_stragglers: int = 2, visualize: bool = False,
                               min_normalized_duration: float = 0.01):
    """A straggler metric for HTA's ``get_potential_stragglers``: the normalized start of the last
    significant collective of each iteration (a rank that starts it late made the others wait),
    computed over brick's collectives and NCCL's kernels. Returns, per rank, how many iterations
    found it among the ``n_stragglers`` latest.

    HTA's own metric keeps each rank's rows of at least ``min_normalized_duration`` of an
    iteration, then compares every rank's last such row. A collective is short on the rank that
    arrives last and long on those that wait for it, so on the straggler that filter can drop the
    very collective it was late to, and the ranks are then compared at different collectives.
    Here the ranks' collectives are matched first, by their order within the iteration (every
    rank of a group issues them in one order), and a collective is significant when it lasts that
    long on any rank; the ranks are compared at the last one that every rank has."""
    where = "brick profiler: late_collective_stragglers()"
    columns = {"rank", "iteration", "stream", "name", "ts", "dur"}
    if not columns <= set(getattr(df, "columns", ())):
        raise TypeError(f"{where}: df must be HTA's trace DataFrame (columns "
                        f"{', '.join(sorted(columns))}), got {describe(df)}")
    if not callable(getattr(symbol_table, "get_sym_id_map", None)):
        raise TypeError(f"{where}: symbol_table must be HTA's TraceSymbolTable, got "
                        f"{describe(symbol_table)}")
    n_stragglers = check_int(n_stragglers, "n_stragglers", where, low=1)
    if isinstance(min_normalized_duration, bool) or \
            not isinstance(min_normalized_duration, (int, float)) or \
            not 0 <= min_normalized_duration < 1:
        raise ValueError(f"{where}: min_normalized_duration must be a fraction of an iteration in "
                         f"[0, 1), got {min_normalized_duration!r}")
    from hta.analyzers.straggler import _get_top_k_stragglers_with_metric

    ids = [sym_id for name, sym_id in symbol_table.get_sym_id_map().items()
           if _COLLECTIVE_NAMES.match(name)]
    iterations = [i for i in df["iteration"].unique() if i > 0]
    if not iterations:
        raise ValueError(f"{where}: the traces have no profiler steps (ProfilerStep#N, from "
                         "torch.profiler's step())")
    t_min = df["ts"].min()
    mean_iteration = ((df["ts"] + df["dur"]).max() - t_min) / len(iterations)
    collectives = df.loc[df["stream"].gt(0) & df["iteration"].isin(iterations)
                         & df["name"].isin(ids)].sort_values(["rank", "ts"])
    collectives = collectives.assign(
        order=collectives.groupby(["rank", "iteration"]).cumcount())
    instance = ["iteration", "order", "name"]
    per_instance = collectives.groupby(instance).agg(ranks=("rank", "nunique"),
                                                     longest=("dur", "max"))
    n_ranks = collectives["rank"].nunique()
    significant = per_instance.loc[per_instance["ranks"].eq(n_ranks) & per_instance["longest"].ge(
        mean_iteration * min_normalized_duration)].reset_index()
    if significant.empty:
        raise ValueError(f"{where}: no collective of at least {min_normalized_duration:.0%} of an "
                         "iteration on every rank's trace")
    last = significant.sort_values("order").groupby("iteration").last().reset_index()[instance]
    candidates = collectives.merge(last, on=instance)
    candidates = candidates.assign(normalized_start_time=(candidates["ts"] - t_min) / mean_iteration)
    return _get_top_k_stragglers_with_metric(candidates, "normalized_start_time",
                                             n_stragglers=n_stragglers, visualize=visualize)
