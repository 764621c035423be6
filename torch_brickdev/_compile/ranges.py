"""``record_function`` ranges through Inductor.

With torch._dynamo.config.capture_profiler_record_function on, dynamo and AOTAutograd keep a
compiled region's record_function ranges as graph nodes, and Inductor's post-grad passes then
remove them (so that they do not block fusion). For brick graphs the ranges are read first:
each node is given the segment of the graph it sits in (the stretch between two range
boundaries, :func:`mark_range_segments`), brick's scheduling fuses no two nodes of different
segments, and brick's wrapper opens and closes every range between the kernels of the segments
around it (``BrickWrapperCodegen.enter_context``). So a compiled region keeps one brick per
range, each range entered and exited once per call in program order, with its own kernels.
"""

import functools
from typing import Optional

import torch

from .. import BACKEND_NAME

RANGE_SEGMENT = "brick_range_segment"  # node.meta key: the node's segment
_RANGE_EVENTS = "_brick_range_events"   # fx.Graph attribute: the boundaries, in order


def mark_range_segments(graph) -> bool:
    """Numbers the stretches of ``graph`` between range boundaries (a range's enter or exit)
    and gives each other node its stretch in ``node.meta``. Stores the boundaries on the graph:
    ``("enter", name, None)`` or ``("exit", None, k)`` closing the enter at boundary k; the
    boundary i lies between segments i and i + 1. False (nothing marked) for a graph with no
    ranges or no brick tensors."""
    profiler = torch.ops.profiler
    enter_ops = (profiler._record_function_enter.default,
                 profiler._record_function_enter_new.default)
    exit_ops = (profiler._record_function_exit.default,
                profiler._record_function_exit._RecordFunction)

    def on_brick(node) -> bool:
        value = node.meta.get("val")
        values = value if isinstance(value, (list, tuple)) else (value,)
        return any(isinstance(v, torch.Tensor) and v.device.type == BACKEND_NAME for v in values)

    nodes = list(graph.nodes)
    if not any(n.op == "call_function" and n.target in enter_ops for n in nodes) \
            or not any(on_brick(n) for n in nodes):
        return False
    # Inductor's pattern matcher and reorder_for_locality keep to a "mutation region" (the
    # stretch between two mutating ops): a range boundary starts one too, so that no pattern
    # (attention into one SDPA, say) joins the work of two ranges and no node moves across.
    from torch._inductor.pattern_matcher import is_mutation_op

    region = 0
    for node in nodes:
        if is_mutation_op(node) or (node.op == "call_function"
                                    and node.target in enter_ops + exit_ops):
            region += 1
        node.meta["mutation_region_id"] = region
    events, open_at = [], {}  # open_at: enter node -> its boundary index
    for node in nodes:
        if node.op == "call_function" and node.target in enter_ops:
            open_at[node] = len(events)
            events.append(("enter", str(node.args[0]), None))
        elif node.op == "call_function" and node.target in exit_ops:
            handle = node.args[0]
            if handle not in open_at:  # an exit of a range entered outside: nothing to close
                continue
            events.append(("exit", None, open_at.pop(handle)))
        else:
            node.meta[RANGE_SEGMENT] = len(events)
    for node in nodes:
        # A value another range reads is computed in its own range: Inductor would otherwise
        # inline a pointwise producer into its consumer's kernel, in the consumer's range.
        segment = node.meta.get(RANGE_SEGMENT)
        if node.op == "call_function" and segment is not None \
                and isinstance(node.meta.get("val"), torch.Tensor) \
                and not getattr(node.target, "is_view", False) \
                and any(user.meta.get(RANGE_SEGMENT, segment) != segment for user in node.users):
            node.meta["inductor_realize_to_strides"] = True
    setattr(graph, _RANGE_EVENTS, events)
    return True


def range_events() -> tuple:
    """The range boundaries of the graph Inductor is compiling (empty: it has no ranges)."""
    from torch._inductor.virtualized import V

    return getattr(V.graph.module.graph, _RANGE_EVENTS, ())


def segment_of(scheduler_node) -> Optional[int]:
    """The segment whose kernels a scheduler node belongs to: that of its latest origin, as
    Inductor's own ``Scheduler.enter_context`` picks the origin to report; None when unmarked."""
    segments = [origin.meta[RANGE_SEGMENT]
                for node in scheduler_node.get_nodes() if node.node is not None
                for origin in node.node.get_origins() if RANGE_SEGMENT in origin.meta]
    return max(segments) if segments else None


def read_ranges_first() -> bool:
    """Makes Inductor's joint-graph passes (before pattern replacements) and post-grad passes
    (before reorder_for_locality moves nodes, and before Inductor removes the range ops) read
    the ranges first (idempotent). True when both are hooked."""
    from torch._inductor import compile_fx

    hooked = []
    for name in ("joint_graph_passes", "post_grad_passes"):
        passes = getattr(compile_fx, name, None)
        if passes is None:
            continue
        if not getattr(passes, "_brick", False):
            def mark_ranges_first(gm, *args, _passes=passes, **kwargs):
                mark_range_segments(gm.graph)
                return _passes(gm, *args, **kwargs)

            functools.update_wrapper(mark_ranges_first, passes)
            mark_ranges_first._brick = True
            setattr(compile_fx, name, mark_ranges_first)
        hooked.append(name)
    return len(hooked) == 2
