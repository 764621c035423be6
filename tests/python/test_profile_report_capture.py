"""What a profile takes at its exit, and its report made from it when first read.

A profile's exit takes the registry's rows, the machine sample, the health counters, the
distributed state and the shapes; ``profile.report`` makes the Report of them when first read
(its Python objects are not the profiled program's time). Whatever ran in between, the report
holds the region's figures.
"""

from __future__ import annotations

import datetime
import time

import pytest
import torch

from profiler_helpers import clean_profiler  # noqa: F401  (a fixture)
import torch_brickdev
from torch_brickdev import profiler as bp

_native = torch_brickdev._C._profiler


@pytest.fixture(autouse=True)
def _clean(clean_profiler):  # noqa: F811
    yield


def test_a_report_read_after_other_profiles_holds_its_own_regions_figures():
    x = torch.ones(8, device="brick")
    with bp.profile() as first:
        for _ in range(3):
            x = x + 1
    health_at_exit = dict(_native.health(since_reset=True))  # a report's: since its reset
    with bp.profile(ops="kernels") as second:
        for _ in range(5):
            x = x * 2
    bp.reset()
    with bp.profile(reset=False):
        x.sum()
    assert first.report.brick("aten::add").count == 3
    assert "aten::mul" not in first.report and "aten::sum" not in first.report
    assert second.report.brick("aten::mul").count == 5
    assert second.report.metadata["ops"] == "kernels"
    assert first.report.health == health_at_exit
    assert first.report.wall_ns == first.wall_ns
    assert first.report.machine["wall_ns"] > 0


def test_the_report_is_made_once_and_can_be_replaced():
    x = torch.ones(8, device="brick")
    with bp.profile() as session:
        x + 1
    report = session.report
    assert session.report is report
    session.report = None
    assert session.report is None
    assert bp.profile().report is None  # before its region


def test_the_report_is_dated_at_the_regions_end_not_when_read():
    x = torch.ones(8, device="brick")
    with bp.profile() as session:
        x + 1
    ended = datetime.datetime.now(datetime.timezone.utc)
    time.sleep(0.2)
    created = datetime.datetime.fromisoformat(session.report.created)
    assert abs((created - ended).total_seconds()) < 0.1


def test_shapes_are_taken_at_the_exit():
    a = torch.ones(2, 3, device="brick")
    b = torch.ones(4, 5, device="brick")
    with bp.profile(record_shapes=True) as first:
        a + a
    with bp.profile(record_shapes=True) as second:
        b + b
    first_shapes = {tuple(map(tuple, s.shapes[:2])) for s in first.report.shape_stats()
                    if s.name == "aten::add"}
    second_shapes = {tuple(map(tuple, s.shapes[:2])) for s in second.report.shape_stats()
                     if s.name == "aten::add"}
    assert first_shapes == {((2, 3), (2, 3))}
    assert second_shapes == {((4, 5), (4, 5))}


def test_a_refused_entry_leaves_the_settings_and_the_running_profile_as_they_were():
    x = torch.ones(8, device="brick")
    with bp.profile(ops="kernels") as outer:
        with pytest.raises(RuntimeError, match="already running"):
            _native.begin_region(True, True, "dispatcher")
        assert _native.op_timing() == "kernels"
        assert not _native.record_shapes()
        x = x + 1
    assert outer.report.brick("aten::add").count == 1
    assert _native.op_timing() == "dispatcher"  # restored at the exit
