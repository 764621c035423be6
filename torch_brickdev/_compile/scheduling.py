"""Inductor's C++ kernels generated for brick (:class:`BrickScheduling`): the CPU's code, run on
brick memory, with no kernel spanning two ``record_function`` ranges."""

import contextlib

import torch
from torch._inductor import config as inductor_config
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.virtualized import V

from . import decline_on_cuda_backing
from .ranges import range_events, segment_of

_CPU = torch.device("cpu")


@contextlib.contextmanager
def as_cpu_kernels():
    # The CPU as the current device (see BrickScheduling), and every kernel a named
    # RecordFunction ("graph_<id>_cpp_fused_..."), so profilers of brick see compiled
    # kernels as ops with their own time, not one opaque graph call.
    with V.graph.set_current_device(_CPU), inductor_config.patch(
            {"cpp.enable_kernel_profile": True}):
        yield


class BrickScheduling(CppScheduling):
    """Inductor's C++/OpenMP kernels, run on brick memory (host memory on the host
    runtime). On CUDA backing a graph that needs them is declined (see the package).

    Inductor picks code-generation behaviour by the current device's type (its
    ``get_current_backend()`` says "cpp" only for the CPU): kernels are generated with the
    CPU as the current device, as they are for the CPU's own graphs."""

    def __init__(self, scheduler):
        # scheduler is None when Inductor only asks for the backend's features.
        if scheduler is not None:
            decline_on_cuda_backing()
        super().__init__(scheduler)

    def codegen_node(self, *args, **kwargs):
        with as_cpu_kernels():
            return super().codegen_node(*args, **kwargs)

    # No kernel spans two record_function ranges (see ranges.mark_range_segments); a graph
    # without ranges (most) is not searched for them.
    def can_fuse_vertical(self, node1, node2):
        return (not range_events() or segment_of(node1) == segment_of(node2)) \
            and super().can_fuse_vertical(node1, node2)

    def can_fuse_horizontal(self, node1, node2):
        return (not range_events() or segment_of(node1) == segment_of(node2)) \
            and super().can_fuse_horizontal(node1, node2)

    def codegen_template(self, *args, **kwargs):
        with as_cpu_kernels():
            return super().codegen_template(*args, **kwargs)

    def codegen_sync(self, *args, **kwargs):
        with as_cpu_kernels():
            return super().codegen_sync(*args, **kwargs)

    def flush(self, *args, **kwargs):
        with as_cpu_kernels():
            return super().flush(*args, **kwargs)
