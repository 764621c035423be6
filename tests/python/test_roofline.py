"""A roofline per brick: profile(roofline=True), report.roofline(), table(roofline=True)."""

from __future__ import annotations

import json

import pytest
import torch

import torch_brickdev  # noqa: F401  (registers brick)
from torch_brickdev import profiler as bp
from torch_brickdev.profiler import roofline, roofline_peaks

from profiler_helpers import load_benchmark

pytestmark = pytest.mark.timing


@pytest.fixture(scope="module")
def peaks_file(tmp_path_factory):
    """The machine's peaks, measured once for the module into a file of its own."""
    path = tmp_path_factory.mktemp("roofline") / "roofline.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BRICK_ROOFLINE_CACHE", str(path))
        roofline.measure_peaks("float32")
        yield path


@pytest.fixture
def peaks_env(peaks_file, monkeypatch):
    monkeypatch.setenv("BRICK_ROOFLINE_CACHE", str(peaks_file))
    return peaks_file


def _rows(report, by="path"):
    return {r.path: r for r in report.roofline(by=by)}


def test_a_known_matmuls_work_is_exact(peaks_env):
    a, b = torch.randn(64, 128, device="brick"), torch.randn(128, 32, device="brick")
    with bp.profile(roofline=True) as p:
        for _ in range(3):
            torch.mm(a, b)
    mm = _rows(p.report)["aten::mm"]
    assert mm.flops == 3 * 2 * 64 * 128 * 32
    assert mm.bytes == 3 * 4 * (64 * 128 + 128 * 32 + 64 * 32)
    assert mm.total_ns == p.report.brick("aten::mm").total_ns
    assert mm.flops_per_s == pytest.approx(mm.flops / (mm.total_ns / 1e9))
    assert mm.unestimated_calls == 0 and mm.dtype == "float32"


def test_a_cpu_ops_work_is_in_no_bricks_roofline(peaks_env):
    """The same op on CPU tensors and on brick tensors, also inside one range: only the brick
    calls' work is the brick's and the range's (the CPU's calls ran no brick work)."""
    a, b = torch.randn(64, 64), torch.randn(32, 32, device="brick")
    with bp.profile(roofline=True) as p:
        with torch.profiler.record_function("Prep"):
            for _ in range(3):
                torch.mm(a, a)
        for _ in range(2):
            torch.mm(b, b)
    rows = _rows(p.report)
    assert rows["aten::mm"].flops == 2 * 2 * 32 ** 3
    assert "Prep/aten::mm" not in rows, sorted(rows)
    assert (rows["Prep"].flops, rows["Prep"].bytes) == (0, 0)  # (its matmuls' resolve_conj)


def test_a_range_counts_its_outermost_ops_once(peaks_env):
    layer = torch.nn.Linear(128, 64).to("brick")
    x = torch.randn(32, 128, device="brick")
    with torch.no_grad(), bp.profile(roofline=True) as p:
        with torch.profiler.record_function("Block"):
            layer(x)
            torch.relu(x)
    rows = _rows(p.report)
    linear_flops = 2 * 32 * 128 * 64 + 32 * 64  # the matmul's multiply-adds, the bias's adds
    assert rows["Block/aten::linear"].flops == rows["Block/aten::linear/aten::addmm"].flops
    assert rows["Block"].flops == rows["Block/aten::linear"].flops  # not the addmm again
    assert rows["Block"].flops in (2 * 32 * 128 * 64, linear_flops)  # as flop_counter counts it
    assert rows["Block"].bytes == rows["Block/aten::linear"].bytes + rows["Block/aten::relu"].bytes


def test_achieved_never_exceeds_the_measured_peaks(peaks_env):
    """The peaks are the best of calibrated runs of the same kernels (a 512x512 matmul among
    them): a brick's rate cannot beat them beyond timing noise (5 %). The machine's load may
    change between the calibration and the region, so the peaks are measured again after it and
    the better of the two readings is the bound."""
    a, b = torch.randn(512, 512, device="brick"), torch.randn(512, 512, device="brick")
    x = torch.randn(2**20, device="brick")
    with bp.profile(roofline=True) as p:
        for _ in range(5):
            torch.mm(a, b)
            x.mul_(1.0)
    before = p.report.metadata["roofline"]["peaks"]["float32"]
    after = roofline.measure_peaks("float32")
    best_flops = max(before["flops_per_s"], after["flops_per_s"])
    best_bytes = max(before["bytes_per_s"], after["bytes_per_s"])
    for row in p.report.roofline():
        assert row.flops_per_s <= 1.05 * best_flops, row
        assert row.bytes_per_s <= 1.05 * best_bytes, row
        assert row.flops_fraction == pytest.approx(row.flops_per_s / before["flops_per_s"])


def test_a_bandwidth_bound_op_is_reported_as_such(peaks_env):
    x, y = torch.randn(2**21, device="brick"), torch.randn(2**21, device="brick")
    a, b = torch.randn(512, 512, device="brick"), torch.randn(512, 512, device="brick")
    with bp.profile(roofline=True) as p:
        for _ in range(3):
            x + y
            torch.mm(a, b)
    rows = _rows(p.report)
    assert rows["aten::add"].bound == "memory"
    assert rows["aten::add"].flops == 0  # flop_counter counts no elementwise FLOPs
    assert rows["aten::add"].bytes == 3 * 3 * 4 * 2**21  # two read, one written, three calls
    assert rows["aten::mm"].bound == "compute"
    assert rows["aten::mm"].intensity > rows["aten::add"].intensity == 0.0


def test_ops_without_an_estimate_are_counted_not_zero(peaks_env):
    x = torch.randn(100, device="brick")
    with bp.profile(roofline=True) as p:
        torch.nonzero(x > 0)  # a data-dependent size: no meta kernel
    rows = _rows(p.report)
    assert rows["aten::nonzero"].unestimated_calls == 1
    assert rows["aten::nonzero"].bound == "-"
    line = next(line for line in p.report.table(roofline=True).splitlines()
                if line.startswith("aten::nonzero"))
    assert line.rstrip().endswith("-*")


def test_the_table_json_and_trace_carry_it(peaks_env, tmp_path):
    a, b = torch.randn(64, 64, device="brick"), torch.randn(64, 64, device="brick")
    with torch.autograd.profiler.profile(use_device="brick") as prof:
        with bp.profile(roofline=True) as p:
            torch.mm(a, b)
    text = p.report.table(roofline=True)
    assert "GFLOP/s" in text and "roofline peaks (float32)" in text and "measured on brick" in text
    back = bp.load_report(p.report.write_json(tmp_path / "report.json"))
    assert back.roofline() == p.report.roofline()
    trace = json.loads(open(bp.export_chrome_trace(prof, tmp_path / "trace.json",
                                                   report=p.report)).read())
    mm = [e for e in trace["traceEvents"] if e.get("name") == "aten::mm" and e.get("ph") == "X"
          and "brick roofline" in (e.get("args") or {})]
    assert mm and mm[0]["args"]["brick roofline"]["FLOPs per call"] == 2 * 64 ** 3


def test_asked_for_or_refused_clearly(peaks_env):
    x = torch.randn(4, device="brick")
    with bp.profile() as p:
        x + x
    assert p.report.roofline() == []
    with pytest.raises(ValueError, match="roofline=True"):
        p.report.table(roofline=True)
    with pytest.raises(TypeError, match="roofline must be a bool"):
        p.report.table(roofline=1)
    with pytest.raises(ValueError, match="by must be 'path' or 'name'"):
        p.report.roofline(by="op")
    with pytest.raises(ValueError, match="dtype"):
        roofline.measure_peaks("int8")
    bad = bp.Report(bricks=[], paths=[], wall_ns=1, sync_mode="event", device={},
                    metadata={"roofline": {"bricks": [{"path": "x"}]}})
    with pytest.raises(ValueError, match=r"metadata.roofline.bricks\[0\]"):
        bad.roofline()


def test_the_peaks_are_measured_once_per_machine(peaks_env, monkeypatch):
    cached = json.loads(peaks_env.read_text())
    assert len(cached) == 1
    entry = next(iter(cached.values()))
    assert entry["flops_per_s"] > 0 and entry["bytes_per_s"] >= entry["memory_bytes_per_s"] > 0
    assert entry["how"].startswith("measured on brick")

    def fail(dtype):
        raise AssertionError("measured again")

    monkeypatch.setattr(roofline_peaks, "measure_peaks", fail)
    assert roofline.peaks("float32") == entry


@pytest.mark.timeout(240)
def test_qwen2_and_a_cnn(peaks_env, one_thread):
    pytest.importorskip("transformers")
    model, _ = load_benchmark("bench_profile_options").qwen2()  # Qwen2, tiny config, on brick
    ids = torch.randint(3, 256, (1, 8), device="brick")
    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                              torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, stride=2)).to("brick").eval()
    image = torch.randn(2, 3, 32, 32, device="brick")
    with torch.no_grad():
        model(ids)
        cnn(image)
        with bp.profile(roofline=True, modules=True) as p:
            model(ids)
            cnn(image)
    rows = _rows(p.report, by="name")
    # the model's matmuls: 2 layers x (q, k, v, o, gate, up, down) + lm_head, 8 tokens
    h, i, v, kv = 64, 128, 256, 2 * 16
    per_layer = 2 * 8 * (h * h + 2 * h * kv + h * h + 3 * h * i)
    assert rows["Qwen2ForCausalLM"].flops >= 2 * per_layer + 2 * 8 * h * v
    conv = rows["aten::conv2d"]
    expected = 2 * (2 * 8 * 32 * 32 * 3 * 9) + 2 * (2 * 8 * 15 * 15 * 8 * 9)
    assert conv.flops == expected
    assert rows["Sequential"].flops >= conv.flops


def test_the_bytes_an_op_moves():
    """Inputs read and outputs written once; views and no-op conversions move nothing; an
    in-place op writes its input."""
    f32 = ["float32", "float32", "int"]
    assert roofline.op_work("aten::add", "Tensor", [[1000], [1000], []], f32,
                            [None, None, 1]) == roofline.OpWork(0, 3 * 4000)
    assert roofline.op_work("aten::add_", "Tensor", [[1000], [1000], []], f32,
                            [None, None, 1]) == roofline.OpWork(0, 3 * 4000)
    assert roofline.op_work("aten::view", "", [[4, 8], []], ["float32", "int[]"],
                            [None, [2, 16]]) == roofline.OpWork(0, 0)
    to = ["float32", "int", "bool", "bool", "None"]
    float64, float32 = 7, 6  # c10::ScalarType codes, as an aten::to call records its dtype
    assert roofline.op_work("aten::to", "dtype", [[4, 8], [], [], [], []], to,
                            [None, float64, False, False, None]) == roofline.OpWork(0, 32 * 12)
    assert roofline.op_work("aten::to", "dtype", [[4, 8], [], [], [], []], to,
                            [None, float32, False, False, None]) == roofline.OpWork(0, 0)
    assert roofline.op_work("aten::mm", "", [[4, 8], [8, 16]], ["float32", "float32"],
                            [None, None]) == roofline.OpWork(2 * 4 * 8 * 16, 4 * (32 + 128 + 64))
    assert roofline.op_work("aten::nonzero", "", [[10]], ["float32"], [None]) is None
    assert roofline.op_work("no_such::op", "", [], [], []) is None
