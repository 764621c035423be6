"""torch.profiler (Kineto) sees brick: device activities, key_averages() columns, the chrome
trace, schedules, memory, threads and streams, and agreement with the registry and the legacy
profiler. Skipped where PyTorch has no PrivateUse1 profiler registry (2.11), except the warning
test, which simulates that case everywhere."""

import json
import os
import threading
import warnings

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

import torch_brickdev
import torch_brickdev.profiler as bp
from torch_brickdev.profiler import _kineto, machine
from helpers import run_python
from profiler_helpers import spin_cpu_op

pytestmark = pytest.mark.timing

needs_plugin = pytest.mark.skipif(
    not bp.kineto_available(),
    reason=f"PyTorch {torch.__version__} has no Kineto PrivateUse1 profiler registry (2.12+)")
ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
ON_HOST = torch_brickdev.backing_device_type() == "cpu"
BRICK_TYPE = torch.autograd.DeviceType.PrivateUse1

def run_profiled(fn, **kwargs):
    with profile(activities=ACTIVITIES, **kwargs) as prof:
        fn()
        torch.brick.synchronize()
    return prof


def kernels(prof):
    return [e for e in prof.events() if e.device_type == BRICK_TYPE]


def trace_of(prof, tmp_path, name="trace.json"):
    path = tmp_path / name
    prof.export_chrome_trace(str(path))
    with open(path) as f:
        return json.load(f)["traceEvents"]


@needs_plugin
def test_every_brick_op_gets_a_device_activity_linked_to_its_op():
    a = torch.randn(128, 128, device="brick")

    def work():
        b = a @ a
        c = torch.relu(b + 1)
        c.cpu()

    prof = run_profiled(work)
    names = {e.name for e in kernels(prof)}
    assert {"brick::aten::mm", "brick::aten::add", "brick::aten::relu",
            "brick::aten::_copy_from"} <= names, names
    ops = {e.name: e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU}
    for op in ("aten::mm", "aten::add", "aten::relu"):
        assert ops[op].device_time_total > 0, op  # attributed through the link
        assert [k.name for k in ops[op].kernels] == [f"brick::{op}"]
    rows = {r.key: r for r in prof.key_averages()}
    assert rows["aten::mm"].self_device_time_total > 0
    assert rows["aten::matmul"].device_time_total == pytest.approx(
        rows["aten::mm"].device_time_total)  # the op that launched it, and its parents
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=5)
    assert "Self BRICK" in table and "BRICK total" in table
    assert bp.kineto_stats()["activities_emitted"] > 0


@needs_plugin
@pytest.mark.skipif(not ON_HOST, reason="spins on the host: the device time is the spin only "
                                         "where the device is the host")
def test_an_op_of_known_duration_shows_that_device_time():
    spin = spin_cpu_op()
    t = torch.ones(4, device="brick")
    spin(t, 10)  # warm up
    us, calls = 2000, 10
    prof = run_profiled(lambda: [spin(t, us) for _ in range(calls)])
    row = next(r for r in prof.key_averages() if r.key == "brick_test_cpu::spin")
    assert row.count == calls
    assert row.self_device_time_total >= calls * us
    device = sorted(k.device_time_total for k in kernels(prof)
                    if k.name == "brick::brick_test_cpu::spin")
    assert len(device) == calls
    # Never below the spin, never beyond the op's own call on the host; the fastest quarter of
    # the calls within 15 % + 50 µs of it. (On a busy 2-core machine a busy-wait is preempted
    # in every other call, for CPU tensors alike: a wider figure there is the machine's.)
    assert device[0] >= us, device
    assert device[calls // 4] <= us * 1.15 + 50, device
    for op in (e for e in prof.events() if e.name == "brick_test_cpu::spin"):
        assert len(op.kernels) == 1
        assert op.kernels[0].duration <= op.cpu_time_total + 2


@needs_plugin
def test_device_times_agree_with_the_registry_on_the_same_executions():
    a = torch.randn(384, 384, device="brick")
    a @ a  # warm up
    calls = 8

    def work():
        for _ in range(calls):
            torch.mm(a, a)

    # The registry records the very executions torch.profiler sees: per call, they agree, but
    # where the machine kept this thread from a CPU for at least the difference (the registry
    # times the op's call, the plugin its kernel: a preemption between the two lands in one
    # only). Such a round is inconclusive, never a pass: three conclusive rounds are needed.
    conclusive, inconclusive = 0, []
    while conclusive < 3 and len(inconclusive) < 10:
        with profile(activities=ACTIVITIES) as prof:
            with bp.profile(sync_mode="event") as p:
                work()
        mm = [k.device_time_total for k in kernels(prof) if k.name == "brick::aten::mm"]
        assert len(mm) == calls
        kineto_us = sum(mm) / calls
        registry_us = p.report.brick("aten::mm").total_ns / calls / 1e3
        assert kineto_us >= 20, "the agreement bound is for ops of 20 µs or more"
        if abs(kineto_us - registry_us) <= 0.10 * registry_us + 2:
            conclusive += 1
            continue
        lost = machine.denied(p.report.machine, p.report.wall_ns)
        differs_ns = abs(kineto_us - registry_us) * calls * 1e3
        assert lost is not None and lost.ns >= differs_ns, (kineto_us, registry_us, lost)
        inconclusive.append(f"{kineto_us:.0f} vs {registry_us:.0f} us ({lost.text()})")
    if conclusive < 3:
        pytest.skip(f"the machine was too busy: {len(inconclusive)} rounds lost their CPU: "
                    + "; ".join(inconclusive))
    text = bp.compare_with_key_averages(prof, p.report)
    row = next(line for line in text.splitlines() if line.startswith("aten::mm"))
    assert row.split()[1] == str(calls) and row.split()[3] == str(calls)
    assert "brick::" not in text and "brickLaunchKernel" not in text


@needs_plugin
@pytest.mark.skipif(not ON_HOST, reason="spins on the host")
def test_device_times_agree_with_the_legacy_profiler_on_work_of_known_duration():
    # The legacy profiler cannot run beside torch.profiler, so the two see separate executions:
    # a busy-wait of known length takes the same time in both (a matmul's time varies between
    # runs on a shared machine by more than the bound).
    spin = spin_cpu_op()
    t = torch.ones(4, device="brick")
    us, calls = 1000, 8
    spin(t, 10)
    prof = run_profiled(lambda: [spin(t, us) for _ in range(calls)])
    kineto = [k.device_time_total for k in kernels(prof) if k.name == "brick::brick_test_cpu::spin"]
    with torch.autograd.profiler.profile(use_device="brick") as legacy:
        for _ in range(calls):
            spin(t, us)
    legacy_times = [e.device_time_total for e in legacy.function_events
                    if e.name == "brick_test_cpu::spin"]
    assert len(kineto) == len(legacy_times) == calls
    # Their fastest calls (a preempted call is slower in either): both the spin, within the bound.
    kineto_min, legacy_min = min(kineto), min(legacy_times)
    assert kineto_min >= us and legacy_min >= us - 1  # the legacy path truncates to whole µs
    assert abs(legacy_min - kineto_min) <= 0.10 * kineto_min + 2, (legacy_min, kineto_min)


@needs_plugin
def test_chrome_trace_has_named_tracks_flows_and_device_work_inside_its_op(tmp_path):
    a = torch.randn(96, 96, device="brick")

    def work():
        with record_function("Block"):
            for _ in range(3):
                torch.relu(a @ a)

    events = trace_of(run_profiled(work), tmp_path)
    assert all(isinstance(e.get("ts", 0), (int, float)) for e in events)
    names = {(e["name"], e["args"]["name"]) for e in events
             if e.get("ph") == "M" and e.get("pid") == 0 and e["name"] in ("process_name", "thread_name")}
    assert ("process_name", "brick") in names and ("thread_name", "brick:0 stream 0") in names
    device = [e for e in events if e.get("cat") == "kernel"]
    launches = [e for e in events if e.get("cat") == "privateuse1_runtime"]
    assert len(device) == len(launches) == 6
    assert all(e["pid"] == 0 and e["tid"] == 0 for e in device)
    # The arguments trace tools read (HTA: stream, correlation, device), as numbers.
    assert all(set(e["args"]) >= {"device", "stream", "correlation"} for e in device)
    assert all((e["args"]["device"], e["args"]["stream"]) == (0, 0) for e in device)
    assert all(e["pid"] == os.getpid() for e in launches)
    # ac2g arrows, both ends: one start on the launch, one end on the device activity.
    flows = [e for e in events if e.get("cat") == "ac2g"]
    starts = {e["id"]: e for e in flows if e["ph"] == "s"}
    ends = {e["id"]: e for e in flows if e["ph"] == "f"}
    assert len(starts) == len(ends) == 6 and starts.keys() == ends.keys()
    # Each launch and its device work share one correlation id, unique per launch (as CUPTI's
    # on cudaLaunchKernel and its kernel): what trace tools pair them by.
    correlations = [e["args"]["correlation"] for e in device]
    assert len(set(correlations)) == 6
    assert sorted(correlations) == sorted(e["args"]["correlation"] for e in launches)
    ops = {e["args"]["External id"]: e for e in events
           if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    for work_event in device + launches:
        op = ops[work_event["args"]["External id"]]
        assert work_event["name"] in (f"brick::{op['name']}", "brickLaunchKernel")
        if ON_HOST:  # the host executes inside the op's call
            slack_us = 2
            assert op["ts"] - slack_us <= work_event["ts"], (op, work_event)
            assert work_event["ts"] + work_event["dur"] <= op["ts"] + op["dur"] + slack_us


@needs_plugin
def test_trace_names_the_brick_devices_in_device_properties(tmp_path):
    # As CUDA traces do: TensorBoard's profiler plugin and HTA name the device from these.
    path = tmp_path / "trace.json"
    run_profiled(lambda: torch.ones(8, device="brick").sum()).export_chrome_trace(str(path))
    with open(path) as f:
        entries = json.load(f)["deviceProperties"]
    brick = [e for e in entries if str(e.get("name", "")).startswith("brick:")]
    assert [e["id"] for e in brick] == list(range(torch.brick.device_count()))
    for entry in brick:
        expected = torch.brick.get_device_properties(entry["id"])
        assert entry["name"] == expected.name and entry["name"] == torch.brick.get_device_name(
            entry["id"])
        assert entry["totalGlobalMem"] == expected.total_memory > 0
        assert (entry["computeMajor"], entry["computeMinor"]) == (expected.major, expected.minor)
        assert entry["backingDevice"] == expected.backing_device


@needs_plugin
def test_holistic_trace_analysis_loads_the_trace_and_its_analyses_run(tmp_path):
    hta = pytest.importorskip("hta.trace_analysis")
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()).to("brick")
    x = torch.randn(32, 64, device="brick")
    prof = run_profiled(lambda: [model(x) for _ in range(4)])
    trace_dir = tmp_path / "traces"
    trace_dir.mkdir()
    prof.export_chrome_trace(str(trace_dir / "rank-0.json"))
    analysis = hta.TraceAnalysis(trace_dir=str(trace_dir))
    df = analysis.t.get_trace(0)
    assert len(df[df["stream"] >= 0]) == len(kernels(prof))
    breakdown = analysis.get_temporal_breakdown(visualize=False)
    assert breakdown[breakdown["rank"] == 0].iloc[0]["compute_time(us)"] > 0
    kernel_breakdown = analysis.get_gpu_kernel_breakdown(visualize=False)
    assert len(kernel_breakdown[0]) >= 1
    idle = analysis.get_idle_time_breakdown(visualize=False)
    assert len(idle[0]) >= 1
    # HTA paired every device activity with its launch on the CPU (by their correlation id).
    assert (df[df["stream"] >= 0]["index_correlation"] > 0).all()


@needs_plugin
def test_schedule_writes_one_trace_per_active_window_without_leaks(tmp_path):
    a = torch.randn(64, 64, device="brick")
    out_dir = tmp_path / "tb"
    steps = 0
    with profile(activities=ACTIVITIES,
                 schedule=schedule(wait=1, warmup=1, active=2, repeat=2),
                 on_trace_ready=torch.profiler.tensorboard_trace_handler(str(out_dir))) as prof:
        for _ in range(8):
            torch.mm(a, a)
            torch.brick.synchronize()
            prof.step()
            steps += 1
    files = sorted(os.listdir(out_dir))
    assert len(files) == 2, files
    for name in files:
        with open(out_dir / name) as f:
            events = json.load(f)["traceEvents"]
        step_ranges = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
        assert len(step_ranges) == 2
        device = [e for e in events if e.get("cat") == "kernel"]
        assert [e["name"] for e in device] == ["brick::aten::mm"] * 2, "one per active step"
        first = min(e["ts"] for e in step_ranges)
        last = max(e["ts"] + e["dur"] for e in step_ranges)
        for e in device:
            assert first - 2 <= e["ts"] <= last + 2, "no device work from outside the window"


@needs_plugin
def test_memory_events_shapes_stacks_and_modules():
    model = torch.nn.Linear(32, 16).to("brick")
    x32, x64 = torch.randn(8, 32, device="brick"), torch.randn(64, 32, device="brick")

    def work():
        model(x32)
        model(x64)

    prof = run_profiled(work, profile_memory=True, record_shapes=True, with_stack=True,
                        with_modules=True)
    allocations = [e for e in prof.events() if e.device_memory_usage > 0]
    assert allocations, "brick allocations reach the memory profiler as device memory"
    by_shape = {(r.key, r.input_shapes and str(r.input_shapes[1])): r
                for r in prof.key_averages(group_by_input_shape=True) if r.key == "aten::addmm"}
    assert len(by_shape) == 2, by_shape.keys()
    assert all(r.self_device_time_total > 0 for r in by_shape.values())
    # Stacks and modules as on the CPU (the same rows carry stacks there and here).
    with profile(activities=[ProfilerActivity.CPU], with_stack=True, with_modules=True) as cpu:
        cpu_model = torch.nn.Linear(32, 16)
        cpu_model(x32.cpu())
    stacks = {r.key: r.stack for r in prof.key_averages(group_by_stack_n=5)}
    cpu_stacks = {r.key: r.stack for r in cpu.key_averages(group_by_stack_n=5)}
    assert bool(stacks["aten::addmm"]) == bool(cpu_stacks["aten::addmm"])
    table = prof.key_averages().table(sort_by="self_device_time_total")
    assert "BRICK Mem" in table


@needs_plugin
def test_threads_streams_and_devices_are_attributed(tmp_path):
    assert torch.brick.device_count() >= 2
    a0 = torch.randn(64, 64, device="brick:0")
    a1 = torch.randn(64, 64, device="brick:1")
    side = torch.brick.Stream()
    thread_ids = {}

    def on_thread(tag, tensor):
        thread_ids[tag] = threading.get_native_id()
        with torch.brick.device(tensor.device.index):
            torch.mm(tensor, tensor)

    def work():
        with torch.brick.stream(side):
            torch.add(a0, a0)
        threads = [threading.Thread(target=on_thread, args=(tag, t))
                   for tag, t in (("t0", a0), ("t1", a1))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
            assert not t.is_alive()

    try:  # ops on threads the profile did not start on are profiled only when asked
        config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    except TypeError:
        pytest.skip(f"PyTorch {torch.__version__} cannot profile all threads")
    events = trace_of(run_profiled(work, experimental_config=config), tmp_path)
    device = {e["name"] + f"@{e['pid']}": e for e in events if e.get("cat") == "kernel"}
    assert device["brick::aten::add@0"]["tid"] == side.stream_id
    mm = [e for e in events if e.get("cat") == "kernel" and e["name"] == "brick::aten::mm"]
    assert sorted(e["pid"] for e in mm) == [0, 1], "each on its own brick device's track"
    launches = [e for e in events if e.get("cat") == "privateuse1_runtime"]
    ops = {e["args"]["External id"]: e for e in events
           if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    mm_launch_threads = {e["tid"] for e in launches if ops[e["args"]["External id"]]["name"] == "aten::mm"}
    assert mm_launch_threads == {thread_ids["t0"], thread_ids["t1"]}
    for launch in launches:  # on the thread of the op it belongs to
        assert launch["tid"] == ops[launch["args"]["External id"]]["tid"]
    thread_names = {e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert {"brick:0 stream 0", f"brick:0 stream {side.stream_id}", "brick:1 stream 0"} <= thread_names


@needs_plugin
def test_cpu_only_profiles_and_unprofiled_work_get_no_brick_activity():
    a = torch.randn(32, 32, device="brick")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.mm(a, a)
    assert not kernels(prof)
    assert not any(_kineto.is_brick_activity(r.key) for r in prof.key_averages())
    torch.mm(a, a)  # between profiles: nothing recorded, nothing left for the next one
    prof = run_profiled(lambda: torch.add(a, a))
    assert [k.name for k in kernels(prof)] == ["brick::aten::add"]


def test_pytorch_without_the_registry_warns_once_naming_the_way_that_works():
    _kineto._remove_warning()
    try:
        assert _kineto.warn_where_unavailable(is_available=lambda: False)
        with pytest.warns(UserWarning, match=r"PyTorch 2\.12 or later.*use_device=\"brick\""):
            with profile(activities=ACTIVITIES):
                pass
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with profile(activities=ACTIVITIES):  # once per process
                pass
            with profile(activities=[ProfilerActivity.CPU]):  # and never for CPU-only
                pass
    finally:
        _kineto._remove_warning()
        if not bp.kineto_available():
            _kineto.warn_where_unavailable()


@needs_plugin
def test_asynchronous_device_times_come_from_events_resolved_after_the_work():
    # The host runtime with deferred completion behaves as an asynchronous device: launches are
    # timed by runtime events, resolved when the trace is processed.
    script = (
        "import torch, torch_brickdev, torch_brickdev.profiler as bp\n"
        "from torch.profiler import profile, ProfilerActivity as A\n"
        "a = torch.randn(256, 256, device='brick')\n"
        "with profile(activities=[A.CPU, A.PrivateUse1]) as prof:\n"
        "    for _ in range(4): torch.mm(a, a)\n"
        "k = [e for e in prof.events() if e.name == 'brick::aten::mm']\n"
        "ops = [e for e in prof.events() if e.name == 'aten::mm']\n"
        "assert len(k) == 4 and all(e.device_time_total > 0 for e in k), k\n"
        "assert all(op.device_time_total > 0 for op in ops)\n"
        "s = bp.kineto_stats(); assert s['failed'] == 0 and s['activities_emitted'] == 4, s\n"
        "print('ok')\n")
    env = dict(os.environ, BRICK_HOST_COMPLETION="deferred")
    result = run_python("-c", script, env=env, timeout=180)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-2000:]
