"""Brick devices backed by CUDA GPUs (the CUDA runtime). Skipped where brick runs on the host.

Run on a machine with a GPU and a CUDA build of PyTorch (``BRICK_RUNTIME=auto`` picks CUDA there).
"""

import contextlib
import time

import pytest
import torch

import torch_brickdev
import torch_brickdev.profiler as bp
from helpers import no_autoload_env, run_python
from profiler_helpers import load_benchmark

ON_CUDA = torch_brickdev.runtime_name() == "cuda"
pytestmark = [pytest.mark.timing, pytest.mark.skipif(
    not ON_CUDA, reason=f"brick is not backed by CUDA here: {torch_brickdev.runtime_note()}"
)]
TWO_GPUS = ON_CUDA and torch.brick.device_count() >= 2


def big_matmul_inputs(n=4096, device="brick"):
    torch.manual_seed(0)
    return torch.randn(n, n, device=device), torch.randn(n, n, device=device)


def test_first_brick_allocation_of_a_fresh_process_works():
    """Nothing else touches CUDA first here (no seeding, no torch.cuda call): brick itself must
    initialize PyTorch's CUDA side (its caching allocator) before allocating through it."""
    code = ("import torch, torch_brickdev\n"
            "x = torch.empty(1024, device='brick')\n"
            "x.fill_(2.0)\n"
            "print(float((x * 3).sum().item()), torch_brickdev.backing_device_type())\n")
    done = run_python("-c", code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["6144.0", "cuda"], done.stdout


def test_brick_is_backed_by_cuda_device_n():
    assert torch_brickdev.backing_device_type() == "cuda"
    assert torch.brick.device_count() == torch.cuda.device_count()
    assert "cuda" in torch_brickdev.runtime_note()


def test_tensors_live_in_gpu_memory_and_ops_are_cuda_kernels():
    before = torch.brick.memory_allocated()
    a, b = big_matmul_inputs(1024)
    assert torch.brick.memory_allocated() >= before + 2 * 1024 * 1024 * 4
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        c = a @ b
        torch.brick.synchronize()
    # CUPTI's kernels. PyTorch's Kineto shim types GPU activities as PrivateUse1 once a
    # PrivateUse1 backend is named (kineto_shim.cpp, deviceTypeFromActivity), CUDA otherwise.
    gpu_types = (torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.PrivateUse1)
    kernels = [e for e in prof.events() if e.device_type in gpu_types]
    assert kernels, "a brick matmul must launch CUDA kernels"
    expected = a.to("cuda") @ b.to("cuda")
    torch.testing.assert_close(c.to("cuda"), expected)


def test_work_is_asynchronous_and_synchronize_waits():
    a, b = big_matmul_inputs(8192)
    torch.brick.synchronize()
    start = time.perf_counter()
    for _ in range(8):
        c = a @ b
    launched = time.perf_counter() - start
    torch.brick.synchronize()
    finished = time.perf_counter() - start
    assert finished > 2 * launched, (launched, finished)
    assert torch.isfinite(c).all().item()


def test_brick_streams_are_pytorch_cuda_streams():
    side = torch.brick.Stream()
    cuda_side = torch_brickdev.backing_stream(side)
    assert isinstance(cuda_side, torch.cuda.Stream)
    default = torch_brickdev.backing_stream(torch.brick.default_stream())
    assert default == torch.cuda.default_stream()
    a, b = big_matmul_inputs(4096)
    torch.brick.synchronize()
    with torch.brick.stream(side):
        c = a @ b
        done = torch.brick.Event()
        done.record()
    assert not cuda_side.query() or done.query()  # running, or already done: never wrong
    torch.brick.current_stream().wait_event(done)
    torch.testing.assert_close((c @ torch.eye(4096, device="brick")).to("cuda"),
                               a.to("cuda") @ b.to("cuda"), rtol=1e-3, atol=1e-2)


def test_event_elapsed_time_matches_cuda_events():
    a, b = big_matmul_inputs(4096)
    for _ in range(3):
        a @ b
    brick_start, brick_end = (torch.brick.Event(enable_timing=True) for _ in range(2))
    cuda_start, cuda_end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    cuda_stream = torch_brickdev.backing_stream()
    torch.brick.synchronize()
    brick_start.record()
    cuda_start.record(cuda_stream)
    for _ in range(10):
        a @ b
    cuda_end.record(cuda_stream)
    brick_end.record()
    brick_end.synchronize()
    brick_ms, cuda_ms = brick_start.elapsed_time(brick_end), cuda_start.elapsed_time(cuda_end)
    assert cuda_ms > 1.0
    assert abs(brick_ms - cuda_ms) <= 0.02 * cuda_ms + 0.05, (brick_ms, cuda_ms)


def test_copies_between_brick_cpu_and_cuda():
    host = torch.arange(1 << 20, dtype=torch.float32)
    on_brick = host.to("brick")
    on_cuda = on_brick.to("cuda")
    assert torch.equal(on_cuda.cpu(), host)
    back = on_cuda.to("brick")
    assert back.device.type == "brick"
    assert torch.equal(back.cpu(), host)
    strided = on_brick.view(1024, 1024).t()
    assert torch.equal(strided.cpu(), host.view(1024, 1024).t())
    halves = on_brick.to(torch.float16)
    assert torch.equal(halves.cpu(), host.to(torch.float16))


@pytest.mark.skipif(not TWO_GPUS, reason="needs two GPUs")
def test_copies_between_brick_devices_on_two_gpus():
    host = torch.randn(1 << 20)
    first = host.to("brick:0")
    second = first.to("brick:1")
    assert second.device == torch.device("brick:1")
    assert torch.equal(second.cpu(), host)
    with torch.brick.device(1):
        assert torch.equal((second * 2).cpu(), host * 2)


def test_memory_statistics_follow_allocations():
    torch.brick.synchronize()
    base = torch.brick.memory_allocated()
    torch.brick.reset_peak_memory_stats()
    x = torch.empty(1 << 24, device="brick")  # 64 MiB
    assert torch.brick.memory_allocated() - base == x.nbytes
    y = x + 1  # a CUDA kernel's result, adopted by brick
    stats = torch.brick.memory_stats()
    assert stats["adopted_bytes.all.current"] >= y.nbytes
    del x, y
    assert torch.brick.memory_allocated() == base
    assert torch.brick.max_memory_allocated() >= base + 2 * (1 << 26)


@pytest.mark.parametrize("allocate", ["empty", "op_result"])
def test_record_stream_delays_reuse_until_the_stream_is_done(allocate):
    side = torch.brick.Stream()
    a, b = big_matmul_inputs(4096)
    if allocate == "op_result":
        a = a * 1.0  # memory of PyTorch's CUDA allocator, adopted by brick
    expected = a.to("cuda") @ b.to("cuda")
    torch.brick.synchronize()
    side.wait_stream(torch.brick.current_stream())
    with torch.brick.stream(side):
        for _ in range(4):
            c = a @ b  # long enough that the default stream runs ahead
    a.record_stream(side)
    del a  # its memory must not be reused before the side stream's matmuls are done
    for _ in range(8):
        torch.zeros(4096, 4096, device="brick")  # would clobber `a` if reused too early
    side.synchronize()
    torch.testing.assert_close(c.to("cuda"), expected)


def test_rng_matches_seeding_and_is_independent_of_torch_cuda():
    torch.brick.manual_seed(123)
    first = torch.randn(1000, device="brick").cpu()
    torch.cuda.manual_seed(999)  # must not move brick's generator
    torch.brick.manual_seed(123)
    second = torch.randn(1000, device="brick").cpu()
    assert torch.equal(first, second)


@pytest.mark.parametrize("mode", ["event", "immediate"])
def test_registry_device_time_of_a_long_op(mode):
    a, b = big_matmul_inputs(4096)
    for _ in range(3):
        a @ b
    torch.brick.synchronize()
    with bp.profile(sync_mode=mode) as session:
        for _ in range(20):
            a @ b
    mm = session.report.brick("aten::mm")
    assert mm.count == 20
    # A 4096^3 fp32 matmul is far above 20 us on any GPU, and far below a second.
    assert 20.0 < mm.avg_us() < 1e6
    assert bp.health()["timing_failures"] == 0


def test_event_mode_agrees_with_cupti_kernel_times():
    """Per-op device time in Event mode vs the kernel time CUPTI reports, for ops >= 20 us
    (the comparison benchmarks/bench_cuda.py prints)."""
    torch.manual_seed(0)
    for n, brick_us, cupti_us in load_benchmark("bench_cuda").cupti_agreement():
        assert cupti_us >= 20.0
        assert abs(brick_us - cupti_us) <= 0.05 * cupti_us, (n, brick_us, cupti_us)


def traced_profile():
    tracer, why = bp.work_tracer()
    if tracer is None:
        pytest.fail(f"no CUPTI tracer on a GPU machine: {why}")
    assert tracer == "CUPTI"
    return bp.profile(sync_mode="event", device_timing="traced")


def test_traced_timing_of_a_long_op_agrees_with_event_pairs_on_a_backed_up_stream():
    """A 4096^3 matmul queued behind others: an event pair then brackets the kernel alone, so
    CUPTI's kernel time through brick's tracer must agree with it."""
    a, b = big_matmul_inputs(4096)
    for _ in range(3):
        a @ b
    torch.brick.synchronize()
    times = {}
    for name, factory in (("events", lambda: bp.profile(sync_mode="event")),
                          ("traced", traced_profile)):
        with factory() as session:
            for _ in range(20):
                a @ b
        times[name] = session.report.brick("aten::mm")
        health = bp.health()
        assert health["timing_failures"] == 0 and health["traced_lost"] == 0, health
    assert times["traced"].count == 20
    assert abs(times["traced"].avg_us() - times["events"].avg_us()) <= \
        0.05 * times["events"].avg_us(), (times["traced"].avg_us(), times["events"].avg_us())


def test_traced_timing_gives_every_brick_of_a_decode_its_kernels():
    from torch_brickdev.tools import demo
    config = demo.DecodeConfig(tokens=8)
    model = demo.build_model(config, "brick:0")
    with torch.no_grad():
        demo.decode(model, config, "brick:0")
        torch.brick.synchronize()
        with traced_profile() as session:
            demo.decode(model, config, "brick:0")
    report = session.report
    assert report.metadata["device_timing"] == {"timing": "traced", "tracer": "CUPTI"}
    lm_head = report.brick("LmHead")
    assert lm_head.count == config.tokens and lm_head.total_ns > 0
    ops = [p for p in report.paths if p.kind == "op" and p.path.endswith("aten::mm")]
    assert ops and all(p.total_ns > 0 for p in ops)
    health = bp.health()
    assert health["traced_lost"] == 0 and health["timing_failures"] == 0, health


def test_traced_timing_inside_torch_profiler_with_cuda_is_refused_saying_which_to_change():
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities):
        with pytest.raises(RuntimeError, match="device_timing='events' inside torch.profiler"):
            with traced_profile():
                pass
    assert not bp.is_enabled()
    with traced_profile() as session:  # after torch.profiler: CUPTI is brick's again
        torch.ones(1 << 20, device="brick").mul_(2)
    assert session.report.brick("aten::mul_").total_ns > 0


def test_the_legacy_profiler_traced_agrees_with_event_pairs_on_a_backed_up_stream():
    """The legacy profiler under set_device_timing("traced"): its stubs read CUPTI's record of
    each op's kernels; on a backed-up stream an event pair brackets the kernel alone."""
    traced_profile()  # fails the test where there is no CUPTI tracer
    a, b = big_matmul_inputs(4096)
    for _ in range(3):
        a @ b
    torch.brick.synchronize()
    device_us = {}
    for timing in ("events", "traced"):
        bp.set_device_timing(timing)
        try:
            with torch.autograd.profiler.profile(use_device="brick") as prof:
                for _ in range(20):
                    a @ b
        finally:
            bp.set_device_timing("events")
        row = next(e for e in prof.key_averages() if e.key == "aten::mm")
        assert row.count == 20
        device_us[timing] = row.device_time_total / row.count
    assert bp.health()["stub_failures"] == 0, bp.health()
    assert abs(device_us["traced"] - device_us["events"]) <= 0.05 * device_us["events"], device_us


def test_deferred_mode_measures_launch_cost_only():
    a, b = big_matmul_inputs(4096)
    torch.brick.synchronize()
    with bp.profile(sync_mode="deferred") as deferred:
        for _ in range(20):
            a @ b
    with bp.profile(sync_mode="event") as event:
        for _ in range(20):
            a @ b
    assert deferred.report.brick("aten::mm").avg_us() < 0.5 * event.report.brick("aten::mm").avg_us()


def test_cuda_graph_capture_skips_bricks_and_says_so():
    side = torch.brick.Stream()
    cuda_side = torch_brickdev.backing_stream(side)
    x = torch.ones(1024, device="brick")
    torch.brick.synchronize()
    graph = torch.cuda.CUDAGraph()
    before = bp.health()["capture_skipped"]
    with bp.profile(sync_mode="event") as session:
        with torch.brick.stream(side):
            with torch.cuda.graph(graph, stream=cuda_side):
                y = x * 2 + 1
        skipped = bp.health()["capture_skipped"] - before
    assert skipped > 0
    assert session.report is not None
    graph.replay()
    torch.brick.synchronize()
    assert torch.equal(y.cpu(), torch.full((1024,), 3.0))


def test_legacy_profiler_shows_brick_device_time_of_cuda_kernels():
    a, b = big_matmul_inputs(2048)
    torch.brick.synchronize()
    with torch.autograd.profiler.profile(use_device="brick") as prof:
        for _ in range(5):
            a @ b
    rows = {e.key: e for e in prof.key_averages()}
    assert rows["aten::mm"].count == 5
    assert rows["aten::mm"].self_device_time_total > 0


def test_demo_decode_satisfies_the_contract_on_cuda(tmp_path):
    from torch_brickdev.tools import contract, demo

    # Sized as a GPU decode (Llama-3-8B's widths, 2 layers, float32): the ordering check compares
    # a vocab GEMV with a six-kernel RmsNorm, and on an H200 the CPU-sized demo's LmHead (512 x
    # 32000) is a 16 µs GEMV, well under ten launch-bound RmsNorms; this one reads 2.1 GB.
    # Event mode: the contract's device-time mode (the target). Immediate mode misses the
    # ordering ratio on a GPU (H200: LmHead 603 µs, RmsNorm 108 µs, 5.6x): it synchronizes the
    # device at every nested op's start and end, and RmsNorm's fused kernel sits under three
    # bricks (the range, aten::rms_norm, aten::_fused_rms_norm), six synchronizes in its time.
    config = demo.DecodeConfig(hidden=4096, heads=32, kv_heads=8, vocab=128256, tokens=16)
    for mode in ("event",):
        result = demo.run_demo(config, device="brick:0", sync_mode=mode, runs=2,
                               out_dir=tmp_path / mode, progress=False)
        report = torch_brickdev.profiler.load_report(tmp_path / mode / "report.json")
        failed = [r for r in contract.run_checks(report) if not r.passed]
        assert not failed, (mode, [str(r) for r in failed], result)


@pytest.mark.parametrize("head_dim", [64, 40])  # 40: CUDA's flash path pads it to 48
def test_sdpa_takes_cudas_kernel_and_matches_plain_cuda(head_dim, tmp_path):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 128, head_dim, device="cuda", dtype=torch.float16)
               for _ in range(3))
    # The plain-cuda reference (forward and backward) runs in a process without brick: once a
    # PrivateUse1 backend is registered, PyTorch (2.8+) takes it for the accelerator and a CUDA
    # backward trips "opt_ready_stream && opt_parent_stream" in its autograd engine
    # (pytorch/pytorch#161129). Brick's own backward is unaffected: its nodes are on brick.
    inputs, expected = tmp_path / "qkv.pt", tmp_path / "expected.pt"
    torch.save([t.cpu() for t in (q, k, v)], inputs)
    reference = f"""
import torch
q, k, v = (t.cuda().requires_grad_() for t in torch.load({str(inputs)!r}))
out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
out.sum().backward()
torch.save([out.detach().cpu()] + [t.grad.cpu() for t in (q, k, v)], {str(expected)!r})
"""
    run_python("-c", reference, capture_output=False, check=True, env=no_autoload_env())
    out, *expected_grads = (t.to("cuda") for t in torch.load(expected))
    bq, bk, bv = (t.to("brick").requires_grad_() for t in (q, k, v))
    brick_out = torch.nn.functional.scaled_dot_product_attention(bq, bk, bv, is_causal=True)
    brick_out.sum().backward()
    torch.testing.assert_close(brick_out.to("cuda"), out, rtol=0, atol=0)
    for got, want in zip((bq.grad, bk.grad, bv.grad), expected_grads):
        torch.testing.assert_close(got.to("cuda"), want, rtol=1e-3, atol=1e-3)


def test_rms_norm_is_cudas_fused_kernel_and_matches_plain_cuda(tmp_path):
    """F.rms_norm on CUDA is one fused kernel (aten::_fused_rms_norm), forward and backward; on
    CUDA-backed brick too, bit-equal to plain cuda (reference in a process without brick, see
    the SDPA test), and the profiler sees one brick op with one kernel under it."""
    torch.manual_seed(0)
    x, w = torch.randn(4, 33, 4096), torch.randn(4096)
    inputs, expected = tmp_path / "xw.pt", tmp_path / "expected.pt"
    torch.save([x, w], inputs)
    reference = f"""
import torch
x, w = (t.cuda().requires_grad_() for t in torch.load({str(inputs)!r}))
out = torch.nn.functional.rms_norm(x, (4096,), w, 1e-6)
out.sum().backward()
torch.save([out.detach().cpu(), x.grad.cpu(), w.grad.cpu()], {str(expected)!r})
"""
    run_python("-c", reference, capture_output=False, check=True, env=no_autoload_env())
    want = torch.load(expected)
    bx, bw = (t.to("brick").requires_grad_() for t in (x, w))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = torch.nn.functional.rms_norm(bx, (4096,), bw, 1e-6)
        torch.brick.synchronize()
    kernels = [e for e in prof.events() if e.device_type != torch.autograd.DeviceType.CPU]
    assert len(kernels) == 1, [e.name for e in kernels]  # one fused kernel, not six
    out.sum().backward()
    for got, exact in zip((out.detach(), bx.grad, bw.grad), want):
        torch.testing.assert_close(got.cpu(), exact, rtol=0, atol=0)


@contextlib.contextmanager
def ieee_float32():
    """Plain cuda runs LSTM/GRU through cuDNN, which uses TF32 for float32 by default
    (torch.backends.cudnn.allow_tf32, ~1e-3 relative error); brick's cells run cuBLAS GEMMs in
    full float32 (torch.backends.cuda.matmul.allow_tf32 is off by default). Like with like:
    both sides in IEEE float32 for the comparison."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@ieee_float32()
def test_lstm_and_gru_match_plain_cuda():
    for cls in (torch.nn.LSTM, torch.nn.GRU):
        torch.manual_seed(0)
        module = cls(16, 32, num_layers=2)
        cuda, brick = module.to("cuda"), cls(16, 32, num_layers=2)
        brick.load_state_dict(cuda.state_dict())
        brick.to("brick")
        x = torch.randn(5, 3, 16, device="cuda")
        torch.testing.assert_close(brick(x.to("brick"))[0].to("cuda"), cuda(x)[0],
                                   rtol=1e-4, atol=1e-5)


def test_a_child_forked_after_cuda_backed_brick_was_used_is_a_bad_fork():
    """As torch.cuda: CUDA cannot be used after fork(). The child knows it (_is_in_bad_fork) and
    every brick op there fails with one clear error, never inside CUDA."""
    import os

    torch.ones(4, device="brick").add_(1)
    torch.brick.synchronize()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's exit handlers
        try:
            outcome = ["bad fork" if torch.brick._is_in_bad_fork() else "not a bad fork"]
            try:
                torch.ones(4, device="brick")
                outcome.append("op ran")
            except RuntimeError as error:
                outcome.append(str(error).splitlines()[0])
            os.write(write, "\n".join(outcome).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        lines = pipe.read().splitlines()
    os.waitpid(pid, 0)
    assert lines[0] == "bad fork", lines
    assert "forked after brick used its cuda runtime" in lines[1] and "'spawn'" in lines[1], lines
    assert not torch.brick._is_in_bad_fork()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_on_brick_casts_as_cuda_autocast(dtype):
    """On CUDA backing brick takes CUDA's autocast policy (softmax, layer_norm, exp in float32;
    matmuls and convolutions in the lower dtype), so results equal torch.autocast("cuda")."""
    torch.manual_seed(0)
    x, w, img, kernel = (torch.randn(8, 32), torch.randn(32, 16), torch.randn(2, 3, 16, 16),
                         torch.randn(4, 3, 3, 3))

    def compute(device):
        with torch.autocast(device.split(":")[0], dtype=dtype):
            a, b = x.to(device), w.to(device)
            h = a @ b
            out = {"mm": h, "softmax": torch.softmax(h, -1), "exp": torch.exp(h.float()),
                   "layer_norm": torch.nn.functional.layer_norm(h, (16,)),
                   "conv": torch.nn.functional.conv2d(img.to(device), kernel.to(device)),
                   "sum": h.sum()}
        return {k: v.to("cpu") for k, v in out.items()}

    got, want = compute("brick"), compute("cuda")
    for name in want:
        assert got[name].dtype == want[name].dtype, (name, got[name].dtype, want[name].dtype)
        torch.testing.assert_close(got[name], want[name], rtol=1e-3, atol=1e-3, msg=name)
