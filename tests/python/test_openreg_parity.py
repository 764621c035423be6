"""Parity with PyTorch's reference PrivateUse1 backend: the behaviours that torch_openreg's test
suite (pytorch/pytorch, test/cpp_extensions/open_registration_extension/torch_openreg/tests/)
checks for ``openreg``, checked here for ``brick``. The tests are this project's own; each asserts
the values a user depends on, where the openreg test often only checks that nothing raised.

Openreg test file -> tests here (names without the ``test_`` prefix; "(spec)": see below):

* test_device.py       -> accelerator_device_count_and_switching,
                          accelerator_device_index_context_restores_even_after_exceptions,
                          invalid_device_index_through_the_accelerator_api,
                          tensors_follow_the_current_device_and_ops_do_not_move_it,
                          concurrent_device_switching_in_threads, device_usable_after_an_op_error,
                          spawned_process_computes_on_brick, forked_child_computes_on_brick;
                          (spec) brick_init_initializes_and_is_idempotent,
                          brick_get_device_name_and_properties,
                          brick_get_device_capability_is_a_major_minor_pair,
                          brick_is_bf16_supported,
                          accelerator_get_device_capability_lists_supported_dtypes
* test_memory.py       -> allocation_shapes_dtypes_formats_and_requires_grad,
                          storage_of_a_brick_tensor, alloc_free_cycles_return_memory_to_baseline,
                          devices_have_disjoint_memory, shallow_copy_between_cpu_and_brick;
                          (spec) pin_memory_pins_tensors_and_their_views,
                          dataloader_pin_memory_feeds_brick[main_process|two_workers],
                          brick_mem_get_info_and_memory_reserved,
                          brick_empty_cache_keeps_live_tensors_and_their_counts,
                          brick_memory_summary_and_snapshot,
                          accelerator_memory_allocated_tracks_brick_allocations,
                          accelerator_peak_and_reset_peak_memory_stats,
                          accelerator_memory_stats_and_empty_cache,
                          accelerator_memory_reserved_and_memory_info
* test_storage.py      -> serialization_location_tags_and_restore_location,
                          save_load_map_location_between_brick_devices,
                          legacy_numpy_rebuild_lands_on_brick, storage_free_serialization_path;
                          (spec) rewrapped_pinned_storage_is_pinned
* test_misc.py         -> backend_name_and_rename, device_module_registration_errors_and_lookup,
                          generated_methods_exist_and_cannot_be_generated_twice,
                          generated_methods_move_tensors_storages_modules_and_packed_sequences,
                          legacy_type_strings, profiler_and_device_type_aliases
* test_utils.py        -> dlpack_round_trip
* test_streams.py      -> stream_creation_and_equality, stream_context_and_accelerator_set_stream,
                          streams_wait_across_devices_and_on_events
* test_event.py        -> event_ids_and_devices, event_timing_needs_enable_timing_and_measures_work,
                          event_reuse_and_interleaved_work,
                          streams_waiting_on_one_event_compute_the_same
* test_ops.py          -> factories_fill_the_right_values,
                          copies_between_devices_dtypes_and_non_blocking, fallback_ops_match_cpu,
                          out_into_strided_views_matches_cpu, view_ops_alias_and_item,
                          set_from_tensor_and_storage, maximum_minimum_and_out; SDPA as below
* test_sdpa.py         -> sdpa_backend_choice_is_the_cpus,
                          sdpa_with_dropout_is_reproducible_under_a_seed;
                          (spec) sdpa_bf16_equals_cpu_flash_kernel[full|causal],
                          sdpa_bf16_backward_equals_cpu_flash_kernel
* test_rnn.py          -> (spec) rnn_modules_match_cpu_forward_and_backward[RNN, LSTM, GRU, ...],
                          rnn_cells_match_cpu_forward_and_backward[RNNCell|LSTMCell|GRUCell],
                          lstm_packed_sequence_matches_cpu
* test_misc.py's module methods, Module.to() in general
                       -> (spec) tied_weights_stay_tied_after_to_brick,
                          tied_weights_train_as_one_parameter_on_brick
* test_rng.py          -> generators_and_seeds
* test_autocast.py     -> tests/python/test_autocast.py (fp16 mm, the unsupported-dtype warning,
                          the fast dtype; brick's policy is the CPU's, checked op by op)
* test_autograd.py     -> autograd_has_one_worker_thread_per_device
* test_profiler.py     -> legacy_profiler_records_ranges_forward_and_backward;
                          (spec) profiler_subpackage_is_reachable_from_the_package
* test_compile.py      -> compile_aot_eager_matches_eager_with_autograd_and_modules,
                          compile_guards_recompile_on_shape_change, fake_tensor_mode_keeps_brick
* test_device_type.py  -> to_same_device_aliases_and_copy_true_copies, dtype_propagation

Openreg behaviours that do NOT apply to brick are listed in ``NOT_APPLICABLE`` below, each with
the reason.

"(spec)": behaviours implemented in brick's C++/Python alongside this file (the RNN family,
SDPA equal to the CPU's flash kernel, tied weights after ``.to("brick")``, ``torch.accelerator``'s
memory functions and ``get_device_capability``, ``torch.brick``'s ``init``/device-query/memory
functions with ``torch.cuda`` semantics, pinned memory, ``torch_brickdev.profiler`` reachable
after ``import torch_brickdev``). They are never skipped: they are the specification, and fail
until the implementation lands.
"""

import copy
import gc
import io
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import unittest.mock
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_brickdev

NOT_APPLICABLE = {
    # --- not yet ------------------------------------------------------------------------------
    # --- openreg-specific ------------------------------------------------------------------------
    "test_ops.py TestAutogradFunction / TestCustomAutogradFunctions, TestSTUBExtended.custom_abs":
        "openreg-specific custom ops (torch.ops.openreg.custom_abs, custom_autograd_fn_*); brick "
        "registers no custom operators",
    "test_ops.py TestStructuredCodegen (how maximum.out/minimum.out are registered)":
        "openreg registers them through torchgen structured kernels; brick runs every op through "
        "its boxed fallback, so only the values apply (maximum_minimum_and_out)",
    "test_ops.py/test_sdpa.py: _fused_sdp_choice == SDPBackend.OVERRIDEABLE and "
    "_scaled_dot_product_fused_attention_overrideable(+_backward)":
        "openreg implements the overrideable SDPA op; brick runs the backing device's kernels, so "
        "its choice is the CPU's (checked) and its result must equal the CPU's flash kernel",
    "test_ops.py TestQuantization / TestQuantizationExtended":
        "quantized tensors: openreg skips its own extended quantization tests and PyTorch 2.13 "
        "deprecates quantized tensor creation; brick registers no Quantized key "
        "(quantize_per_tensor on brick raises NotImplementedError for aten::qscheme)",
    "test_ops.py test_empty with names=[...] (named tensors)":
        "torch.empty(..., names=...) no longer exists in PyTorch 2.13 (TypeError on the CPU too)",
    "test_rng.py test_offset_unsupported (torch.openreg.get_offset/set_offset)":
        "openreg-specific error for functions brick does not have (nor does torch.cuda's module)",
    "test_storage.py/test_compile.py: set_tensor_metadata/get_tensor_metadata/_copy_backend_meta, "
    "metadata through serialization, FakeTensor and FunctionalTensor":
        "openreg's own BackendMeta (its fake memory layout's 'format_number'); brick tensors are "
        "plain strided host tensors and carry no backend metadata",
    "test_memory.py TestMemoryLeaks 'no crash' loops, sleeps":
        "replaced by a value check: brick's allocator counts must return to the baseline",
    "test_device.py test_device_poison_fork (init in a forked child must raise)":
        "opposite by design on the host runtime: it survives fork and the child can compute "
        "(forked_child_computes_on_brick); only CUDA backing refuses a forked child",
    "test_compile.py TestBackendRegistration/TestGraphCapture backend='openreg'":
        "openreg registers a Dynamo backend of its own; brick registers Inductor codegen and a "
        "device interface instead, tested in test_compile.py (here the generic eager/aot_eager "
        "backends are checked)",
    "test_ipc.py (all): sharing device tensors between processes":
        "openreg implements device IPC over its fake shared-memory allocator; brick does not "
        "implement storage sharing (a brick tensor put on a multiprocessing queue fails in the "
        "queue's feeder thread with '_share_fd_: only available on CPU')",
    "test_distributed.py (all)": "openreg's dummy 'occl' process-group backend; brick has none",
    "test_testing.py (all)":
        "tests PyTorch's device-type test framework (bypass_device_restrictions), not a backend",
    "test_opinfo.py (all)":
        "OpInfo runs, noncontiguous samples and out= are covered broadly by test_op_sweep.py",
    "test_device_type.py TestDeviceSpecificSkips / instantiate_device_type_tests":
        "PyTorch's decorator examples; the transfer and dtype behaviours are checked directly",
    "test_profiler.py TestTracerHooks, cpp/test_openreg_tracer.cpp, "
    "cpp/test_openreg_activity_profiler.cpp, cpp/test_openreg_backend_meta.cpp":
        "openreg's own tracer/kineto plugin and BackendMeta in C++; brick's profiling is covered "
        "by test_profiler.py/test_trace.py and its C++ by tests/cpp",
    "test_ops.py test_printing": "covered by test_tensors.py (test_print_shows_values_and_device)",
}

COMMON_DTYPES = {
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
    torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128,
}
MiB = 1024 * 1024


def _close(actual, expected, **kw):
    assert actual.device.type == "brick", actual.device
    torch.testing.assert_close(actual.cpu(), expected, **kw)


@pytest.fixture
def restore_streams():
    """Tests that change current streams put the default streams back on every device."""
    yield
    for index in range(torch.brick.device_count()):
        torch.brick.set_stream(torch.brick.default_stream(index))


# ==== test_device.py ==========================================================================


def test_accelerator_device_count_and_switching():
    assert torch.accelerator.device_count() == 2
    assert torch.accelerator.current_accelerator() == torch.device("brick")
    for index in range(torch.accelerator.device_count()):
        torch.accelerator.set_device_index(index)
        assert torch.accelerator.current_device_index() == index
        assert torch.brick.current_device() == index
        assert torch.randn(2, 3, device="brick").device == torch.device("brick", index)
    torch.accelerator.set_device_index(0)
    assert torch.accelerator.current_device_index() == 0


def test_accelerator_device_index_context_restores_even_after_exceptions():
    with torch.accelerator.device_index(None):
        assert torch.accelerator.current_device_index() == 0
    with pytest.raises(ValueError, match="boom"):
        with torch.accelerator.device_index(1):
            assert torch.randn(2, 2, device="brick").device.index == 1
            raise ValueError("boom")
    assert torch.accelerator.current_device_index() == 0
    with pytest.raises(RuntimeError, match="nested"):
        with torch.accelerator.device_index(1):
            with torch.accelerator.device_index(0):
                assert torch.accelerator.current_device_index() == 0
                raise RuntimeError("nested")
    assert torch.accelerator.current_device_index() == 0


def test_invalid_device_index_through_the_accelerator_api():
    with pytest.raises(RuntimeError, match=r"brick.*out of range"):
        torch.accelerator.set_device_index(2)
    assert torch.accelerator.current_device_index() == 0


def test_tensors_follow_the_current_device_and_ops_do_not_move_it():
    torch.accelerator.set_device_index(1)
    a = torch.randn(5, 5, device="brick")
    b = torch.matmul(a, a)
    s = (a + b).sum()
    assert (a.device.index, b.device.index, s.device.index) == (1, 1, 1)
    torch.testing.assert_close(b.cpu(), a.cpu() @ a.cpu())
    assert torch.accelerator.current_device_index() == 1
    torch.accelerator.set_device_index(0)
    assert torch.randn(1, device="brick").device.index == 0


def test_concurrent_device_switching_in_threads():
    threads, rounds = 4, 20
    barrier = threading.Barrier(threads, timeout=60)

    def work(thread_id):
        index = thread_id % 2
        barrier.wait()
        problems = []
        for i in range(rounds):
            torch.accelerator.set_device_index(index)
            x = torch.full((8, 8), float(i), device="brick")
            y = torch.matmul(x, torch.eye(8, device="brick"))
            total = y.sum()
            if torch.accelerator.current_device_index() != index:
                problems.append(f"thread {thread_id}: current device moved")
            if {x.device.index, y.device.index, total.device.index} != {index}:
                problems.append(f"thread {thread_id}: result on the wrong device")
            if total.item() != 64.0 * i:
                problems.append(f"thread {thread_id}: sum {total.item()} != {64.0 * i}")
        return problems

    pool = ThreadPoolExecutor(max_workers=threads)
    try:
        futures = [pool.submit(work, i) for i in range(threads)]
        problems = [p for f in futures for p in f.result(timeout=120)]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # never wait without a deadline
    assert problems == []
    assert torch.accelerator.current_device_index() == 0  # other threads' devices are their own


def test_device_usable_after_an_op_error():
    x, y = torch.randn(5, 5, device="brick"), torch.randn(3, 3, device="brick")
    with pytest.raises(RuntimeError):
        torch.matmul(x, y)
    assert torch.accelerator.current_device_index() == 0
    z = torch.randn(5, 5, device="brick")
    torch.testing.assert_close(torch.matmul(x, z).cpu(), x.cpu() @ z.cpu())


def _spawned_worker(device_index, results):
    # Runs in a spawned interpreter (module level so that spawn can find it).
    try:
        import torch_brickdev  # noqa: F401

        torch.accelerator.set_device_index(device_index)
        x = torch.arange(16.0, device="brick").view(4, 4)
        y = torch.matmul(x, x)
        results.put(("ok", str(y.device), y.sum().item()))
    except Exception as error:  # pragma: no cover - reported to the parent
        results.put(("error", type(error).__name__, str(error)))


def test_spawned_process_computes_on_brick():
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    process = ctx.Process(target=_spawned_worker, args=(1, results))
    process.start()
    try:
        status = results.get(timeout=180)
    finally:
        process.join(timeout=60)
        if process.is_alive():
            process.kill()
            process.join(timeout=10)
    expected = (torch.arange(16.0).view(4, 4) @ torch.arange(16.0).view(4, 4)).sum().item()
    assert status == ("ok", "brick:1", expected)
    assert process.exitcode == 0


@pytest.mark.skipif(not hasattr(os, "fork") or torch_brickdev.runtime_name() != "host",
                    reason="the host runtime survives fork(); CUDA backing refuses forked children")
def test_forked_child_computes_on_brick():
    torch.brick.synchronize()  # the runtime exists in the parent before the fork
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report and leave without running any Python clean-up
        code = 1
        try:
            os.close(read_end)
            x = torch.arange(4.0, device="brick")
            os.write(write_end, f"{(x * 2).sum().item()} {x.device}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    deadline = time.monotonic() + 120
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung")
        time.sleep(0.02)
    with os.fdopen(read_end) as pipe:
        said = pipe.read()
    assert os.waitstatus_to_exitcode(status) == 0
    assert said == "12.0 brick:0"


# ---- spec: torch.brick.init and the device queries (torch.cuda semantics) ------------------


def test_brick_init_initializes_and_is_idempotent():
    torch.brick.init()
    assert torch.brick.is_initialized()
    torch.brick.init()  # a second call is a no-op, as torch.cuda.init()
    assert torch.brick.is_initialized()
    assert torch.accelerator.device_count() == 2


def test_brick_get_device_name_and_properties():
    for index in range(2):
        name = torch.brick.get_device_name(index)
        assert isinstance(name, str) and name
        assert torch.brick.get_device_name(f"brick:{index}") == name
        assert torch.brick.get_device_name(torch.device("brick", index)) == name
        props = torch.brick.get_device_properties(index)
        assert props.name == name
        assert isinstance(props.total_memory, int) and props.total_memory > 0
        assert torch.brick.get_device_capability(index) == (props.major, props.minor)
    assert torch.brick.get_device_name() == torch.brick.get_device_name(0)
    with torch.brick.device(1):
        assert torch.brick.get_device_name() == torch.brick.get_device_name(1)
    with pytest.raises((RuntimeError, ValueError, IndexError), match="brick"):
        torch.brick.get_device_properties(2)


def test_brick_get_device_capability_is_a_major_minor_pair():
    capability = torch.brick.get_device_capability()
    assert isinstance(capability, tuple) and len(capability) == 2
    assert all(isinstance(part, int) for part in capability)
    assert torch.brick.get_device_capability(1) == capability  # identical virtual devices


def test_brick_is_bf16_supported():
    assert torch.brick.is_bf16_supported() is True
    x = torch.ones(4, dtype=torch.bfloat16, device="brick")
    assert (x + x).dtype == torch.bfloat16


def test_brick_mem_get_info_and_memory_reserved():
    free, total = torch.brick.mem_get_info()
    assert isinstance(free, int) and isinstance(total, int)
    assert 0 < free <= total
    assert total == torch.brick.get_device_properties(0).total_memory
    assert torch.brick.mem_get_info(1)[1] == torch.brick.get_device_properties(1).total_memory
    t = torch.empty(MiB, device="brick")  # 4 MiB
    reserved = torch.brick.memory_reserved()
    assert isinstance(reserved, int)
    assert reserved >= torch.brick.memory_allocated() >= t.nbytes
    assert torch.brick.memory_reserved(1) >= torch.brick.memory_allocated(1)


def test_brick_empty_cache_keeps_live_tensors_and_their_counts():
    keep = torch.arange(1000.0, device="brick")
    freed = torch.empty(MiB, device="brick")
    del freed
    gc.collect()
    allocated = torch.brick.memory_allocated()
    assert torch.brick.empty_cache() is None
    assert torch.brick.memory_allocated() == allocated
    assert torch.brick.memory_reserved() >= allocated
    assert torch.equal(keep.cpu(), torch.arange(1000.0))


def test_brick_memory_summary_and_snapshot():
    t = torch.empty(MiB, device="brick")
    summary = torch.brick.memory_summary()
    assert isinstance(summary, str) and "Allocated memory" in summary
    assert isinstance(torch.brick.memory_summary(1, abbreviated=True), str)
    if torch_brickdev.backing_device_type() == "cpu":
        # The host runtime keeps no block list (no lock on the op path): it says so, and where
        # the figures are, rather than answering with an empty list.
        with pytest.raises(RuntimeError, match=r"memory_snapshot\(\).*memory_stats\(\)"):
            torch.brick.memory_snapshot()
    else:
        snapshot = torch.brick.memory_snapshot()
        assert isinstance(snapshot, list) and snapshot, "a live brick tensor has a segment"
        assert all(isinstance(segment, dict) for segment in snapshot)
    del t


# ---- spec: torch.accelerator for brick --------------------------------------------------------


def test_accelerator_get_device_capability_lists_supported_dtypes():
    capability = torch.accelerator.get_device_capability("brick:0")
    assert isinstance(capability, dict)
    supported = capability["supported_dtypes"]
    assert isinstance(supported, set)
    assert COMMON_DTYPES <= supported, COMMON_DTYPES - supported
    assert torch.accelerator.get_device_capability("brick:1")["supported_dtypes"] == supported
    assert torch.accelerator.get_device_capability()["supported_dtypes"] == supported


def test_accelerator_memory_allocated_tracks_brick_allocations():
    torch.accelerator.synchronize()
    base = torch.accelerator.memory_allocated()
    assert base == torch.brick.memory_allocated()
    t = torch.empty(MiB, device="brick")  # 4 MiB
    assert torch.accelerator.memory_allocated() == base + 4 * MiB
    assert torch.accelerator.memory_allocated("brick:0") == base + 4 * MiB
    base1 = torch.accelerator.memory_allocated(1)
    t1 = torch.empty(256, device="brick:1")
    assert torch.accelerator.memory_allocated(1) == base1 + 1024
    del t, t1
    assert torch.accelerator.memory_allocated() == base


def test_accelerator_peak_and_reset_peak_memory_stats():
    torch.accelerator.reset_peak_memory_stats()
    base = torch.accelerator.memory_allocated()
    assert torch.accelerator.max_memory_allocated() == base
    t = torch.empty(2 * MiB, device="brick")  # 8 MiB
    del t
    assert torch.accelerator.max_memory_allocated() >= base + 8 * MiB
    assert torch.accelerator.max_memory_allocated() == torch.brick.max_memory_allocated()
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == base


def test_accelerator_memory_stats_and_empty_cache():
    t = torch.empty(1024, device="brick")
    stats = torch.accelerator.memory_stats()
    ours = torch.brick.memory_stats()
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                "allocation.all.current"):
        assert stats[key] == ours[key], key
    assert stats["allocated_bytes.all.current"] >= t.nbytes
    allocated = torch.accelerator.memory_allocated()
    torch.accelerator.empty_cache()
    assert torch.accelerator.memory_allocated() == allocated
    assert torch.equal(t.fill_(2).cpu(), torch.full((1024,), 2.0))


def test_accelerator_memory_reserved_and_memory_info():
    # Beyond the brief's list, but the same DeviceAllocator provides them.
    assert torch.accelerator.memory_reserved() >= torch.accelerator.memory_allocated()
    assert torch.accelerator.max_memory_reserved() >= torch.accelerator.memory_reserved()
    free, total = torch.accelerator.get_memory_info()
    assert 0 < free <= total
    assert total == torch.brick.mem_get_info()[1]


# ==== test_memory.py ==========================================================================


def test_allocation_shapes_dtypes_formats_and_requires_grad():
    for shape in ((100,), (10000,), (10, 20, 30), (0, 5)):
        t = torch.empty(shape, device="brick")
        assert t.device.type == "brick" and t.shape == shape
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64):
        t = torch.zeros(100, dtype=dtype, device="brick")
        assert t.dtype == dtype and int(t.sum().item()) == 0
    cl = torch.empty(2, 3, 4, 4, device="brick", memory_format=torch.channels_last)
    assert cl.is_contiguous(memory_format=torch.channels_last) and cl.stride() == (48, 1, 12, 3)
    plain = torch.empty(2, 3, 4, 4, device="brick", memory_format=torch.contiguous_format)
    assert plain.is_contiguous() and plain.stride() == (48, 16, 4, 1)
    big = torch.empty(10 * MiB // 4, device="brick")
    assert big.untyped_storage().nbytes() == 10 * MiB
    g = torch.randn(100, device="brick", requires_grad=True)
    (g * 3).sum().backward()
    assert torch.equal(g.grad.cpu(), torch.full((100,), 3.0))


def test_storage_of_a_brick_tensor():
    x = torch.randn(100, device="brick")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
        storage = x.storage()
        assert storage.device.type == "brick" and storage.is_brick
        assert storage.size() == x.numel()
    y = x.view_as(x)
    assert y.data_ptr() == x.data_ptr()
    x.fill_(5.0)
    assert torch.all(y == 5.0).item()
    r = torch.randn(4, 4).brick()
    assert r.untyped_storage().nbytes() == 64
    r.resize_(2, 2, 2, 2)  # same element count: the storage is kept
    assert r.shape == (2, 2, 2, 2) and r.untyped_storage().nbytes() == 64
    r.resize_(50)  # grows
    assert r.untyped_storage().nbytes() == 200


def test_alloc_free_cycles_return_memory_to_baseline():
    gc.collect()
    base = torch.brick.memory_stats()
    for i in range(200):
        size = (100, 500, 1000, 5000)[i % 4]
        x = torch.randn(size, device="brick", requires_grad=i % 2 == 0)
        views = (x.view(-1, 1), x[: size // 2], x.reshape(1, size))
        copy = x.detach().cpu().to("brick").clone()
        with torch.no_grad():
            y = x.detach().add_(1).mul_(2).div_(2).sub_(1)
        z = x + copy
        del x, views, copy, y, z
    held = [torch.empty(1000, device="brick") for _ in range(100)]
    assert torch.brick.memory_allocated() == base["allocated_bytes.all.current"] + 100 * 4000
    del held
    gc.collect()
    after = torch.brick.memory_stats()
    for key in ("allocated_bytes.all.current", "allocation.all.current",
                "adopted_bytes.all.current"):
        assert after[key] == base[key], key


def test_devices_have_disjoint_memory():
    on0 = [torch.empty(1000, device="brick:0") for _ in range(10)]
    on1 = [torch.empty(1000, device="brick:1") for _ in range(10)]
    assert {t.device.index for t in on0} == {0} and {t.device.index for t in on1} == {1}
    assert not {t.data_ptr() for t in on0} & {t.data_ptr() for t in on1}
    x = torch.randn(100, device="brick:0")
    y = x.to("brick:1")
    assert y.device.index == 1 and y.data_ptr() != x.data_ptr()
    assert torch.equal(y.to("brick:0").cpu(), x.cpu())


def test_shallow_copy_between_cpu_and_brick():
    # `param.data = other` across CPU and brick, as on openreg (the same check decides whether
    # Module.to() keeps Parameter objects, and so tied weights).
    cpu, brick = torch.randn(4, 4), torch.randn(4, 4, device="brick")
    assert torch._has_compatible_shallow_copy_type(cpu, brick)
    cpu.data = brick
    assert cpu.device.type == "brick" and cpu.data_ptr() == brick.data_ptr()
    brick2, cpu2 = torch.randn(4, 4, device="brick"), torch.randn(4, 4)
    assert torch._has_compatible_shallow_copy_type(brick2, cpu2)
    brick2.data = cpu2
    assert brick2.device.type == "cpu" and brick2.data_ptr() == cpu2.data_ptr()


# ---- spec: pinned memory ----------------------------------------------------------------------


def test_pin_memory_pins_tensors_and_their_views():
    plain = torch.randn(20)
    assert not plain.is_pinned()
    pinned = plain.pin_memory()
    assert pinned.is_pinned()
    assert torch.equal(pinned, plain)
    for view in (pinned[2:5], pinned[::2], pinned.view(4, 5)):
        assert view.is_pinned()
    shared = torch.tensor((), dtype=torch.float32).set_(pinned.untyped_storage())
    assert shared.is_pinned()
    storage = torch.randn(10).untyped_storage()
    assert not storage.is_pinned()
    assert storage.pin_memory().is_pinned()
    on_brick = pinned.to("brick", non_blocking=True)
    torch.brick.synchronize()
    assert torch.equal(on_brick.cpu(), plain)


def test_rewrapped_pinned_storage_is_pinned():
    pinned = torch.randn(10).pin_memory()
    rewrapped = torch.tensor((), dtype=torch.float32).set_(
        pinned.untyped_storage()[8:], size=(5,), stride=(1,), storage_offset=0)
    assert rewrapped.is_pinned()
    assert rewrapped.data_ptr() == pinned.data_ptr() + 8
    assert torch.equal(rewrapped, pinned[2:7])


class _Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, index):
        return torch.full((3,), float(index)), torch.tensor(index * index)


@pytest.mark.parametrize("workers", [0, 2], ids=["main_process", "two_workers"])
def test_dataloader_pin_memory_feeds_brick(workers):
    # PyTorch's pin-memory thread calls torch.set_num_threads(1), which also becomes the count
    # of threads started later (brick's autograd thread among them): restored for later tests.
    threads = torch.get_num_threads()
    try:
        extra = dict(num_workers=workers, timeout=60) if workers else {}
        loader = torch.utils.data.DataLoader(_Squares(), batch_size=4, pin_memory=True, **extra)
        seen = []
        for features, targets in loader:
            assert features.is_pinned() and targets.is_pinned()
            fb = features.to("brick", non_blocking=True)
            tb = targets.to("brick", non_blocking=True)
            torch.brick.synchronize()
            assert fb.device.type == "brick"
            seen.append((fb.sum(1) / 3).long().cpu())
            assert torch.equal(tb.cpu(), seen[-1] ** 2)
        assert torch.equal(torch.cat(seen), torch.arange(16))
    finally:
        torch.set_num_threads(threads)


# ==== test_storage.py ========================================================================


def test_serialization_location_tags_and_restore_location():
    assert torch.serialization.location_tag(torch.UntypedStorage(4, device="brick")) == "brick:0"
    assert torch.serialization.location_tag(torch.UntypedStorage(4, device="brick:1")) == "brick:1"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        cpu_storage = torch.arange(16.0).storage()
    for index in (0, 1):
        restored = torch.serialization.default_restore_location(cpu_storage, f"brick:{index}")
        assert restored.is_brick and restored.device.index == index
        assert torch.equal(torch.tensor(restored.tolist()), torch.arange(16.0))


def test_save_load_map_location_between_brick_devices(tmp_path):
    t = torch.randn(3, 3, device="brick:0")
    path = tmp_path / "t.pt"
    torch.save(t, path)
    on1 = torch.load(path, map_location="brick:1")
    assert on1.device == torch.device("brick:1") and torch.equal(on1.cpu(), t.cpu())
    on_cpu = torch.load(path, map_location="cpu")
    assert on_cpu.is_cpu and torch.equal(on_cpu, t.cpu())


def test_legacy_numpy_rebuild_lands_on_brick():
    data = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    rebuilt = torch._utils._rebuild_device_tensor_from_numpy(data, torch.float32, "brick:1", False)
    assert rebuilt.device == torch.device("brick:1")
    assert torch.equal(rebuilt.cpu(), torch.tensor([[1.0, 2, 3], [4, 5, 6]]))


def test_storage_free_serialization_path():
    # The path PyTorch takes for backends without storage: through a CPU copy.
    x = torch.randn(2, 3)
    with unittest.mock.patch.object(torch._C, "_has_storage", return_value=False):
        xb = x.to("brick")
        rebuild = xb._reduce_ex_internal(torch.serialization.DEFAULT_PROTOCOL)[0]
        assert rebuild is torch._utils._rebuild_device_tensor_from_cpu_tensor
        buffer = io.BytesIO()
        torch.save({"x": xb}, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=True)
        buffer.seek(0)
        loaded_cpu = torch.load(buffer, weights_only=True, map_location="cpu")
        with pytest.raises(RuntimeError,
                           match="Cannot serialize tensors on backends with no storage"):
            with torch.serialization.skip_data():
                torch.save({"x": xb}, io.BytesIO())
    assert loaded["x"].device.type == "brick" and torch.equal(loaded["x"].cpu(), x)
    assert loaded_cpu["x"].is_cpu and torch.equal(loaded_cpu["x"], x)


# ==== test_misc.py ===========================================================================


def test_backend_name_and_rename():
    assert torch._C._get_privateuse1_backend_name() == "brick"
    torch.utils.rename_privateuse1_backend("brick")  # the same name again is fine
    with pytest.raises(RuntimeError, match="has already been set"):
        torch.utils.rename_privateuse1_backend("dev")
    assert torch._C._get_privateuse1_backend_name() == "brick"


def test_device_module_registration_errors_and_lookup():
    import types

    with pytest.raises(RuntimeError, match="Expected one of cpu"):
        torch._register_device_module("dev", types.ModuleType("fake"))
    with pytest.raises(RuntimeError, match="The runtime module of"):
        torch._register_device_module("brick", types.ModuleType("fake"))
    assert torch.brick is torch_brickdev.brick
    get = torch.utils.backend_registration._get_custom_mod_func
    with pytest.raises(RuntimeError, match=r"Try to call torch\.brick\.func_name_"):
        get("func_name_")
    assert get("device_count")() == 2


def test_generated_methods_exist_and_cannot_be_generated_twice():
    with pytest.raises(RuntimeError, match="The custom device module of"):
        torch.utils.generate_methods_for_privateuse1_backend()
    for cls in (torch.Tensor, torch.TypedStorage, torch.UntypedStorage,
                torch.nn.utils.rnn.PackedSequence):
        assert hasattr(cls, "is_brick") and hasattr(cls, "brick"), cls
    assert hasattr(torch.nn.Module, "brick")


def test_generated_methods_move_tensors_storages_modules_and_packed_sequences():
    x = torch.arange(16.0).view(4, 4)
    assert not x.is_brick
    for arg, index in ((torch.device("brick"), 0), (torch.device("brick:0"), 0), (0, 0), (1, 1)):
        y = x.brick(arg)
        assert y.is_brick and y.device.index == index and torch.equal(y.cpu(), x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        typed = x.storage()
        assert not typed.is_brick and typed.brick().is_brick
    untyped = x.untyped_storage()
    assert not untyped.is_brick and untyped.brick().is_brick

    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.Parameter(torch.randn(3, 3))
            self.register_buffer("b", torch.ones(2))

    m = Holder()
    assert m.p.device.type == "cpu"
    m.brick()
    assert m.p.is_brick and m.b.is_brick and isinstance(m.p, nn.Parameter)
    packed = nn.utils.rnn.PackedSequence(torch.rand(5, 3), torch.tensor([1, 1, 1, 1, 1]))
    assert not packed.is_brick
    moved = packed.brick()
    assert moved.is_brick and moved.data.is_brick
    assert torch.equal(moved.data.cpu(), packed.data)
    assert moved.batch_sizes.device.type == "cpu"  # batch sizes always stay on the CPU


def test_legacy_type_strings(monkeypatch):
    names = {
        torch.bool: "BoolTensor", torch.double: "DoubleTensor", torch.float32: "FloatTensor",
        torch.half: "HalfTensor", torch.int32: "IntTensor", torch.int64: "LongTensor",
        torch.int8: "CharTensor", torch.short: "ShortTensor", torch.uint8: "ByteTensor",
    }
    for dtype, name in names.items():
        assert torch.empty(4, 4, dtype=dtype, device="brick").type() == f"torch.brick.{name}"
    cpu = torch.randn(8)
    assert cpu.type() == "torch.FloatTensor"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        assert cpu.storage().type() == "torch.FloatStorage"
        storage = cpu.brick().storage()
        assert storage.type() == "torch.storage.TypedStorage"

        class CustomFloatStorage:
            __module__ = "torch.brick"
            __name__ = "FloatStorage"

        monkeypatch.setattr(torch.brick, "FloatStorage", CustomFloatStorage(), raising=False)
        assert storage.type() == "torch.brick.FloatStorage"
        assert cpu.int().brick().storage().type() == "torch.storage.TypedStorage"


def test_profiler_and_device_type_aliases():
    from torch._C._autograd import DeviceType
    from torch._C._profiler import ProfilerActivity

    assert ProfilerActivity.BRICK == ProfilerActivity.PrivateUse1
    assert ProfilerActivity.BRICK.name == "BRICK"
    assert str(ProfilerActivity.BRICK) == "ProfilerActivity.BRICK"
    assert DeviceType.BRICK == DeviceType.PrivateUse1
    assert DeviceType.BRICK.name == "BRICK" and str(DeviceType.BRICK) == "DeviceType.BRICK"


# ==== test_utils.py ==========================================================================


def test_dlpack_round_trip():
    x = torch.randn(2, 3).to("brick:1")
    y = torch.from_dlpack(torch.utils.dlpack.to_dlpack(x))
    assert y.device == x.device
    assert y.data_ptr() == x.data_ptr()  # zero copy
    assert torch.equal(y.cpu(), x.cpu())


# ==== test_streams.py ========================================================================


def test_stream_creation_and_equality():
    s = torch.Stream(device="brick")  # the current device
    assert s.device == torch.device("brick:0") and s.device_index == torch.brick.current_device()
    s1 = torch.Stream(device="brick:1")
    assert s1.device == torch.device("brick:1")
    by_index = torch.Stream(1)  # a bare index means the current accelerator
    assert by_index.device == torch.device("brick:1")
    rebuilt = torch.Stream(stream_id=by_index.stream_id, device_type=by_index.device_type,
                           device_index=by_index.device_index)
    assert rebuilt == by_index
    assert "torch.Stream device_type=brick, device_index=1" in repr(s1)
    assert s1.query() is True
    s1.record_event()
    s1.synchronize()
    assert s1.query() is True


def test_stream_context_and_accelerator_set_stream(restore_streams):
    with torch.Stream(device="brick:1") as s:
        assert torch.accelerator.current_stream() == s
        assert torch.accelerator.current_device_index() == 1
    assert torch.accelerator.current_device_index() == 0
    assert torch.accelerator.current_stream() == torch.brick.default_stream(0)
    s0a, s0b = torch.Stream(device="brick:0"), torch.Stream(device="brick:0")
    torch.accelerator.set_stream(s0a)
    assert torch.accelerator.current_stream().stream_id == s0a.stream_id
    torch.accelerator.set_stream(s0b)
    assert torch.accelerator.current_stream() == s0b
    s1 = torch.Stream(device="brick:1")
    torch.accelerator.set_stream(s1)  # as on CUDA, this also makes brick:1 current
    assert torch.accelerator.current_stream() == s1
    assert torch.accelerator.current_device_index() == 1


def test_streams_wait_across_devices_and_on_events():
    s0, s1 = torch.Stream(device="brick:0"), torch.Stream(device="brick:1")
    x = torch.arange(6.0, device="brick:0")
    with s0:
        y = x * 2
    s1.wait_stream(s0)
    e = s0.record_event()
    s_other = torch.Stream(device="brick")
    s_other.wait_event(e)
    with s1:
        z = y.to("brick:1") + 1
    s1.synchronize()
    assert torch.equal(z.cpu(), torch.arange(6.0) * 2 + 1)
    assert e.query()


# ==== test_event.py =========================================================================


def test_event_ids_and_devices():
    fresh = torch.Event(device="brick:1")
    assert fresh.device.type == "brick" and fresh.device.index is None
    assert fresh.event_id == 0 and fresh.query()
    assert torch.Event().device.type == "brick"  # the current accelerator by default
    s1 = torch.Stream(device="brick:1")
    a, b = s1.record_event(), s1.record_event()
    assert a.device == torch.device("brick:1")
    assert a.event_id != 0 and b.event_id != 0 and a.event_id != b.event_id
    e0 = torch.Event(device="brick:0")
    e0.record(torch.Stream(device="brick:0"))
    assert e0.device.index == 0 and e0.event_id != 0
    e0.synchronize()
    assert e0.query()


def test_event_timing_needs_enable_timing_and_measures_work():
    s = torch.Stream(device="brick:1")
    plain = [torch.Event(device="brick:1") for _ in range(2)]
    for e in plain:
        e.record(s)
    s.synchronize()
    with pytest.raises(ValueError,
                       match="Both events must be created with argument 'enable_timing=True'"):
        plain[0].elapsed_time(plain[1])
    start, end = (torch.Event(device="brick", enable_timing=True) for _ in range(2))
    a = torch.randn(256, 256, device="brick")
    start.record()
    for _ in range(5):
        a = (a @ a).clamp_(-1, 1)
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) > 0


def test_event_reuse_and_interleaved_work():
    s = torch.Stream(device="brick:0")
    e = torch.Event(device="brick:0")
    e.record(s)
    s.synchronize()
    assert e.query() and e.event_id != 0
    e.record(s)  # reuse after synchronizing
    s.synchronize()
    assert e.query() and e.event_id != 0
    x, y = torch.randn(50, 50, device="brick"), torch.randn(50, 50, device="brick")
    e1 = s.record_event()
    z1 = x @ y
    e2 = s.record_event()
    z2 = z1 @ x
    s.synchronize()
    assert e1.query() and e2.query() and e1.event_id != e2.event_id
    torch.testing.assert_close(z2.cpu(), (x.cpu() @ y.cpu()) @ x.cpu())


def test_streams_waiting_on_one_event_compute_the_same():
    s1, s2, s3 = (torch.Stream(device="brick:0") for _ in range(3))
    assert len({s1.stream_id, s2.stream_id, s3.stream_id}) == 3
    x, y = torch.randn(30, 30, device="brick"), torch.randn(30, 30, device="brick")
    e = s1.record_event()
    s2.wait_event(e)
    s3.wait_event(e)
    with s2:
        z2 = x @ y
    with s3:
        z3 = x @ y
    torch.accelerator.synchronize()
    assert e.query()
    assert torch.equal(z2.cpu(), z3.cpu())
    torch.testing.assert_close(z2.cpu(), x.cpu() @ y.cpu())


# ==== test_ops.py / test_device_type.py =====================================================


def test_factories_fill_the_right_values():
    assert torch.zeros(3, device="brick").cpu().tolist() == [0.0, 0.0, 0.0]
    assert torch.tensor((), device="brick").shape == (0,)
    assert torch.equal(torch.ones(3, 4, device="brick").cpu(), torch.ones(3, 4))
    like = torch.ones_like(torch.randn(3, 4, device="brick:1"))
    assert like.device == torch.device("brick:1") and torch.equal(like.cpu(), torch.ones(3, 4))
    assert torch.equal(torch.full((3, 4), 5.0, device="brick").cpu(), torch.full((3, 4), 5.0))
    strided = torch.empty_strided((3, 4), (4, 1), device="brick")
    assert strided.shape == (3, 4) and strided.stride() == (4, 1)
    torch.manual_seed(5)
    r = torch.randn(3, 4, device="brick")
    torch.manual_seed(5)
    assert torch.equal(r.cpu(), torch.randn(3, 4))
    assert torch.equal(torch.triu_indices(3, 3, device="brick").cpu(),
                       torch.tensor([[0, 0, 0, 1, 1, 2], [0, 1, 2, 1, 2, 2]]))


def test_copies_between_devices_dtypes_and_non_blocking():
    a = torch.rand(10)
    assert torch.equal(a.to("brick").add(2).to("cpu"), a + 2)
    assert torch.equal(torch.ones(10, device="brick:0").to("brick:1").cpu(), torch.ones(10))
    x = torch.randn(3, 4, device="brick")
    y = torch.empty(3, 4, dtype=torch.float64, device="brick")
    y.copy_(x)
    assert y.dtype == torch.float64 and torch.equal(y.cpu(), x.cpu().double())
    c = x.clone()
    assert c.data_ptr() != x.data_ptr() and torch.equal(c.cpu(), x.cpu())
    nb = torch.empty(3, 4, device="brick")
    nb.copy_(x, non_blocking=True)
    torch.brick.synchronize()
    assert torch.equal(nb.cpu(), x.cpu())
    host = torch.randn(3, 4)
    dev = torch.empty(3, 4, device="brick")
    dev.copy_(host)
    back = torch.empty(3, 4)
    back.copy_(dev)
    assert torch.equal(back, host)


def test_to_same_device_aliases_and_copy_true_copies():
    x = torch.randn(3, 4, device="brick")
    assert x.to(device="brick") is x
    assert x.to("brick:0").data_ptr() == x.data_ptr()
    z = x.to(device="brick", copy=True)
    assert z.data_ptr() != x.data_ptr() and torch.equal(z.cpu(), x.cpu())


def test_dtype_propagation():
    x = torch.randn(3, 4, device="brick")
    assert (x + x).dtype == torch.float32
    d = torch.randn(3, 4, device="brick", dtype=torch.float64)
    assert (d * 2).dtype == torch.float64
    z = x.to(dtype=torch.float64)
    assert z.dtype == torch.float64 and z.device.type == "brick"
    assert torch.equal(z.cpu(), x.cpu().double())
    i = torch.randint(0, 100, (3, 4), device="brick")
    assert i.dtype == torch.int64 and 0 <= int(i.min()) and int(i.max()) < 100
    b = torch.zeros(3, 4, device="brick", dtype=torch.bool)
    assert b.dtype == torch.bool and bool(torch.all(~b))


def test_fallback_ops_match_cpu():
    t = torch.randn(10)
    tb = t.to("brick")
    assert torch.equal(torch.masked_select(tb, tb.gt(0)).cpu(), t.masked_select(t.gt(0)))
    x = torch.tensor([[1.0, 2, 3], [2, 3, 4]], device="brick")
    y = torch.tensor([1.0, 0, 2], device="brick")
    assert torch.equal(torch.sub(x, y).cpu(), torch.tensor([[0.0, 2, 1], [1, 3, 2]]))
    idx = torch.tensor([1, 0], device="brick")
    assert torch.equal(x[idx, idx].cpu(), torch.tensor([3.0, 1.0]))
    v = torch.tensor([1.0, 2, 3], device="brick")
    out = torch._foreach_add((v, v), (v, v))
    assert all(o.device.type == "brick" and torch.equal(o.cpu(), torch.tensor([2.0, 4, 6]))
               for o in out)
    s = torch.randn(3, 4, device="brick")
    _close(s + 1.0, s.cpu() + 1.0)
    _close(s * 2.0, s.cpu() * 2.0)
    _close(torch.abs(s.t()), torch.abs(s.cpu().t()))


def test_out_into_strided_views_matches_cpu():
    # out= views of a larger tensor: one the kernel writes in place, one it must resize/copy.
    x = torch.randn(2, 2, 3)
    o = torch.randn(2, 2, 6)
    xb, ob = x.to("brick"), o.to("brick")
    torch.abs(x, out=o[:, :, 0:6:2])
    torch.abs(xb, out=ob[:, :, 0:6:2])
    assert torch.equal(ob.cpu(), o)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "An output with one or more elements was resized")
        torch.abs(x, out=o[:, :, 0:6:3])
        torch.abs(xb, out=ob[:, :, 0:6:3])
    assert torch.equal(ob.cpu(), o)
    out = torch.empty_like(xb)
    ptr = out.data_ptr()
    assert torch.abs(xb, out=out) is out and out.data_ptr() == ptr
    assert torch.equal(out.cpu(), x.abs())


def test_view_ops_alias_and_item():
    x = torch.tensor([[1], [2], [3]], device="brick")
    e = x.expand(3, 2)
    assert e.data_ptr() == x.data_ptr()
    assert torch.equal(e.cpu(), torch.tensor([[1, 1], [2, 2], [3, 3]]))
    r = torch.randn(2, 3, 4, device="brick")
    assert r.view(6, 4).data_ptr() == r.data_ptr()
    assert torch.equal(r.reshape(6, 4).cpu(), r.cpu().reshape(6, 4))
    a = torch.arange(12.0, device="brick").view(3, 4)
    strided = torch.as_strided(a, (2, 2), (4, 1), 1)
    assert strided.data_ptr() == a.data_ptr() + 4
    assert torch.equal(strided.cpu(), torch.tensor([[1.0, 2], [5, 6]]))
    assert torch.tensor([5.0], device="brick").item() == 5.0


def test_set_from_tensor_and_storage():
    x = torch.randn(3, 4, device="brick")
    y = torch.empty(3, 4, device="brick").set_(x)
    assert y.data_ptr() == x.data_ptr() and torch.equal(y.cpu(), x.cpu())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        z = torch.empty(3, 4, device="brick")
        z.set_(x.storage(), 0, z.size())
    assert torch.equal(z.cpu(), x.cpu())


def test_maximum_minimum_and_out():
    x = torch.tensor([1.0, 5.0, 3.0], device="brick")
    y = torch.tensor([4.0, 2.0, 6.0], device="brick")
    assert torch.maximum(x, y).cpu().tolist() == [4.0, 5.0, 6.0]
    assert torch.minimum(x, y).cpu().tolist() == [1.0, 2.0, 3.0]
    out = torch.empty(3, device="brick")
    assert torch.maximum(x, y, out=out) is out and out.cpu().tolist() == [4.0, 5.0, 6.0]
    assert torch.minimum(x, y, out=out) is out and out.cpu().tolist() == [1.0, 2.0, 3.0]


# ---- spec: SDPA equal to the CPU's flash kernel --------------------------------------------


def _qkv(dtype=torch.bfloat16, shape=(2, 4, 64, 32), seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=g, dtype=dtype) for _ in range(3))


def _cpu_flash(q, k, v, **kw):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, **kw)


def test_sdpa_backend_choice_is_the_cpus():
    q, k, v = _qkv()
    qb, kb, vb = (t.to("brick") for t in (q, k, v))
    assert torch._fused_sdp_choice(qb, kb, vb) == torch._fused_sdp_choice(q, k, v)
    mask = torch.rand(2, 4, 64, 64, dtype=torch.bfloat16)
    assert (torch._fused_sdp_choice(qb, kb, vb, mask.to("brick"))
            == torch._fused_sdp_choice(q, k, v, mask))


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_sdpa_bf16_equals_cpu_flash_kernel(is_causal):
    q, k, v = _qkv()
    expected = _cpu_flash(q, k, v, is_causal=is_causal)
    out = F.scaled_dot_product_attention(q.to("brick"), k.to("brick"), v.to("brick"),
                                         is_causal=is_causal)
    assert out.device.type == "brick" and out.dtype == torch.bfloat16
    diff = (out.cpu().float() - expected.float()).abs().max().item()
    assert torch.equal(out.cpu(), expected), f"max difference {diff}"


def test_sdpa_bf16_backward_equals_cpu_flash_kernel():
    q, k, v = _qkv(seed=1)
    leaves_cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = _cpu_flash(*leaves_cpu, is_causal=True)
    expected.backward(torch.ones_like(expected))
    leaves = [t.to("brick").requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=True)
    out.backward(torch.ones_like(out))
    assert torch.equal(out.detach().cpu(), expected.detach())
    for name, ours, theirs in zip("qkv", leaves, leaves_cpu):
        assert torch.equal(ours.grad.cpu(), theirs.grad), name


def test_sdpa_with_dropout_is_reproducible_under_a_seed():
    q, k, v = (t.to("brick") for t in _qkv(dtype=torch.float32, shape=(2, 2, 16, 8)))
    torch.manual_seed(3)
    a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(3)
    b = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert a.device.type == "brick" and a.shape == (2, 2, 16, 8)
    assert torch.equal(a.cpu(), b.cpu())
    assert not torch.equal(a.cpu(), F.scaled_dot_product_attention(q, k, v).cpu())


# ==== test_rnn.py (spec: the RNN family on brick equals the CPU) =============================

RNN_MODULES = {
    "RNN": (nn.RNN, dict(num_layers=2, nonlinearity="tanh")),
    "LSTM": (nn.LSTM, dict(num_layers=2)),
    "LSTM_bidirectional": (nn.LSTM, dict(num_layers=2, bidirectional=True)),
    "LSTM_batch_first": (nn.LSTM, dict(batch_first=True)),
    "LSTM_proj": (nn.LSTM, dict(proj_size=3)),  # the CPU warns it cannot use oneDNN here
    "GRU": (nn.GRU, dict(num_layers=2)),
    "GRU_bidirectional_batch_first": (nn.GRU, dict(bidirectional=True, batch_first=True)),
}


def _pair(module_cpu):
    """An independent copy of the module on brick, with the same parameters."""
    return copy.deepcopy(module_cpu).to("brick")


def _assert_same_results(outs_cpu, outs_brick):
    flat_cpu, flat_brick = list(_flatten(outs_cpu)), list(_flatten(outs_brick))
    assert len(flat_cpu) == len(flat_brick)
    for expected, actual in zip(flat_cpu, flat_brick):
        assert actual.device.type == "brick"
        torch.testing.assert_close(actual.detach().cpu(), expected.detach())


def _flatten(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, nn.utils.rnn.PackedSequence):
        yield value.data
    else:
        for item in value:
            yield from _flatten(item)


def _assert_same_grads(module_cpu, module_brick):
    for (name, p_cpu), (_, p_brick) in zip(module_cpu.named_parameters(),
                                           module_brick.named_parameters()):
        assert p_brick.grad is not None and p_brick.grad.device.type == "brick", name
        torch.testing.assert_close(p_brick.grad.cpu(), p_cpu.grad, msg=name)


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
@pytest.mark.parametrize("name", RNN_MODULES, ids=list(RNN_MODULES))
def test_rnn_modules_match_cpu_forward_and_backward(name):
    cls, extra = RNN_MODULES[name]
    torch.manual_seed(0)
    module_cpu = cls(input_size=5, hidden_size=6, **extra)
    module_brick = _pair(module_cpu)
    batch_first = extra.get("batch_first", False)
    x = torch.randn((3, 4, 5) if batch_first else (4, 3, 5))
    layers = extra.get("num_layers", 1) * (2 if extra.get("bidirectional") else 1)
    out_size = extra.get("proj_size", 0) or 6
    h0 = torch.randn(layers, 3, out_size)
    state = (h0, torch.randn(layers, 3, 6)) if cls is nn.LSTM else h0
    x_cpu = x.clone().requires_grad_()
    x_brick = x.to("brick").requires_grad_()
    state_brick = tuple(s.to("brick") for s in state) if cls is nn.LSTM else state.to("brick")
    outs_cpu = module_cpu(x_cpu, state)
    outs_brick = module_brick(x_brick, state_brick)
    _assert_same_results(outs_cpu, outs_brick)
    loss_cpu = sum(t.pow(2).sum() for t in _flatten(outs_cpu))
    loss_brick = sum(t.pow(2).sum() for t in _flatten(outs_brick))
    loss_cpu.backward()
    loss_brick.backward()
    torch.testing.assert_close(x_brick.grad.cpu(), x_cpu.grad)
    _assert_same_grads(module_cpu, module_brick)
    # without an initial state too
    _assert_same_results(module_cpu(x), module_brick(x.to("brick")))


@pytest.mark.parametrize("cls", [nn.RNNCell, nn.LSTMCell, nn.GRUCell],
                         ids=["RNNCell", "LSTMCell", "GRUCell"])
def test_rnn_cells_match_cpu_forward_and_backward(cls):
    torch.manual_seed(1)
    cell_cpu = cls(5, 6)
    cell_brick = _pair(cell_cpu)
    x = torch.randn(3, 5)
    h = torch.randn(3, 6)
    state = (h, torch.randn(3, 6)) if cls is nn.LSTMCell else h
    state_brick = tuple(s.to("brick") for s in state) if cls is nn.LSTMCell else h.to("brick")
    x_cpu, x_brick = x.clone().requires_grad_(), x.to("brick").requires_grad_()
    out_cpu, out_brick = cell_cpu(x_cpu, state), cell_brick(x_brick, state_brick)
    _assert_same_results(out_cpu, out_brick)
    sum(t.sum() for t in _flatten(out_cpu)).backward()
    sum(t.sum() for t in _flatten(out_brick)).backward()
    torch.testing.assert_close(x_brick.grad.cpu(), x_cpu.grad)
    _assert_same_grads(cell_cpu, cell_brick)
    _assert_same_results(cell_cpu(x), cell_brick(x.to("brick")))  # zero initial state


def test_lstm_packed_sequence_matches_cpu():
    torch.manual_seed(2)
    lstm_cpu = nn.LSTM(input_size=5, hidden_size=6)
    lstm_brick = _pair(lstm_cpu)
    sequences = [torch.randn(5, 5), torch.randn(3, 5), torch.randn(1, 5)]
    packed = nn.utils.rnn.pack_sequence(sequences, enforce_sorted=True)
    out_cpu, (h_cpu, c_cpu) = lstm_cpu(packed)
    out_brick, (h_brick, c_brick) = lstm_brick(packed.to("brick"))
    assert out_brick.data.device.type == "brick"
    assert torch.equal(out_brick.batch_sizes, out_cpu.batch_sizes)
    _assert_same_results((out_cpu.data, h_cpu, c_cpu), (out_brick.data, h_brick, c_brick))


# ==== tied weights (spec) ===================================================================


class _TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(self.embed(tokens))


def test_tied_weights_stay_tied_after_to_brick():
    model = _TiedLM()
    weight = model.embed.weight
    model.to("brick")
    assert model.embed.weight.device.type == "brick"
    assert model.head.weight is model.embed.weight
    assert model.embed.weight is weight  # Module.to() keeps the Parameter objects, as on CPU/CUDA
    assert len(list(model.parameters())) == 1
    state = model.state_dict()
    assert state["embed.weight"].data_ptr() == state["head.weight"].data_ptr()


def test_tied_weights_train_as_one_parameter_on_brick():
    torch.manual_seed(0)
    cpu_model = _TiedLM()
    brick_model = _TiedLM()
    brick_model.load_state_dict(cpu_model.state_dict())
    brick_optimizer = torch.optim.SGD(brick_model.parameters(), lr=0.1)
    brick_model.to("brick")  # after the optimizer was made: it must still hold the parameter
    tokens = torch.tensor([[1, 2, 3], [4, 5, 6]])
    for model, device, optimizer in (
        (cpu_model, "cpu", torch.optim.SGD(cpu_model.parameters(), lr=0.1)),
        (brick_model, "brick", brick_optimizer),
    ):
        for _ in range(2):
            optimizer.zero_grad()
            model(tokens.to(device)).logsumexp(-1).sum().backward()
            optimizer.step()
    assert brick_model.head.weight is brick_model.embed.weight
    torch.testing.assert_close(brick_model.embed.weight.detach().cpu(),
                               cpu_model.embed.weight.detach())


# ==== test_rng.py / test_autograd.py ========================================================


def test_generators_and_seeds():
    g = torch.Generator(device="brick:1")
    assert g.device == torch.device("brick:1")
    g.manual_seed(42)
    assert g.initial_seed() == 42
    a = torch.rand(4, device="brick:1", generator=g)
    g.manual_seed(42)
    assert torch.equal(torch.rand(4, device="brick:1", generator=g).cpu(), a.cpu())
    state = torch.brick.get_rng_state(0)
    first = torch.rand(4, device="brick")
    torch.brick.set_rng_state(state, 0)
    assert torch.equal(torch.rand(4, device="brick").cpu(), first.cpu())
    states = torch.brick.get_rng_state_all()
    torch.brick.set_rng_state_all(states)
    torch.brick.manual_seed_all(42)
    assert torch.brick.initial_seed() == 42
    assert [gen.initial_seed() for gen in torch.brick.default_generators] == [42, 42]
    torch.brick.seed_all()
    seed1 = torch.brick.initial_seed()
    torch.brick.seed_all()
    assert torch.brick.initial_seed() != seed1


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc thread names")
def test_autograd_has_one_worker_thread_per_device():
    torch.ones(2, requires_grad=True, device="brick").sum().backward()
    names = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.add(f.read().strip())
        except OSError:  # the thread ended meanwhile
            pass
    for index in range(torch.accelerator.device_count()):
        assert f"pt_autograd_{index}" in names


# ==== test_profiler.py =====================================================================


def test_legacy_profiler_records_ranges_forward_and_backward(tmp_path):
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 10)).to("brick")
    x = torch.randn(8, 10, device="brick")
    with torch.autograd.profiler.profile(use_device="brick", record_shapes=True) as prof:
        with torch.profiler.record_function("outer"):
            with torch.profiler.record_function("forward"):
                loss = model(x).pow(2).mean()
            with torch.profiler.record_function("backward"):
                loss.backward()
        for index in (0, 1):  # both devices
            on_device = torch.randn(4, 4, device=f"brick:{index}")
            torch.add(on_device, on_device)
    names = [e.name for e in prof.function_events]
    for expected in ("outer", "forward", "backward", "aten::addmm", "aten::mm", "aten::relu"):
        assert expected in names, expected
    assert any("AddmmBackward" in n for n in names)  # the autograd engine's events
    assert names.count("aten::add") >= 2
    # Every row: which rows make a top ten by measured time depends on the machine's load.
    table = prof.key_averages(group_by_input_shape=True).table(sort_by="cpu_time_total",
                                                               row_limit=-1)
    assert "aten::addmm" in table
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert any(e.get("name") == "outer" for e in events)


def test_profiler_subpackage_is_reachable_from_the_package():
    # `import torch_brickdev` alone (a fresh interpreter, nothing else imported) must make
    # torch_brickdev.profiler usable, as torch.cuda's submodules are.
    code = (
        "import torch_brickdev, torch\n"
        "torch_brickdev.profiler.enable()\n"
        "x = torch.ones(4, device='brick'); y = x + x\n"
        "torch_brickdev.profiler.disable()\n"
        "print(sorted(s.name for s in torch_brickdev.profiler.stats()))\n"
    )
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "aten::add" in out.stdout


# ==== test_compile.py ======================================================================


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


# ---- autocast's device-module contract ------------------------------------------------------


def test_checkpointing_cpu_and_brick_work_with_brick_loaded():
    # PyTorch opens torch.amp.autocast(<current accelerator>, enabled=False) when it recomputes
    # a checkpointed region, also for CPU tensors: brick (the accelerator once loaded) must
    # answer for it, or checkpointing breaks everywhere brick is installed.
    from torch.utils.checkpoint import checkpoint

    for device in ("cpu", "brick"):
        x = torch.linspace(-1, 1, 16, device=device).reshape(4, 4).requires_grad_()
        for reentrant in (False, True):
            x.grad = None
            checkpoint(torch.sin, x, use_reentrant=reentrant).sum().backward()
            torch.testing.assert_close(x.grad.cpu(), torch.cos(x.detach().cpu()))
    assert torch.brick.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
