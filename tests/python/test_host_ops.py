"""Ops that run no brick work (CPU ops) have no device time in any front-end.

A mixed program prepares its data on the CPU and runs its model on brick: brick's profile lists
the CPU ops as host rows (kind ``host``, their host time, outside every device sum), PyTorch's
legacy profiler gives them no brick time, and ops that only view or query brick tensors, or
allocate brick memory, are brick ops, not CPU work.
"""

from __future__ import annotations

import functools
import json
import os

import pytest
import torch

from profiler_helpers import clean_profiler  # noqa: F401  (a fixture)
from torch_brickdev import profiler as bp
from torch_brickdev.profiler.report import load_report

CALLS = 5


@pytest.fixture(autouse=True)
def _clean(clean_profiler):  # noqa: F811
    yield


def mixed_program():
    """Data preparation on the CPU (matmuls of CPU tensors), then the model on brick."""
    data = torch.randn(128, 128)
    for _ in range(CALLS):
        data = data @ data
        data = data / data.norm()
    w = torch.randn(128, 128, device="brick")
    x = data.to("brick")
    for _ in range(CALLS):
        x = x @ w
    return x.cpu()


def rows_named(report, name):
    return {b.kind: b for b in report.bricks if b.name == name}


def test_cpu_matmul_is_a_host_row_and_bricks_matmul_a_device_row():
    with bp.profile() as prof:
        mixed_program()
    report = prof.report
    mm = rows_named(report, "aten::mm")
    assert set(mm) == {"op", "host"}, report.table()
    assert mm["host"].count == CALLS and mm["host"].total_ns > 0
    assert mm["op"].count == CALLS
    host = {r["name"]: r for r in report.host_ops}
    assert host["aten::mm"]["calls"] == CALLS
    assert host["aten::mm"]["host_ns"] == mm["host"].total_ns
    # Outside the device sums: the top level holds no host row; the table says they ran on the CPU.
    top_host_ns = sum(p.total_ns for p in report.paths if p.depth == 0 and p.kind == "host")
    assert top_host_ns >= mm["host"].total_ns
    assert report.top_level_ns() == sum(p.total_ns for p in report.paths
                                        if p.depth == 0 and p.kind != "host")
    text = report.table(width=0)
    assert "ops ran on the CPU, not on brick (no device time): " in text
    assert f"aten::mm x{CALLS} (" in text
    assert all(not line.startswith("aten::mm ") or " op " in line for line in text.splitlines())
    # report.brick() names the brick op, not its host row.
    assert report.brick("aten::mm").kind == "op"
    # A report file keeps the kind.
    again = load_report(report.to_dict())
    assert {b.kind for b in again.bricks if b.name == "aten::mm"} == {"op", "host"}
    assert again.host_ops == report.host_ops


def test_views_and_empty_of_brick_tensors_are_not_cpu_ops():
    x = torch.randn(64, 64, device="brick")
    with bp.profile() as prof:
        for _ in range(CALLS):
            x.t()
            x.view(-1)
            x.detach()
            x[1:]
            torch.empty(16, device="brick")
    host = {r["name"] for r in prof.report.host_ops}
    assert not host & {"aten::t", "aten::transpose", "aten::view", "aten::detach",
                       "aten::slice", "aten::empty", "aten::as_strided"}, host
    kinds = {b.name: b.kind for b in prof.report.bricks}
    assert kinds.get("aten::empty") == "op"
    assert kinds.get("aten::t") == "op"
    # A view runs no brick work: its device time is none.
    assert prof.report.brick("aten::view").total_ns == 0


def test_legacy_profiler_gives_a_cpu_op_no_brick_time():
    a = torch.randn(256, 256)
    b = torch.randn(256, 256, device="brick")
    torch.mm(b, b).cpu()  # brick warmed up
    with torch.autograd.profiler.profile(use_device="brick") as prof:
        for _ in range(CALLS):
            torch.mm(a, a)
        torch.mm(b, b).cpu()
    mm = [e for e in prof.function_events if e.name == "aten::mm"]
    assert len(mm) == CALLS + 1
    cpu_mm, brick_mm = mm[:CALLS], mm[CALLS]
    assert all(e.self_device_time_total == 0 for e in cpu_mm), [
        e.self_device_time_total for e in cpu_mm]
    assert brick_mm.self_device_time_total > 0
    averaged = {r.key: r for r in prof.key_averages()}
    # The averaged row holds the brick call's time only.
    assert averaged["aten::mm"].self_device_time_total == pytest.approx(
        brick_mm.self_device_time_total)


def test_diff_compares_an_ops_host_row_apart_from_its_brick_row():
    from torch_brickdev.profiler.diff import diff_reports

    x_cpu, x_brick = torch.randn(64, 64), torch.randn(64, 64, device="brick")
    reports = []
    for _ in range(2):
        with bp.profile() as session:
            x_cpu @ x_cpu
            x_brick @ x_brick
        reports.append(session.report)
    names = [c.name for c in diff_reports(*reports, threshold=10.0).changes]
    assert "aten::mm" in names and "aten::mm [host]" in names


def test_top_keeps_an_ops_host_row_apart_from_its_brick_row():
    from torch_brickdev.tools import top

    snapshot = {"bricks": [
        {"name": "aten::mm", "kind": "op", "count": 3, "total_ns": 3000, "histogram": [[30, 3]]},
        {"name": "aten::mm", "kind": "host", "count": 5, "total_ns": 9000, "histogram": [[40, 5]]},
    ]}
    merged = top._merge([snapshot, snapshot])  # two ranks
    assert merged["aten::mm"]["count"] == 6 and merged["aten::mm"]["total_ns"] == 6000
    assert merged["aten::mm [host]"]["count"] == 10
    assert merged["aten::mm [host]"]["kind"] == "host"


_ASYNCHRONOUS = """
import json, torch
from torch_brickdev import profiler as bp
from test_host_ops import CALLS, mixed_program
seen = {}
for mode in ("event", "deferred", "immediate"):
    with bp.profile(sync_mode=mode) as prof:
        mixed_program()
    rows = {b.kind: b for b in prof.report.bricks if b.name == "aten::mm"}
    seen[mode] = {"kinds": sorted(rows), "host_calls": rows["host"].count,
                  "brick_calls": rows["op"].count,
                  "host_ops": [r["name"] for r in prof.report.host_ops],
                  "pending": bp.health()["pending_events"],
                  "failures": bp.health()["timing_failures"]}
a, b = torch.randn(256, 256), torch.randn(256, 256, device="brick")
with torch.autograd.profiler.profile(use_device="brick") as legacy:
    for _ in range(CALLS):
        torch.mm(a, a)
    torch.mm(b, b).cpu()
seen["legacy"] = [e.self_device_time_total for e in legacy.function_events if e.name == "aten::mm"]
print(json.dumps(seen))
"""


@functools.lru_cache(maxsize=None)
def _seen_on_an_asynchronous_device() -> dict:
    """_ASYNCHRONOUS in a child on the host runtime with deferred completion (events complete
    after they are recorded, as on a GPU), once for the tests below."""
    from helpers import child_env, run_python

    env = child_env(BRICK_HOST_COMPLETION="deferred", BRICK_RUNTIME="host")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env["PYTHONPATH"]])
    done = run_python("-c", _ASYNCHRONOUS, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("sync", ["event", "deferred", "immediate"])
def test_on_an_asynchronous_device_a_cpu_op_is_still_a_host_row(sync):
    """CPU ops stay host rows in every sync mode and owe no event pairs."""
    mode = _seen_on_an_asynchronous_device()[sync]
    assert mode["kinds"] == ["host", "op"], mode
    assert mode["host_calls"] == CALLS and mode["brick_calls"] == CALLS, mode
    assert "aten::mm" in mode["host_ops"], mode
    assert mode["pending"] == 0 and mode["failures"] == 0, mode


def test_on_an_asynchronous_device_the_legacy_profiler_gives_a_cpu_op_no_brick_time():
    legacy = _seen_on_an_asynchronous_device()["legacy"]
    assert legacy[:CALLS] == [0] * CALLS and legacy[CALLS] > 0, legacy
