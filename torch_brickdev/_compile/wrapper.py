"""The Python that Inductor writes around brick's kernels: the wrapper
(:class:`BrickWrapperCodegen`), which marks each call of a compiled graph and its
``record_function`` ranges for brick's profilers, the device operations it writes
(:class:`BrickDeviceOpOverrides`), and the C++ wrapper, refused (:class:`BrickCppWrapper`)."""

from torch._inductor import config as inductor_config
from torch._inductor.codegen.common import DeviceOpOverrides
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.virtualized import V

from .. import BACKEND_NAME
from .ranges import RANGE_SEGMENT, range_events


class _BrickWrapper:
    def make_allocation(self, name, device, *args, **kwargs):
        # For devices it does not know Inductor writes device='<type>', relying on a device
        # guard for the index; brick kernels need no guard, so the device is named fully.
        line = super().make_allocation(name, device, *args, **kwargs)
        if device.type == BACKEND_NAME and device.index is not None:
            line = line.replace(f"device='{device.type}'", f"device='{device}'")
        return line


class BrickSubgraphWrapperCodegen(_BrickWrapper, SubgraphPythonWrapperCodegen):
    pass


class BrickWrapperCodegen(_BrickWrapper, PythonWrapperCodegen):
    """Inductor's Python wrapper, calling its C++ kernels on brick tensors."""

    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, *args, **kwargs):
        if is_subgraph:
            return BrickSubgraphWrapperCodegen(subgraph_name, parent_wrapper, *args, **kwargs)
        return BrickWrapperCodegen()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._range_segment = 0  # the segment whose kernels were written last

    def write_header(self):
        super().write_header()
        self.header.writeline("import torch_brickdev._compile")
        self.header.writeline("from torch_brickdev._C._profiler import push_range as "
                              "_brick_push_range, pop_ranges as _brick_pop_ranges, "
                              "enter_compiled_code as _brick_enter_compiled, "
                              "exit_compiled_code as _brick_exit_compiled")
        self.header.writeline("torch_brickdev._compile.check_host_backing()")

    def _generate(self, is_inference):
        # Each call of the compiled graph is a named range ("graph_<id>_inductor_wrapper_
        # call") around its kernels, for brick's profilers.
        with inductor_config.patch({"profiler_mark_wrapper_call": True}):
            return super()._generate(is_inference)

    def generate_profiler_mark_wrapper_call(self, stack):
        # brick's range stack (one call in, one out) instead of record_function's handle
        # through the dispatcher (~4 us a call with no profiler on); the finally ends the
        # graph's range and any of its ranges a failing kernel left open.
        call = self.wrapper_call
        # Its kernels compute on brick memory outside brick's launch path: brick work for
        # the profilers (runtime::in_compiled_code), between enter and exit.
        call.writeline(f"_brick_graph_depth = _brick_push_range("
                       f"'graph_{V.graph.graph_id}_inductor_wrapper_call')")
        call.writeline("_brick_enter_compiled()")
        call.writeline("try:")

        def end_ranges():
            call.writeline("finally:")
            with call.indent():
                call.writeline("_brick_exit_compiled()")
                call.writeline("_brick_pop_ranges(_brick_graph_depth)")

        stack.callback(end_ranges)
        stack.enter_context(call.indent())

    def _range_boundaries(self, upto):
        # The range boundaries between the segment written last and `upto`, as lines.
        events = range_events()
        lines = []
        for index in range(self._range_segment, min(upto, len(events))):
            kind, name, opened_at = events[index]
            lines.append(f"_brick_range_{index} = _brick_push_range({name!r})"
                         if kind == "enter" else f"_brick_pop_ranges(_brick_range_{opened_at})")
        self._range_segment = max(self._range_segment, upto)
        return lines

    def enter_context(self, ctx):
        # Called by Inductor's scheduler before each node's code, with its latest origin.
        super().enter_context(ctx)
        segment = getattr(ctx, "meta", {}).get(RANGE_SEGMENT)
        if segment is None or segment <= self._range_segment:
            return  # same range, or work Inductor moved later: kept where it runs
        V.graph.scheduler.flush()  # the kernels grouped so far run before the boundary
        for line in self._range_boundaries(segment):
            self.writeline(line)

    def generate_return(self, output_refs):
        for line in self._range_boundaries(len(range_events())):
            self.wrapper_call.writeline(line)
        super().generate_return(output_refs)


class BrickCppWrapper(CppWrapperCpu):  # (Inductor also reads class attributes)
    """``cpp_wrapper=True`` is not supported on brick: refused with the reason."""

    @staticmethod
    def create(*args, **kwargs):
        raise RuntimeError(
            "torch_brickdev: Inductor's C++ wrapper (cpp_wrapper=True, AOTInductor) is not "
            "supported on brick; use the default Python wrapper")


class BrickDeviceOpOverrides(DeviceOpOverrides):
    """The lines of Python the wrapper writes for device operations."""

    def import_get_raw_stream_as(self, name):
        return f"def {name}(index): return torch.brick.current_stream(index).stream_id"

    def set_device(self, device_idx):
        return f"torch.brick.set_device({device_idx})"

    def synchronize(self):
        return "torch.brick.synchronize()"

    def device_guard(self, device_idx):
        return f"torch.brick.device({device_idx})"
