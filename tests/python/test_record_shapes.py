"""Input shapes per op: profile(record_shapes=True), report.shape_stats(), table(by="shape")."""

from __future__ import annotations

import collections
import json

import pytest
import torch

import torch_brickdev  # noqa: F401
from torch_brickdev import _C
from torch_brickdev import profiler as bp

from profiler_helpers import load_benchmark


def _calls_by_op(rows):
    calls = collections.Counter()
    for r in rows:
        calls[r.name, r.kind] += r.calls
    return calls


def _assert_rows_add_up(report):
    """Every op's calls are its signature rows' calls, by name and per call path and kind (an
    op's brick row and its host row each)."""
    assert report.shape_stats(), "no shape rows"
    by_name = _calls_by_op(report.shape_stats())
    calls, path_calls = collections.Counter(), collections.Counter()
    for b in report.bricks:
        if b.kind in ("op", "host"):
            calls[b.name, b.kind] += b.count
    for p in report.paths:
        if p.kind in ("op", "host"):
            path_calls[p.path, p.kind] += p.count
    for name, count in calls.items():
        assert by_name[name] == count, (name, by_name[name], count)
    by_path = collections.Counter()
    for r in report.shape_stats(by="path"):
        by_path[r.path, r.kind] += r.calls
    for path, count in path_calls.items():
        assert by_path[path] == count, (path, by_path[path], count)


@pytest.mark.parametrize("mode", ["event", "immediate", "deferred"])
def test_each_signature_of_an_op_is_a_row_and_the_rows_add_up(mode):
    w = torch.randn(8, 16, device="brick")
    a, b = torch.randn(4, 8, device="brick"), torch.randn(2, 8, device="brick")
    with bp.profile(sync_mode=mode, record_shapes=True) as p:
        for _ in range(3):
            torch.mm(a, w)
        for _ in range(2):
            torch.mm(b, w)
        torch.mm(b.bfloat16(), w.bfloat16())
    signatures = {(json.dumps(r.shapes), tuple(r.dtypes)): r.calls
                  for r in p.report.shape_stats() if r.name == "aten::mm"}
    assert signatures == {("[[4, 8], [8, 16]]", ("float32", "float32")): 3,
                          ("[[2, 8], [8, 16]]", ("float32", "float32")): 2,
                          ("[[2, 8], [8, 16]]", ("bfloat16", "bfloat16")): 1}
    mm = p.report.brick("aten::mm")
    rows_of_mm = [r for r in p.report.shape_stats() if r.name == "aten::mm"]
    assert sum(r.total_ns for r in rows_of_mm) == mm.total_ns  # the same measured calls
    assert min(r.min_ns for r in rows_of_mm) == mm.min_ns
    assert max(r.max_ns for r in rows_of_mm) == mm.max_ns
    _assert_rows_add_up(p.report)


def test_integer_arguments_and_tensor_lists_are_recorded():
    x = torch.randn(4, 8, device="brick")
    image, weight = torch.randn(1, 3, 8, 8, device="brick"), torch.randn(4, 3, 3, 3, device="brick")
    with bp.profile(record_shapes=True) as p:
        x.view(2, 16)
        torch.cat([x, x], dim=1)
        torch.nn.functional.conv2d(image, weight, stride=2, padding=1)
        x[torch.tensor([0, 2], device="brick")]
    rows = {r.name: r for r in p.report.shape_stats()}
    views = [r for r in p.report.shape_stats() if r.name == "aten::view"]
    assert [(r.shapes, r.dtypes, r.values) for r in views if r.shapes[0] == [4, 8]] == \
        [([[4, 8], []], ["float32", "int[]"], [None, [2, 16]])]
    assert rows["aten::cat"].shapes == [[[4, 8], [4, 8]], []]
    assert rows["aten::cat"].dtypes == ["TensorList", "int"]
    assert rows["aten::cat"].values == [None, 1]
    conv = rows["aten::conv2d"]
    assert conv.shapes[:2] == [[1, 3, 8, 8], [4, 3, 3, 3]]
    assert conv.values[3:6] == [[2, 2], [1, 1], [1, 1]]  # stride, padding, dilation
    assert rows["aten::index"].shapes == [[4, 8], [[2]]]
    text = p.report.table(by="shape")
    assert "aten::conv2d" in text and "float32[1, 3, 8, 8]" in text and "[2, 2]" in text
    _assert_rows_add_up(p.report)


def test_off_by_default_and_left_off_after_a_profile_even_one_that_raised():
    x = torch.randn(4, device="brick")
    with bp.profile() as p:
        x + x
    assert "shapes" not in p.report.metadata
    assert p.report.shape_stats() == []
    with pytest.raises(ValueError, match=r"record_shapes=True"):
        p.report.table(by="shape")
    with pytest.raises(RuntimeError, match="inside"):
        with bp.profile(record_shapes=True):
            x + x
            raise RuntimeError("inside")
    assert _C._profiler.record_shapes() is False
    with bp.profile() as p:  # a later profile that did not ask records none
        x + x
    assert "shapes" not in p.report.metadata


def test_the_setting_cannot_change_while_profiling():
    with bp.profile(record_shapes=True):
        with pytest.raises(RuntimeError, match="record_shapes cannot change while profiling"):
            _C._profiler.set_record_shapes(False)
    with pytest.raises(TypeError, match="record_shapes"):
        bp.profile(record_shapes="yes")


def test_a_cpu_ops_calls_are_host_rows_apart_from_its_brick_calls(tmp_path):
    """A mixed program: the CPU's matmuls are the op's host rows (their host time), the brick's
    its op rows; the table marks the host rows; a report file keeps the kind, and one written
    before rows had a kind reads its rows as brick calls."""
    a, b = torch.randn(64, 64), torch.randn(32, 32, device="brick")
    with bp.profile(record_shapes=True) as p:
        for _ in range(3):
            torch.mm(a, a)
        for _ in range(2):
            torch.mm(b, b)
    _assert_rows_add_up(p.report)
    mm = {r.kind: r for r in p.report.shape_stats() if r.name == "aten::mm"}
    assert set(mm) == {"op", "host"}
    assert (mm["host"].calls, mm["host"].shapes) == (3, [[64, 64], [64, 64]])
    assert (mm["op"].calls, mm["op"].shapes) == (2, [[32, 32], [32, 32]])
    assert mm["host"].total_ns == {b.kind: b for b in p.report.bricks
                                   if b.name == "aten::mm"}["host"].total_ns
    table = p.report.table(by="shape", width=0).splitlines()
    assert any(line.startswith("aten::mm [host] ") and "[64, 64]" in line for line in table)
    assert any(line.startswith("aten::mm ") and "[32, 32]" in line for line in table)
    back = bp.load_report(p.report.write_json(tmp_path / "report.json"))
    assert back.shape_stats() == p.report.shape_stats()
    older = p.report.to_dict()
    for entry in older["metadata"]["shapes"]:
        del entry["kind"]
    assert {r.kind for r in bp.load_report(older).shape_stats()} == {"op"}


def test_the_rows_survive_the_json_round_trip(tmp_path):
    x = torch.randn(4, 8, device="brick")
    with bp.profile(record_shapes=True) as p:
        x @ x.T
    path = p.report.write_json(tmp_path / "report.json")
    back = bp.load_report(path)
    assert back.shape_stats() == p.report.shape_stats()
    assert back.table(by="shape") == p.report.table(by="shape")


@pytest.mark.parametrize("entry, problem", [
    ("nope", "metadata.shapes must be a list"),
    (["x"], r"metadata.shapes\[0\] must be an object"),
    ([{"name": "aten::mm"}], r"metadata.shapes\[0\].overload must be a str"),
    ([{"name": "aten::mm", "overload": ""}], r"metadata.shapes\[0\].path must be a str"),
    ([{"name": "aten::mm", "overload": "", "path": "aten::mm", "device": 0, "shapes": [],
       "dtypes": [], "values": [], "calls": 1, "total_ns": 1, "min_ns": 1, "max_ns": 1,
       "kind": "range"}], r"metadata.shapes\[0\].kind must be one of 'op', 'host', got 'range'"),
])
def test_a_malformed_shapes_entry_is_named(entry, problem):
    report = bp.Report(bricks=[], paths=[], wall_ns=1, sync_mode="event", device={},
                       metadata={"shapes": entry})
    with pytest.raises(ValueError, match=problem):
        report.shape_stats()
    with pytest.raises(ValueError, match="by must be 'name' or 'path'"):
        bp.Report(bricks=[], paths=[], wall_ns=1, sync_mode="event",
                  device={}).shape_stats(by="op")


def test_the_rows_match_torch_profilers_group_by_input_shape():
    """PyTorch's own view of the same calls: key_averages(group_by_input_shape=True) of
    torch.profiler, run around the same region, has the same calls per op and input shapes."""
    w = torch.randn(8, 16, device="brick")
    inputs = [torch.randn(n, 8, device="brick") for n in (4, 4, 2, 4, 2)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                record_shapes=True) as prof:
        with bp.profile(record_shapes=True) as p:
            for x in inputs:
                torch.mm(x, w)
                torch.relu(x)
    theirs = collections.Counter()
    for avg in prof.key_averages(group_by_input_shape=True):
        if avg.key in ("aten::mm", "aten::relu"):
            theirs[(avg.key, json.dumps(avg.input_shapes))] += avg.count
    ours = collections.Counter()
    for r in p.report.shape_stats():
        if r.name in ("aten::mm", "aten::relu"):
            ours[(r.name, json.dumps(r.shapes))] += r.calls
    assert ours == theirs
    assert ours[("aten::mm", "[[4, 8], [8, 16]]")] == 3


@pytest.mark.timeout(240)
def test_qwen2_rows_add_up(one_thread):
    pytest.importorskip("transformers")
    model, _ = load_benchmark("bench_profile_options").qwen2()  # Qwen2, tiny config, on brick
    ids = torch.randint(3, 256, (1, 8), device="brick")
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, do_sample=False)
        with bp.profile(record_shapes=True) as p:
            model.generate(ids, max_new_tokens=4, do_sample=False)
    _assert_rows_add_up(p.report)
    # the projections' matmuls, per sequence length: the prefill's 8 tokens, then one at a time
    linear = [r for r in p.report.shape_stats() if r.name == "aten::linear"]
    lengths = {r.shapes[0][1] for r in linear if len(r.shapes[0]) == 3}
    assert {8, 1} <= lengths, lengths
