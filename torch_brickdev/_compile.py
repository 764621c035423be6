"""``torch.compile`` on brick: brick as an Inductor device and a dynamo device interface.

On the host runtime brick memory is host memory, so Inductor's CPU code generation runs on it
as it is: the C++ kernels of Inductor's ``CppScheduling`` read and write brick tensors through
their data pointers, buffers are allocated on brick (``empty_strided(..., device='brick:N')``),
and what Inductor generates no kernel for (``extern_kernels.mm``, fallback ops) runs as brick
ops. Nothing is copied to or from the CPU.

**Lazy registration.** ``import torch_brickdev`` imports nothing of torch._dynamo or
torch._inductor (about a second). The first time Inductor sets up its backends
(``init_backend_registration()``, at the first compile), it asks the PrivateUse1 device module
for ``Scheduling``; ``install()`` gives ``torch.brick`` a module ``__getattr__`` that answers by
registering everything here itself — the backend with its custom pass, the device-op overrides
and the dynamo device interface — and then reports the attribute missing, which Inductor's hook
takes as "nothing to register" (it would otherwise register the backend again without the
pass). When Inductor is already imported at install time, everything is registered at once.
Dynamo's device interface for brick is registered on its own as soon as
``torch._dynamo.device_interface`` is imported (a one-shot post-import hook; at once when it
already is), so ``get_interface_for_device("brick")`` answers before any compile.

**Convolution layouts.** FakeTensor predicts a convolution's output layout from the backend
PyTorch would pick; for brick inputs that is ``Overrideable``, taken as contiguous, while brick
returns its backing device's layout (channels_last when the input or the weight is). Brick's
inputs are predicted as the backing device's tensors of the same sizes and strides
(``_predict_convolutions_as_the_backing_device``), so graphs whose weights Inductor made
channels_last pass their stride checks.

**Where Inductor tells the CPU apart by device type**, brick's code is the CPU's: kernels are
generated with the CPU as Inductor's current device (so its ``get_current_backend()`` is "cpp",
not the "triton" it assumes for other devices), and Inductor's two ``is_cpu()`` tests — which
mean "code from the C++ backend": the scheduler skips loop transformations that assume Triton's
loop groups, and buffers are realized by the CPU's heuristics — are extended to brick (the only
changes to Inductor here). Lowering still sees brick as a device other than the CPU: where it
lowers differently for the CPU, brick takes the generic way (e.g. division by a constant becomes
multiplication by its reciprocal), which can differ from the CPU in the last bit.

**Ranges in compiled code.** With ``torch._dynamo.config.capture_profiler_record_function``
on, dynamo keeps a region's ``record_function`` ranges as graph nodes; Inductor would fuse across
them and then remove them. For graphs with brick tensors brick keeps them as bricks: it reads
them at the start of the joint-graph and post-grad passes (``_mark_range_segments``), where a
range boundary starts a mutation region (no pattern joins, no node moves across two ranges) and
a value read by another range is realized in its own; its scheduling fuses no two ranges' nodes;
its wrapper opens and closes each range between the kernels (``BrickWrapperCodegen``).

**CUDA backing.** There brick memory is GPU memory, which the host kernels must never touch,
and Inductor's GPU code on brick has not been verified on a GPU yet. The first graph with brick
tensors warns once, and every such graph is declined with dynamo's ``SkipFrame`` (Inductor's own
way to decline a graph, as for bfloat16 on GPUs without it), by the backend's custom pass before
lowering (for graphs with brick inputs or outputs) or else when the C++ backend would be created
for brick: the frame runs eagerly on brick (with ``fullgraph=True`` dynamo then reports that it
compiled no frame, with this reason). Compiled code is kept apart by the runtime behind brick:
the custom pass puts it in the cache key, and the generated module refuses to run on CUDA
backing.
"""

import contextlib
import functools
import hashlib
import inspect
import sys
import warnings
from typing import Optional

import torch

from . import _C
from ._import_hooks import after_import

BACKEND = "brick"

# What Inductor's init_backend_registration() looks up on the PrivateUse1 device module.
_CODEGEN_NAMES = ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen")

_registered = False
_unavailable: Optional[str] = None  # why this torch cannot compile for brick, once known
_warned_cuda = False
_ranges_hooked = False  # Inductor's post-grad passes read brick ranges first


def install(device_module) -> None:
    """Hooks brick into Inductor's backend set-up (cheap: imports nothing). Called once, by
    ``torch_brickdev`` after it registers ``torch.brick``."""

    previous = getattr(device_module, "__getattr__", None)

    def __getattr__(name: str):  # PEP 562: reached only for names the module lacks
        if name in _CODEGEN_NAMES:
            register()
        elif previous is not None:
            return previous(name)
        raise AttributeError(f"module {device_module.__name__!r} has no attribute {name!r}")

    device_module.__getattr__ = __getattr__
    _predict_convolutions_as_the_backing_device()
    if "torch._inductor.codegen.common" in sys.modules:
        # Inductor may have set up its backends before brick was loaded (it does so once).
        register()
    elif "torch._dynamo.device_interface" in sys.modules:
        register_device_interface()
    else:  # dynamo's device interfaces answer for brick as soon as they exist
        after_import("torch._dynamo.device_interface", register_device_interface)


def _predict_convolutions_as_the_backing_device() -> None:
    """FakeTensor (dynamo, Inductor, export) predicts a convolution's output layout from the
    convolution backend PyTorch would pick for its inputs: for brick's, ``Overrideable``, whose
    layout it takes to be contiguous. Brick runs its backing device's convolution, which returns
    channels_last when the input *or the weight* is (the CPU's mkldnn and slow kernels, cuDNN on
    CUDA), so a compiled graph whose weights Inductor made channels_last failed its stride
    checks ("expected ... stride 1==16"). For brick inputs the prediction is made as for the
    backing device's tensors of the same sizes and strides; every other input is left to
    PyTorch's rule. (torch._subclasses.fake_impls is imported with torch: nothing is imported.)"""
    from torch._subclasses import fake_impls
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils import _pytree as pytree

    rules = getattr(fake_impls, "op_implementations_dict", None)
    if rules is None:  # a PyTorch that keeps its fake rules elsewhere: left as it is
        return
    aten = torch.ops.aten
    for op in (aten.convolution.default, aten._convolution.default,
               aten._convolution.deprecated, aten.convolution_backward.default):
        pytorch_rule = rules.get(op)
        if pytorch_rule is None or getattr(pytorch_rule, "_brick_backing_rule", False):
            continue

        def backing_rule(fake_mode, func, *args, _pytorch_rule=pytorch_rule, **kwargs):
            leaves = pytree.tree_leaves((args, kwargs))
            brick = next((t.fake_device for t in leaves
                          if isinstance(t, FakeTensor) and t.fake_device.type == BACKEND), None)
            if brick is None:
                return _pytorch_rule(fake_mode, func, *args, **kwargs)
            backing_type = _C._backing_device_type()
            backing = torch.device(backing_type, brick.index) if backing_type == "cuda" else \
                torch.device("cpu")

            def on_backing(t):
                if not (isinstance(t, FakeTensor) and t.fake_device.type == BACKEND):
                    return t
                with fake_mode:
                    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=backing)

            def on_brick(t):
                if isinstance(t, FakeTensor) and t.fake_device == backing:
                    t.fake_device = brick
                return t

            args, kwargs = pytree.tree_map(on_backing, (args, kwargs))
            return pytree.tree_map(on_brick, _pytorch_rule(fake_mode, func, *args, **kwargs))

        backing_rule._brick_backing_rule = True
        rules[op] = backing_rule


# --- record_function ranges through Inductor ---------------------------------------------------
# With torch._dynamo.config.capture_profiler_record_function on, dynamo and AOTAutograd keep a
# compiled region's record_function ranges as graph nodes, and Inductor's post-grad passes then
# remove them (so that they do not block fusion). For brick graphs the ranges are read first:
# each node is given the segment of the graph it sits in (the stretch between two range
# boundaries, :func:`_mark_range_segments`), brick's scheduling fuses no two nodes of different
# segments, and brick's wrapper opens and closes every range between the kernels of the segments
# around it (``BrickWrapperCodegen.enter_context``). So a compiled region keeps one brick per
# range, each range entered and exited once per call in program order, with its own kernels.
_RANGE_SEGMENT = "brick_range_segment"  # node.meta key: the node's segment
_RANGE_EVENTS = "_brick_range_events"   # fx.Graph attribute: the boundaries, in order


def _mark_range_segments(graph) -> bool:
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
        return any(isinstance(v, torch.Tensor) and v.device.type == BACKEND for v in values)

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
            node.meta[_RANGE_SEGMENT] = len(events)
    for node in nodes:
        # A value another range reads is computed in its own range: Inductor would otherwise
        # inline a pointwise producer into its consumer's kernel, in the consumer's range.
        segment = node.meta.get(_RANGE_SEGMENT)
        if node.op == "call_function" and segment is not None \
                and isinstance(node.meta.get("val"), torch.Tensor) \
                and not getattr(node.target, "is_view", False) \
                and any(user.meta.get(_RANGE_SEGMENT, segment) != segment for user in node.users):
            node.meta["inductor_realize_to_strides"] = True
    setattr(graph, _RANGE_EVENTS, events)
    return True


def _range_events() -> tuple:
    """The range boundaries of the graph Inductor is compiling (empty: it has no ranges)."""
    from torch._inductor.virtualized import V

    return getattr(V.graph.module.graph, _RANGE_EVENTS, ())


def _segment_of(scheduler_node) -> Optional[int]:
    """The segment whose kernels a scheduler node belongs to: that of its latest origin, as
    Inductor's own ``Scheduler.enter_context`` picks the origin to report; None when unmarked."""
    segments = [origin.meta[_RANGE_SEGMENT]
                for node in scheduler_node.get_nodes() if node.node is not None
                for origin in node.node.get_origins() if _RANGE_SEGMENT in origin.meta]
    return max(segments) if segments else None


def register_device_interface() -> None:
    """Registers brick's dynamo device interface (idempotent): ``get_interface_for_device("brick")``
    answers from the moment ``torch._dynamo.device_interface`` is imported (see
    :func:`install`)."""
    from torch._dynamo.device_interface import (
        DeviceInterface,
        device_interfaces,
        register_interface_for_device,
    )

    if BACKEND in device_interfaces:
        return

    brick = torch.brick

    class BrickInterface(DeviceInterface):
        """Dynamo's and Inductor's view of the brick devices, backed by ``torch.brick``."""

        device = brick.device
        Event = brick.Event
        Stream = brick.Stream

        class Worker:
            # Brick's queries work in any process (compile workers included).
            @staticmethod
            def set_device(device):
                brick.set_device(device)

            @staticmethod
            def current_device():
                return brick.current_device()

            @staticmethod
            def get_device_properties(device=None):
                return brick.get_device_properties(device)

        current_device = staticmethod(brick.current_device)
        set_device = staticmethod(brick.set_device)
        device_count = staticmethod(brick.device_count)
        is_available = staticmethod(brick.is_available)
        stream = staticmethod(brick.stream)
        current_stream = staticmethod(brick.current_stream)
        set_stream = staticmethod(brick.set_stream)
        synchronize = staticmethod(brick.synchronize)
        memory_allocated = staticmethod(brick.memory_allocated)
        get_compute_capability = staticmethod(brick.get_device_capability)
        is_bf16_supported = staticmethod(brick.is_bf16_supported)

        @staticmethod
        def exchange_device(device):
            previous = brick.current_device()
            if device != previous:
                brick.set_device(device)
            return previous

        @staticmethod
        def maybe_exchange_device(device):
            return -1 if device < 0 else BrickInterface.exchange_device(device)

        @staticmethod
        def _set_stream_by_id(stream_id, device_index, device_type):
            brick.set_stream(torch.Stream(stream_id=stream_id, device_index=device_index,
                                          device_type=device_type))

        @staticmethod
        def get_raw_stream(device_idx):
            return brick.current_stream(device_idx).stream_id

        @staticmethod
        def is_triton_capable(device=None):
            return False

    register_interface_for_device(BACKEND, BrickInterface)


def register() -> bool:
    """Registers brick with Inductor and dynamo (idempotent). False, with one warning, where
    this torch lacks what it needs."""
    global _registered, _unavailable
    if not _registered and _unavailable is None:
        try:
            _register()
            _registered = True
        except Exception as error:  # noqa: BLE001 - never break compiles that do not use brick
            _unavailable = f"{type(error).__name__}: {error}"
            warnings.warn(
                f"torch_brickdev: torch.compile's default (Inductor) backend cannot be set up "
                f"for brick on torch {torch.__version__} ({_unavailable}); compile brick code "
                f"with torch.compile(backend='aot_eager')", RuntimeWarning, stacklevel=3)
    return _registered


def keeps_ranges() -> bool:
    """Whether code Inductor compiles for brick keeps the record_function ranges dynamo
    captured (``torch._dynamo.config.capture_profiler_record_function``) as bricks: this torch
    can capture them and brick's backend is registered with its range pass."""
    import torch._dynamo  # noqa: F401 - its config is what is asked about

    return hasattr(torch._dynamo.config, "capture_profiler_record_function") and register() \
        and _ranges_hooked


def _backing() -> str:
    """The runtime behind brick devices for cache keys, without creating the runtime: a torch
    without CUDA can only have the host runtime."""
    if _C._runtime_created_in_pid() != -1:
        return _C._backing_device_type()
    return "cpu" if not torch.cuda._is_compiled() else "undetermined"


def _decline_on_cuda_backing() -> None:
    global _warned_cuda
    from torch._dynamo.exc import SkipFrame

    if not _warned_cuda:
        _warned_cuda = True
        warnings.warn(
            "torch_brickdev: torch.compile's default (Inductor) backend does not support brick "
            "devices backed by CUDA yet (its code for them has not been verified on a GPU); "
            "frames that compute on brick run eagerly instead. "
            "torch.compile(backend='aot_eager') compiles them.", RuntimeWarning, stacklevel=2)
    raise SkipFrame("torch_brickdev: Inductor does not support CUDA-backed brick devices yet")


def check_host_backing() -> None:
    """Run by every module Inductor generates for brick: its kernels are host code."""
    if _C._backing_device_type() != "cpu":
        raise RuntimeError(
            "torch_brickdev: this code was compiled by Inductor for brick's host runtime and "
            "cannot run on CUDA-backed brick devices; it was found in Inductor's cache (clear "
            "it, or set TORCHINDUCTOR_CACHE_DIR to a new directory)")


def _register() -> None:
    """Defines and registers brick's Inductor backend and dynamo interface (heavy imports)."""
    from torch._inductor import config as inductor_config
    from torch._inductor import ir
    from torch._inductor.codegen.common import (
        DeviceOpOverrides,
        register_backend_for_device,
        register_device_op_overrides,
    )
    from torch._inductor.codegen.cpp import CppScheduling
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    from torch._inductor.codegen.wrapper import (
        PythonWrapperCodegen,
        SubgraphPythonWrapperCodegen,
    )
    from torch._inductor.custom_graph_pass import CustomGraphModulePass
    from torch._inductor.graph import GraphLowering
    from torch._inductor.scheduler import BaseSchedulerNode
    from torch._inductor.virtualized import V

    # What brick overrides or extends, checked up front so that a torch without it fails here.
    for owner, name in ((PythonWrapperCodegen, "make_allocation"),
                        (PythonWrapperCodegen, "write_header"),
                        (PythonWrapperCodegen, "enter_context"),
                        (PythonWrapperCodegen, "generate_return"),
                        (PythonWrapperCodegen, "generate_profiler_mark_wrapper_call"),
                        (CppScheduling, "can_fuse_vertical"),
                        (CppScheduling, "can_fuse_horizontal"),
                        (CppScheduling, "codegen_node"), (CppScheduling, "codegen_template"),
                        (CppScheduling, "codegen_sync"), (CppScheduling, "flush"),
                        (GraphLowering, "set_current_device"),
                        (BaseSchedulerNode, "is_cpu"), (ir, "is_cpu"), (ir, "get_device_type")):
        if not callable(getattr(owner, name, None)):
            raise AttributeError(f"{owner.__name__}.{name} is missing")
    try:
        from torch._inductor.codegen.wrapper_fxir import WrapperFxCodegen
    except ImportError:  # older torch: Inductor has no FX wrapper
        WrapperFxCodegen = None

    cpu = torch.device("cpu")

    @contextlib.contextmanager
    def as_cpu_kernels():
        # The CPU as the current device (see BrickScheduling), and every kernel a named
        # RecordFunction ("graph_<id>_cpp_fused_..."), so profilers of brick see compiled
        # kernels as ops with their own time, not one opaque graph call.
        with V.graph.set_current_device(cpu), inductor_config.patch(
                {"cpp.enable_kernel_profile": True}):
            yield

    class BrickScheduling(CppScheduling):
        """Inductor's C++/OpenMP kernels, run on brick memory (host memory on the host
        runtime). On CUDA backing a graph that needs them is declined (see the module).

        Inductor picks code-generation behaviour by the current device's type (its
        ``get_current_backend()`` says "cpp" only for the CPU): kernels are generated with the
        CPU as the current device, as they are for the CPU's own graphs."""

        def __init__(self, scheduler):
            # scheduler is None when Inductor only asks for the backend's features.
            if scheduler is not None and _C._backing_device_type() != "cpu":
                _decline_on_cuda_backing()
            super().__init__(scheduler)

        def codegen_node(self, *args, **kwargs):
            with as_cpu_kernels():
                return super().codegen_node(*args, **kwargs)

        # No kernel spans two record_function ranges (see _mark_range_segments); a graph
        # without ranges (most) is not searched for them.
        def can_fuse_vertical(self, node1, node2):
            return (not _range_events() or _segment_of(node1) == _segment_of(node2)) \
                and super().can_fuse_vertical(node1, node2)

        def can_fuse_horizontal(self, node1, node2):
            return (not _range_events() or _segment_of(node1) == _segment_of(node2)) \
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

    class _BrickWrapper:
        def make_allocation(self, name, device, *args, **kwargs):
            # For devices it does not know Inductor writes device='<type>', relying on a device
            # guard for the index; brick kernels need no guard, so the device is named fully.
            line = super().make_allocation(name, device, *args, **kwargs)
            if device.type == BACKEND and device.index is not None:
                line = line.replace(f"device='{device.type}'", f"device='{device}'")
            return line

    class BrickSubgraphWrapperCodegen(_BrickWrapper, SubgraphPythonWrapperCodegen):
        pass

    class BrickWrapperCodegen(_BrickWrapper, PythonWrapperCodegen):
        """Inductor's Python wrapper, calling its C++ kernels on brick tensors."""

        @staticmethod
        def create(is_subgraph, subgraph_name, parent_wrapper, *args, **kwargs):
            if is_subgraph:
                return BrickSubgraphWrapperCodegen(subgraph_name, parent_wrapper, *args,
                                                   **kwargs)
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
            events = _range_events()
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
            segment = getattr(ctx, "meta", {}).get(_RANGE_SEGMENT)
            if segment is None or segment <= self._range_segment:
                return  # same range, or work Inductor moved later: kept where it runs
            V.graph.scheduler.flush()  # the kernels grouped so far run before the boundary
            for line in self._range_boundaries(segment):
                self.writeline(line)

        def generate_return(self, output_refs):
            for line in self._range_boundaries(len(_range_events())):
                self.wrapper_call.writeline(line)
            super().generate_return(output_refs)

    class BrickCppWrapper(CppWrapperCpu):  # (Inductor also reads class attributes)
        """``cpp_wrapper=True`` is not supported on brick: refused with the reason."""

        @staticmethod
        def create(*args, **kwargs):
            raise RuntimeError(
                "torch_brickdev: Inductor's C++ wrapper (cpp_wrapper=True, AOTInductor) is not "
                "supported on brick; use the default Python wrapper")

    with open(__file__, "rb") as source:
        source_hash = hashlib.sha256(source.read()).hexdigest()

    class BrickPass(CustomGraphModulePass):
        """Inductor runs it on every graph with brick inputs or outputs, after AOTAutograd and
        before lowering (the forward graph first). On the host runtime it changes nothing; on
        CUDA backing it declines the graph. Its uuid keeps code compiled for one runtime behind
        brick out of the other's cache entries."""

        def __call__(self, gm):
            if _C._backing_device_type() != "cpu":
                _decline_on_cuda_backing()

        def uuid(self):
            # What brick changes in Inductor (this file) and the runtime behind brick.
            return f"{source_hash}:{_backing()}"

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

    # Inductor's two is_cpu() tests mean "code generated by the C++ backend" (see the module).
    node_is_cpu, ir_is_cpu = BaseSchedulerNode.is_cpu, ir.is_cpu

    def node_is_cpu_or_brick(self) -> bool:
        device = self.get_device()
        return node_is_cpu(self) or (device is not None and device.type == BACKEND)

    def ir_is_cpu_or_brick(x) -> bool:
        return ir_is_cpu(x) or ir.get_device_type(x) == BACKEND

    # Ranges are read at the start of the joint-graph passes (before pattern replacements) and
    # again at the start of the post-grad passes (before reorder_for_locality moves nodes, and
    # before Inductor removes the range ops).
    from torch._inductor import compile_fx
    hooked = []
    for name in ("joint_graph_passes", "post_grad_passes"):
        passes = getattr(compile_fx, name, None)
        if passes is None:
            continue
        if not getattr(passes, "_brick", False):
            def mark_ranges_first(gm, *args, _passes=passes, **kwargs):
                _mark_range_segments(gm.graph)
                return _passes(gm, *args, **kwargs)

            functools.update_wrapper(mark_ranges_first, passes)
            mark_ranges_first._brick = True
            setattr(compile_fx, name, mark_ranges_first)
        hooked.append(name)
    global _ranges_hooked
    _ranges_hooked = len(hooked) == 2

    register_device_interface()
    register_device_op_overrides(BACKEND, BrickDeviceOpOverrides())
    optional = {"device_fx_wrapper_codegen": WrapperFxCodegen, "device_custom_pass": BrickPass()}
    accepted = inspect.signature(register_backend_for_device).parameters
    if "device_custom_pass" not in accepted:
        raise TypeError("register_backend_for_device() takes no device_custom_pass")
    register_backend_for_device(
        BACKEND, BrickScheduling, BrickWrapperCodegen, BrickCppWrapper,
        **{key: value for key, value in optional.items() if key in accepted})
    BaseSchedulerNode.is_cpu = node_is_cpu_or_brick
    ir.is_cpu = ir_is_cpu_or_brick
