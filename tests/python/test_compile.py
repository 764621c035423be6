"""torch.compile with the default (Inductor) backend on brick tensors.

On the host runtime Inductor generates its CPU code (C++ kernels, the Python wrapper) for brick
graphs and runs it on brick memory: results are brick tensors equal to eager (on brick and on
the CPU) within float tolerance, and no data moves to or from the CPU. On CUDA backing Inductor
must decline (one warning) and the code run eagerly: checked for real there, simulated on the
host runtime.

Every test compiles for real. Inductor's caches go to a temporary directory of this module, so
a run never depends on what an earlier run compiled; the price is Inductor's one-off set-up in
that directory (precompiled headers, about 8 s on a 2-core machine) and compiling every kernel
(about 1 s each).
"""

import subprocess
import warnings

import pytest
import torch
from torch import nn
from torch.profiler import record_function

from helpers import no_autoload_env, start_python

import torch_brickdev
import torch_brickdev._compile as brick_compile
import torch_brickdev.profiler as bp

BACKING = torch_brickdev.backing_device_type()  # "cpu": the host runtime
# Inductor compiles brick code on the host runtime only (on CUDA backing it declines: see the
# last test, which runs for real there and simulated here).
host_only = pytest.mark.skipif(BACKING != "cpu", reason="Inductor compiles brick code on the "
                               "host runtime only")

# Every copy into or out of brick memory (to or from the CPU, or within brick) is one of brick's
# own copy ops; none may run in compiled code. (Kernels' internal copies, e.g. addmm copying its
# bias into the result, are the CPU kernel's aten::copy_ on aliases of brick memory: no transfer.)
COPY_OPS = {"aten::_copy_from", "aten::_copy_from_and_resize"}


@pytest.fixture(scope="module", autouse=True)
def _fresh_inductor_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor_cache")))
        from torch._inductor.utils import clear_caches

        clear_caches()  # nothing compiled earlier in this process may be reused
        yield
        clear_caches()


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _code_of(fn, *args):
    """fn(*args) and the Python modules Inductor generated for it."""
    from torch._inductor.utils import run_and_get_code

    return run_and_get_code(fn, *args)


def _ops_run_by(fn, *args):
    """The ATen ops fn(*args) runs (its C++ kernels run none)."""
    with torch.autograd.profiler.profile() as prof:
        fn(*args)
    return {event.name for event in prof.function_events if event.name.startswith("aten::")}


def _assert_brick_close(actual, expected, **tolerance):
    assert actual.device.type == "brick", actual.device
    torch.testing.assert_close(actual.cpu(), expected.cpu(), **tolerance)


def _counter():
    from torch._dynamo.testing import CompileCounterWithBackend

    return CompileCounterWithBackend("inductor")


# --------------------------------------------------------------------------------------------
# Registration


def _start_python(code):
    return start_python("-c", code, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                        env=no_autoload_env())


def _output_of(process):
    try:
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()  # no-op once it has exited
    assert process.returncode == 0, err[-3000:]
    return out


def test_registration_is_lazy_and_survives_inductor_set_up_before_brick():
    # Importing brick imports neither dynamo nor Inductor; Inductor's own set-up registers it.
    lazy = _start_python(
        "import sys, torch, torch_brickdev\n"
        "heavy = [m for m in sys.modules if m.startswith(('torch._dynamo', 'torch._inductor'))]\n"
        "assert not heavy, heavy\n"
        "from torch._inductor.codegen.common import (get_device_op_overrides,\n"
        "    get_scheduling_for_device, init_backend_registration)\n"
        "init_backend_registration()\n"
        "from torch._dynamo.device_interface import get_interface_for_device\n"
        "print(get_scheduling_for_device('brick').__name__,\n"
        "      get_interface_for_device('brick').__name__,\n"
        "      get_device_op_overrides('brick').synchronize())\n")
    # Inductor set up (once per process) before brick was loaded: brick registers at import.
    late = _start_python(
        "import torch\n"
        "from torch._inductor.codegen.common import (get_scheduling_for_device,\n"
        "    init_backend_registration)\n"
        "init_backend_registration()\n"
        "import torch_brickdev\n"
        "print(get_scheduling_for_device('brick').__name__)\n")
    # Dynamo's device interface answers for brick as soon as dynamo's module exists, without
    # Inductor's set-up (PyTorch's TestDeviceInterface asks so), and without brick importing it.
    interface = _start_python(
        "import sys, torch, torch_brickdev\n"
        "assert 'torch._dynamo' not in sys.modules\n"
        "from torch._dynamo.device_interface import get_interface_for_device\n"
        "i = get_interface_for_device('brick')\n"
        "print(i.__name__, i.device_count() == torch.brick.device_count(),\n"
        "      'torch._inductor.codegen.common' in sys.modules)\n")
    # dynamo imported before brick: brick registers at its import.
    before = _start_python(
        "import torch, torch._dynamo.device_interface as d\n"
        "import torch_brickdev\n"
        "print(d.get_interface_for_device('brick').__name__)\n")
    assert _output_of(lazy).split() == [
        "BrickScheduling", "BrickInterface", "torch.brick.synchronize()"]
    assert _output_of(late).split() == ["BrickScheduling"]
    assert _output_of(interface).split() == ["BrickInterface", "True", "False"]
    assert _output_of(before).split() == ["BrickInterface"]


def test_device_interface_is_backed_by_torch_brick():
    from torch._dynamo.device_interface import get_interface_for_device
    from torch._inductor.codegen.common import init_backend_registration

    init_backend_registration()  # registers brick's interface too (Inductor's first compile)
    interface = get_interface_for_device(torch.device("brick"))
    assert interface.is_available() and interface.device_count() == torch.brick.device_count()
    assert interface.current_device() == torch.brick.current_device() == 0
    assert interface.exchange_device(1) == 0 and torch.brick.current_device() == 1
    assert interface.maybe_exchange_device(0) == 1 and torch.brick.current_device() == 0
    assert interface.maybe_exchange_device(-1) == -1
    with interface.device(1):
        assert torch.brick.current_device() == 1
    assert interface.Worker.current_device() == 0
    assert interface.Worker.get_device_properties(0).backing_device.split(":")[0] == BACKING
    stream = interface.Stream()
    with interface.stream(stream):
        assert interface.current_stream() == stream
        assert interface.get_raw_stream(0) == stream.stream_id
    assert interface.current_stream() == torch.brick.default_stream()
    start, end = interface.Event(enable_timing=True), interface.Event(enable_timing=True)
    start.record()
    x = torch.ones(256, 256, device="brick")
    end.record()
    interface.synchronize()
    assert start.elapsed_time(end) >= 0
    assert interface.memory_allocated() == torch.brick.memory_allocated() > 0
    assert interface.is_bf16_supported() and not interface.is_triton_capable()
    del x


# --------------------------------------------------------------------------------------------
# Functions and modules


@host_only
def test_fullgraph_function_runs_inductor_cpu_code_on_brick_memory():
    def fn(x, w):
        return torch.softmax(x @ w, dim=-1).sum(0) * 2 + x.amax()

    x, w = torch.randn(8, 16, device="brick"), torch.randn(16, 4, device="brick")
    compiled = torch.compile(fn, fullgraph=True)
    out, (code,) = _code_of(compiled, x, w)
    _assert_brick_close(out, fn(x, w))
    _assert_brick_close(out, fn(x.cpu(), w.cpu()))
    # Inductor's CPU code: a C++ kernel and the matmul as an extern kernel, on brick buffers.
    assert "cpp_fused_" in code and "extern_kernels.mm(" in code
    assert "device='brick:0'" in code
    for moving in ("empty_strided_cpu(", "device='cpu'", ".cpu()", ".to(", "copy_("):
        assert moving not in code, moving
    # The same code as for CPU tensors, so the same numbers.
    torch.testing.assert_close(out.cpu(), torch.compile(fn, fullgraph=True)(x.cpu(), w.cpu()),
                               rtol=1e-6, atol=1e-6)
    assert not _ops_run_by(compiled, x, w) & COPY_OPS
    # The check sees copies that compiled code makes.
    to_cpu = torch.compile(lambda t: (t.sin() + 1).cpu() * 2)
    moved = to_cpu(x)
    assert moved.device.type == "cpu"
    torch.testing.assert_close(moved, (x.cpu().sin() + 1) * 2)
    assert "aten::_copy_from" in _ops_run_by(to_cpu, x)


@host_only
def test_module_on_second_brick_device_with_backward():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh()).to("brick:1")
    x = torch.randn(4, 8, device="brick:1", requires_grad=True)
    compiled_x = x.detach().clone().requires_grad_()
    out = torch.compile(model)(compiled_x)
    assert out.device == torch.device("brick:1")  # allocated on the inputs' device
    out.sum().backward()
    expected = model(x)
    _assert_brick_close(out, expected)
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    expected.sum().backward()
    for compiled_grad, p in zip(grads, model.parameters()):
        assert compiled_grad.device == torch.device("brick:1")
        _assert_brick_close(compiled_grad, p.grad)
    _assert_brick_close(compiled_x.grad, x.grad)


@host_only
def test_mlp_training_step_matches_eager_and_cpu():
    def mlp(device):
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).to(device)

    x, y = torch.randn(8, 16), torch.randn(8, 4)
    runs = {}
    for name, device, compile_it in (("cpu", "cpu", False), ("eager", "brick", False),
                                     ("compiled", "brick", True)):
        model = mlp(device)
        step_model = torch.compile(model) if compile_it else model
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        xs, ys = x.to(device), y.to(device)
        losses = []
        for _ in range(3):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(step_model(xs), ys)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        if compile_it:  # a further forward and backward: compiled graphs only, no copies
            def forward_backward():
                nn.functional.mse_loss(step_model(xs), ys).backward()

            assert not _ops_run_by(forward_backward) & COPY_OPS
        runs[name] = (model, torch.stack(losses))
    compiled_model, compiled_losses = runs["compiled"]
    for reference in ("eager", "cpu"):
        model, losses = runs[reference]
        _assert_brick_close(compiled_losses, losses, rtol=1e-5, atol=1e-6)
        for p, q in zip(compiled_model.parameters(), model.parameters()):
            _assert_brick_close(p, q, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------
# Dynamo: shapes, recompilation, graph breaks


@host_only
def test_dynamic_shapes_explicit_and_after_a_recompile():
    def fn(x):
        return nn.functional.gelu(x).sum(-1) * x.shape[0]

    counter = _counter()
    compiled = torch.compile(fn, backend=counter, dynamic=True)
    for rows in (3, 5, 9):
        x = torch.randn(rows, 8, device="brick")
        _assert_brick_close(compiled(x), fn(x.cpu()))
    assert counter.frame_count == 1  # one graph for every size

    torch._dynamo.reset()
    counter = _counter()
    compiled = torch.compile(fn, backend=counter)
    for rows in (3, 5, 9, 12):
        x = torch.randn(rows, 8, device="brick")
        _assert_brick_close(compiled(x), fn(x.cpu()))
    assert counter.frame_count == 2  # static, then dynamic after the size changed


@host_only
def test_recompiles_on_shape_change_and_compiles_around_graph_breaks():
    counter = _counter()
    compiled = torch.compile(lambda t: t.sin() * 2 + 1, backend=counter, dynamic=False)
    x4, x6 = torch.randn(4, device="brick"), torch.randn(6, device="brick")
    for x in (x4, x6, x4):
        _assert_brick_close(compiled(x), x.cpu().sin() * 2 + 1)
    assert counter.frame_count == 2

    counter = _counter()

    @torch.compile(backend=counter)
    def with_breaks(t):
        y = t.cos() + 1
        torch._dynamo.graph_break()
        if y.sum() > 0:  # data-dependent: another break
            return y * 3
        return y - 3

    x = torch.randn(16, device="brick")
    y = x.cpu().cos() + 1
    _assert_brick_close(with_breaks(x), y * 3 if y.sum() > 0 else y - 3)
    assert counter.frame_count >= 2


@host_only
def test_reduce_overhead_runs_compiled_code_without_cuda_graphs():
    # mode="reduce-overhead" asks for CUDA graphs; Inductor captures them for CUDA devices only
    # and, as for CPU tensors, counts a skip and runs the compiled code without them.
    from torch._dynamo.utils import counters

    counters.clear()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU()).to("brick")
    compiled = torch.compile(model, mode="reduce-overhead")
    x = torch.randn(4, 16, device="brick")
    for _ in range(3):
        out = compiled(x)
    _assert_brick_close(out, model(x))
    _assert_brick_close(out, model.cpu()(x.cpu()))
    assert counters["inductor"]["cudagraph_skips"] >= 1


# --------------------------------------------------------------------------------------------
# A transformers model


@host_only
@pytest.mark.model
def test_qwen2_greedy_generation_matches_eager():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    config = transformers.Qwen2Config(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).eval().to("brick")
    ids = torch.randint(3, 128, (1, 7), generator=torch.Generator().manual_seed(1)).to("brick")
    with torch.no_grad():
        eager = model.generate(ids, max_new_tokens=2, do_sample=False)
        reference = model.to("cpu").generate(ids.cpu(), max_new_tokens=2, do_sample=False)
        model.to("brick")
        model.forward = torch.compile(model.forward)  # prefill and one decode step: 2 graphs
        compiled = model.generate(ids, max_new_tokens=2, do_sample=False)
    assert compiled.device.type == "brick"
    assert compiled.tolist() == eager.tolist() == reference.tolist()


@host_only
@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_sdpa_with_dynamic_shapes_traces(backend):
    # SDPA's kernel choice on brick reads fake tensors' symbolic metadata while dynamo traces.
    sdpa = nn.functional.scaled_dot_product_attention
    compiled = torch.compile(sdpa, backend=backend, dynamic=True)
    for lengths in ((3, 5, 5), (4, 7, 7)):
        q, k, v = (torch.randn(1, 4, n, 8, device="brick") for n in lengths)
        _assert_brick_close(compiled(q, k, v), sdpa(q.cpu(), k.cpu(), v.cpu()))


# --------------------------------------------------------------------------------------------
# What brick does not support, said clearly


@host_only
def test_cpp_wrapper_is_refused_with_the_reason():
    import torch._inductor.config as inductor_config

    with inductor_config.patch(cpp_wrapper=True), pytest.raises(Exception,
                                                                match="not supported on brick"):
        torch.compile(lambda t: t.sin() + 1)(torch.randn(4, device="brick"))


class _CudaBacked:
    """brick's native module, answering as on CUDA backing."""

    def __getattr__(self, name):
        return getattr(torch_brickdev._C, name)

    @staticmethod
    def _backing_device_type():
        return "cuda"


def test_cuda_backing_declines_with_one_warning_and_runs_eagerly(monkeypatch):
    if BACKING == "cpu":
        monkeypatch.setattr(brick_compile, "_C", _CudaBacked())
    monkeypatch.setattr(brick_compile, "_warned_cuda", False)

    def fn(t):
        return t.sin() * 2

    torch.manual_seed(0)
    linear = nn.Linear(4, 3).to("brick")
    x = torch.randn(2, 4, device="brick")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled_fn = torch.compile(fn)
        for _ in range(2):
            _assert_brick_close(compiled_fn(x), x.cpu().sin() * 2)
        # Only an extern matmul in the forward, a C++ reduction in the backward: declined
        # before either is compiled.
        out = torch.compile(linear)(x)
        out.sum().backward()
    _assert_brick_close(out, linear(x))
    _assert_brick_close(linear.bias.grad, torch.full((3,), 2.0))
    ours = [w for w in caught if "torch_brickdev" in str(w.message)]
    assert len(ours) == 1 and "backed by CUDA" in str(ours[0].message)
    with pytest.raises(RuntimeError, match="Inductor does not support CUDA-backed brick"):
        torch.compile(lambda t: t.cos() + 1, fullgraph=True)(x)


@host_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_autocast_under_compile_equals_cpu_autocast(dtype):
    def block(a, b, w):
        return torch.relu(a @ b).sum(-1) + nn.functional.linear(a, w).mean(-1)

    a, b, w = torch.randn(16, 32), torch.randn(32, 8), torch.randn(4, 32)
    compiled = torch.compile(block, fullgraph=True)
    with torch.autocast("brick", dtype=dtype):
        out = compiled(a.to("brick"), b.to("brick"), w.to("brick"))
        eager = block(a.to("brick"), b.to("brick"), w.to("brick"))
    with torch.autocast("cpu", dtype=dtype):
        expected = block(a, b, w)
    assert out.device.type == "brick" and out.dtype == eager.dtype == expected.dtype == dtype
    torch.testing.assert_close(eager.cpu(), expected, rtol=0, atol=0)
    torch.testing.assert_close(out.cpu(), expected)


@host_only
def test_compiled_kernels_are_named_bricks_with_device_time():
    # Compiled code is not one opaque range: each graph call and each generated kernel is a
    # named brick in the registry and a row with BRICK time in the legacy profiler.
    import torch_brickdev.profiler as bp

    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.LayerNorm(128)).to("brick")
    compiled = torch.compile(model)
    x = torch.randn(32, 64, device="brick")
    compiled(x)
    with bp.profile(sync_mode="event") as p:
        for _ in range(3):
            compiled(x)
    kernels = [b for b in p.report.bricks if "cpp_fused" in b.name]
    calls = [b for b in p.report.bricks if b.name.endswith("_inductor_wrapper_call")]
    assert kernels and calls, [b.name for b in p.report.bricks]
    assert all(b.count == 3 and b.total_ns > 0 for b in kernels + calls)
    extern = p.report.brick("aten::addmm")  # what Inductor leaves to ATen runs as brick ops
    assert extern.count == 3
    paths = {b.path for b in p.report.paths}
    assert any("_inductor_wrapper_call/" in path and "cpp_fused" in path for path in paths)
    with torch.autograd.profiler.profile(use_device="brick") as prof:
        compiled(x)
    rows = {r.key: r for r in prof.key_averages()}
    kernel_rows = [r for key, r in rows.items() if "cpp_fused" in key]
    assert kernel_rows and all(r.device_time_total > 0 for r in kernel_rows)


def _ranged(x, w):
    with record_function("A"):
        y = torch.relu(x @ w)
    with record_function("B"):
        z = (y * 2 + 1).mean(-1)
        with record_function("C"):
            z = z.exp()
    with record_function("Empty"):
        pass
    return z


def _attention_in_three_ranges(q, k, v):
    with record_function("Score"):
        scores = torch.matmul(q, k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    with record_function("Softmax"):
        probs = torch.softmax(scores, dim=-1)
    with record_function("Output"):
        return torch.matmul(probs, v)


needs_kept_ranges = pytest.mark.skipif(
    not hasattr(torch._dynamo.config, "capture_profiler_record_function"),
    reason="this torch's dynamo cannot capture record_function ranges")


@host_only
@needs_kept_ranges
def test_ranges_dynamo_captures_stay_bricks_with_their_own_kernels():
    assert brick_compile.keeps_ranges()
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    with torch._dynamo.config.patch(capture_profiler_record_function=True):
        compiled = torch.compile(_ranged)
        out = compiled(x.to("brick"), w.to("brick"))  # compiles
        torch.testing.assert_close(out.cpu(), _ranged(x, w))
        with bp.profile() as p:
            for _ in range(3):
                compiled(x.to("brick"), w.to("brick"))
    paths = {b.path: b for b in p.report.paths}
    graph = next(path for path in paths if path.endswith("_inductor_wrapper_call"))
    # Each range once per call, nested as in the eager code, inside the graph's call.
    for name in ("A", "B", "B/C", "Empty"):
        assert paths[f"{graph}/{name}"].count == 3, sorted(paths)

    def kernels(name):  # the generated kernels directly inside a range
        prefix = f"{graph}/{name}/"
        return [path[len(prefix):] for path in paths
                if path.startswith(prefix) and "/" not in path[len(prefix):]
                and "cpp_fused" in path]

    # No kernel spans two ranges: relu runs in A (not inlined into B's kernel), exp in C.
    assert kernels("A") and all("relu" in k for k in kernels("A")), sorted(paths)
    assert f"{graph}/A/aten::mm" in paths
    assert kernels("B") and not any("relu" in k or "exp" in k for k in kernels("B")), sorted(paths)
    assert kernels("B/C") and all("exp" in k for k in kernels("B/C"))
    assert not any(path.startswith(f"{graph}/Empty/") for path in paths)


@host_only
@needs_kept_ranges
def test_no_pattern_replacement_joins_the_work_of_two_ranges():
    # Inductor replaces matmul-softmax-matmul with one SDPA kernel; across three ranges that
    # would leave Score and Softmax empty and time the whole attention as Output.
    q, k, v = (torch.randn(1, 4, 8, 16) for _ in range(3))
    with torch._dynamo.config.patch(capture_profiler_record_function=True):
        compiled = torch.compile(_attention_in_three_ranges)
        bricked = [t.to("brick") for t in (q, k, v)]
        torch.testing.assert_close(compiled(*bricked).cpu(), _attention_in_three_ranges(q, k, v))
        with bp.profile() as p:
            compiled(*bricked)
    paths = [b.path for b in p.report.paths]
    assert not any("scaled_dot_product" in path for path in paths), paths
    for name, work in (("Score", "bmm"), ("Softmax", "softmax"), ("Output", "bmm")):
        assert any(f"/{name}/" in path and work in path for path in paths), (name, paths)


@host_only
@needs_kept_ranges
def test_a_compiled_training_step_keeps_its_forward_ranges_and_equals_the_cpu():
    class TwoRanges(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = nn.Linear(32, 64), nn.Linear(64, 8)

        def forward(self, x):
            with record_function("First"):
                h = torch.nn.functional.gelu(self.first(x))
            with record_function("Second"):
                return self.second(h).softmax(-1)

    torch.manual_seed(0)
    cpu, on_brick = TwoRanges(), TwoRanges()
    on_brick.load_state_dict(cpu.state_dict())
    on_brick.to("brick")
    x = torch.randn(16, 32)
    with torch._dynamo.config.patch(capture_profiler_record_function=True):
        compiled = torch.compile(on_brick)
        cpu(x).sum().backward()
        compiled(x.to("brick")).sum().backward()
        for p_cpu, p_brick in zip(cpu.parameters(), on_brick.parameters()):
            torch.testing.assert_close(p_brick.grad.cpu(), p_cpu.grad, rtol=1e-4, atol=1e-5)
        with bp.profile() as p:
            for _ in range(2):
                compiled(x.to("brick")).sum().backward()
    paths = {b.path: b.count for b in p.report.paths}
    for name, kernel in (("First", "gelu"), ("Second", "softmax")):
        ranged = [path for path in paths if path.endswith(f"_inductor_wrapper_call/{name}")]
        assert len(ranged) == 1 and paths[ranged[0]] == 2, sorted(paths)
        assert any(path.startswith(ranged[0] + "/") and "cpp_fused" in path and kernel in path
                   for path in paths), sorted(paths)


@needs_kept_ranges
def test_compiled_cpu_code_keeps_pytorchs_handling_of_ranges():
    # Brick reads ranges only in graphs with brick tensors: on the CPU Inductor removes them.
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    with torch._dynamo.config.patch(capture_profiler_record_function=True):
        compiled = torch.compile(_ranged)
        compiled(x, w)
        with bp.profile() as p:
            compiled(x, w)
    names = {b.name for b in p.report.bricks}
    assert not names & {"A", "B", "C", "Empty"}, names


@host_only
@pytest.mark.timing
@pytest.mark.model
@pytest.mark.timeout(400)  # compiles the forward for the prefill and for decode steps
def test_compiled_decode_demo_keeps_its_bricks_and_passes_the_contract(tmp_path):
    from contract_fixtures import MACHINE_TIMED, assert_contract_holds
    from torch_brickdev.tools import demo
    from torch_brickdev.tools.contract import run_checks

    # LmHead and the MLP large enough to outweigh a compiled call's fixed cost (guards and
    # wrappers, tens of us), as in test_contract_on_demo.
    config = demo.DecodeConfig(layers=2, hidden=128, heads=4, kv_heads=2, vocab=32000,
                               prompt_tokens=4, tokens=6, intermediate=8192)
    # One kernel thread, as in test_contract_on_demo: on a busy 2-core machine a two-thread gemm
    # waits at its barrier for a preempted worker (a scheduler slice, milliseconds), which then
    # sets every projection's median alike (LmHead 6.6 ms, GateProjection 7.0 ms beside two busy
    # loops) and hides the order the contract checks.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = demo.run_demo(config, runs=2, out_dir=tmp_path, progress=False, compile=True)
    finally:
        torch.set_num_threads(threads)
    report = result["report"]
    assert report.metadata["decode"]["compiled"] is True and result["compiled"] is True
    # One compiled graph per forward, each decode brick inside it holding its own generated
    # kernels; what Inductor leaves to ATen (LmHead's mm) runs inside its brick.
    paths = [p.path for p in report.paths]
    for brick in ("RmsNorm", "RopeEmbedding", "AttentionScore", "AttentionSoftmax",
                  "AttentionOutput", "Activation"):
        assert any(f"_inductor_wrapper_call/{brick}/" in p and "cpp_fused" in p.split(brick)[1]
                   for p in paths), (brick, paths)
    assert any(p.endswith("_inductor_wrapper_call/LmHead/aten::mm") for p in paths), paths
    graph_calls = [b for b in report.bricks if b.name.endswith("_inductor_wrapper_call")]
    assert sum(b.count for b in graph_calls) == config.tokens, graph_calls  # one per step
    # The warm-up compiled everything: no profiled decode traced (tracing runs prims ops).
    assert not any(b.name.startswith("prims::") for b in report.bricks), \
        [b.name for b in report.bricks]
    assert_contract_holds(report, run_checks(report))
    # Compiled code computes what eager code does: the same greedy tokens, on brick and the CPU.
    eager = demo.decode(demo.build_model(config, "brick:0"), config, "brick:0")
    assert result["tokens"] == result["legacy_tokens"] == eager.tokens
    cpu = demo.decode(demo.build_model(config, "cpu"), config, "cpu")
    assert eager.tokens == cpu.tokens
    assert "each block still a brick" in demo.format_summary(result)
    # The legacy trace shows the kernels with device time too.
    key_averages = result["key_averages_table"]
    assert "inductor_wrapper_call" in key_averages or "cpp_fused" in key_averages


# --------------------------------------------------------------------------------------------
# Convolution layouts: what compile predicts is what brick returns


CL2, CL3 = torch.channels_last, torch.channels_last_3d
# (name, dims, transposed, groups, input layout, weight layout)
CONV_CASES = [
    ("conv1d", 1, False, 1, None, None),
    ("conv2d", 2, False, 1, None, None),
    ("conv2d-input-cl", 2, False, 1, CL2, None),
    ("conv2d-weight-cl", 2, False, 1, None, CL2),
    ("conv2d-grouped-input-cl", 2, False, 4, CL2, None),
    ("conv2d-depthwise-weight-cl", 2, False, 8, None, CL2),
    ("conv-transpose2d-weight-cl", 2, True, 1, None, CL2),
    ("conv-transpose2d-input-cl", 2, True, 2, CL2, None),
    ("conv3d-input-cl", 3, False, 1, CL3, None),
    ("conv3d-weight-cl", 3, False, 1, None, CL3),
]


@pytest.mark.parametrize("name, dims, transposed, groups, input_layout, weight_layout", CONV_CASES,
                         ids=[c[0] for c in CONV_CASES])
def test_fake_convolution_strides_are_what_brick_returns(name, dims, transposed, groups,
                                                         input_layout, weight_layout):
    """FakeTensor's prediction (what dynamo, Inductor and export use) of a convolution's output
    and gradients equals brick's real result, which equals its backing device's (the CPU here)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch.manual_seed(0)
    channels, spatial = 8, (6,) * dims
    x = torch.randn(2, channels, *spatial)
    w = torch.randn(*((channels, channels // groups) if transposed else (channels, channels // groups)),
                    *(3,) * dims)
    if input_layout is not None:
        x = x.to(memory_format=input_layout)
    if weight_layout is not None:
        w = w.to(memory_format=weight_layout)
    b = torch.randn(channels)
    ones, zeros = [1] * dims, [0] * dims
    conv_args = (ones, ones, ones, transposed, zeros, groups)  # stride, padding, dilation, ...

    def forward_and_backward(x, w, b):
        out = torch.ops.aten.convolution(x, w, b, *conv_args)
        grads = torch.ops.aten.convolution_backward(out, x, w, [channels], *conv_args,
                                                    [True, True, True])
        return [out, *grads]

    cpu = forward_and_backward(x, w, b)
    on_brick = [t.to("brick") for t in (x, w, b)]
    brick = forward_and_backward(*on_brick)
    with FakeTensorMode() as mode:
        fake = forward_and_backward(*(mode.from_tensor(t) for t in on_brick))
    for what, c, r, f in zip(("output", "grad_input", "grad_weight", "grad_bias"), cpu, brick, fake):
        assert r.stride() == c.stride(), (what, "brick vs its backing device")
        assert f.stride() == r.stride(), (what, "compile's prediction vs brick")
        assert f.device == r.device


class _ResidualBlock(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(c)
        self.c2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(x + self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))


class _TinyViT(torch.nn.Module):
    """A patch-embedding convolution, one pre-norm attention + MLP block, a head (as ViT)."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.patch = torch.nn.Conv2d(3, dim, 4, stride=4)
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(),
                                       torch.nn.Linear(2 * dim, dim))
        self.head = torch.nn.Linear(dim, 10)

    def forward(self, x):
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        b, t, d = tokens.shape
        q, k, v = self.qkv(self.norm1(tokens)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        attended = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        tokens = tokens + self.proj(attended.transpose(1, 2).reshape(b, t, d))
        tokens = tokens + self.mlp(self.norm2(tokens))
        return self.head(tokens.mean(1))


def _resnet_style():
    from torch import nn
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), _ResidualBlock(16), _ResidualBlock(16),
                         nn.Conv2d(16, 32, 3, stride=2), _ResidualBlock(32),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


@pytest.mark.model
@pytest.mark.timeout(600)
@pytest.mark.parametrize("make", [_resnet_style, _TinyViT], ids=["resnet-style", "vit-style"])
def test_compiled_convolution_networks_equal_eager_forward_and_training_step(make):
    """Inductor makes weights channels_last in convolution graphs (its layout optimisation): the
    compiled networks ran into their stride checks on brick before; now forward (eval) and a
    training step (loss and gradients) equal eager brick."""
    torch.manual_seed(0)
    model = make().to("brick")
    x = torch.randn(2, 3, 32, 32, device="brick")
    compiled = torch.compile(model)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    model.train()
    grads = []
    for run in (model, compiled):
        model.zero_grad()
        loss = run(x).square().mean()
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=1e-4, atol=1e-5)
    for got, want in zip(grads[1][1], grads[0][1]):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)


# --------------------------------------------------------------------------------------------
# torch_openreg's test_compile.py, for brick


def test_compile_aot_eager_matches_eager_with_autograd_and_modules():
    fn = torch.compile(lambda x: torch.relu((x + 1) * 2), backend="aot_eager", fullgraph=True)
    x = torch.randn(4, device="brick")
    result = fn(x)
    assert result.device.type == "brick"
    assert torch.equal(result.cpu(), torch.relu((x.cpu() + 1) * 2))
    g = torch.randn(4, device="brick", requires_grad=True)
    torch.compile(lambda t: (t * 2).sum(), backend="aot_eager")(g).backward()
    assert torch.equal(g.grad.cpu(), torch.full((4,), 2.0))
    module = nn.Linear(4, 4).to("brick")
    compiled = torch.compile(module, backend="aot_eager")
    inp = torch.randn(2, 4, device="brick")
    assert torch.equal(compiled(inp).cpu(), module(inp).cpu())
    to_cpu = torch.compile(lambda t: (t + 1).cpu() * 2, backend="aot_eager", fullgraph=True)
    moved = to_cpu(x)
    assert moved.device.type == "cpu" and torch.equal(moved, (x.cpu() + 1) * 2)
    with torch.device("brick"):
        made = torch.compile(lambda t: t + torch.ones(4), backend="aot_eager")(x)
    assert made.device.type == "brick" and torch.equal(made.cpu(), x.cpu() + 1)


def test_compile_guards_recompile_on_shape_change():
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")
    fn = torch.compile(lambda t: t + 1, backend=counter, dynamic=False)
    x4 = torch.randn(4, device="brick")
    fn(x4)
    fn(x4)
    assert counter.frame_count == 1
    x8 = torch.randn(8, device="brick")
    assert torch.equal(fn(x8).cpu(), x8.cpu() + 1)
    assert counter.frame_count == 2
    breaks = CompileCounterWithBackend("eager")

    @torch.compile(backend=breaks)
    def with_break(t):
        y = t + 1
        torch._dynamo.graph_break()
        return y * 2

    assert torch.equal(with_break(x4).cpu(), (x4.cpu() + 1) * 2)
    assert breaks.frame_count > 1


def test_fake_tensor_mode_keeps_brick():
    from torch._subclasses.fake_tensor import FakeTensorMode

    seen = []

    def capture(gm, example_inputs):
        for node in gm.graph.nodes:
            value = node.meta.get("example_value")
            if node.op == "placeholder" and isinstance(value, torch.Tensor):
                seen.append(value.device)
        return gm.forward

    compiled = torch.compile(lambda t: t + 1, backend=capture, fullgraph=True)
    compiled(torch.randn(4, device="brick:1"))
    assert seen == [torch.device("brick:1")]
    with FakeTensorMode():
        a = torch.empty(3, 3, device="brick")
        b = torch.empty(3, 3, device="brick:0")
        c = a + b
        assert c.device == torch.device("brick:0") and c.shape == (3, 3)
