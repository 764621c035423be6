"""A report's figures mean what they say: its health counts its own profile's losses, its share
column says what it is a share of (the bricks' span, not a script's start-up), and its tables fit
a terminal without hiding what was cut, while a file or a pipe gets every column."""

from __future__ import annotations

import io
import json
import sys
import time

import pytest
import torch

import torch_brickdev  # noqa: F401  (registers brick)
from helpers import child_env, run_cli
from profiler_helpers import clean_profiler  # noqa: F401  (a fixture)
from torch_brickdev import profiler as bp
from torch_brickdev.profiler import ReportError

record_function = torch.profiler.record_function


@pytest.fixture(autouse=True)
def _clean(clean_profiler):  # noqa: F811
    yield


# ---- health: per profile -----------------------------------------------------------------------


def test_each_profiles_health_counts_only_its_own_discarded_records():
    """The profile's reset discards the previous profile's records: not this one's loss. The
    process-wide figure (bp.health()) still accounts for every record."""
    x = torch.ones(4, device="brick")
    bp.reset()
    before = bp.health()["discarded_by_reset"]
    reports = []
    for _ in range(3):
        with bp.profile() as p:
            for _ in range(5):
                x + x
        reports.append(p.report)
    assert [r.health["discarded_by_reset"] for r in reports] == [0, 0, 0]
    assert all(r.brick("aten::add").count == 5 for r in reports)
    assert bp.health()["discarded_by_reset"] - before == 10  # the 2nd and 3rd profiles' resets


def test_a_reset_inside_a_profile_is_counted_as_its_loss():
    x = torch.ones(4, device="brick")
    with bp.profile() as p:
        x + x
        x + x
        bp.reset()  # discards this profile's two records
        x + x
    assert p.report.health["discarded_by_reset"] == 2
    assert p.report.brick("aten::add").count == 1
    with bp.profile() as after:
        x + x
    assert after.report.health["discarded_by_reset"] == 0


# ---- the share column: of the bricks' span ----------------------------------------------------


def test_the_share_column_is_of_the_bricks_span_not_the_time_before_them():
    startup_s = 0.3
    with bp.profile(sync_mode="deferred") as p:
        time.sleep(startup_s)  # a script's start-up: imports, no brick
        with record_function("Work"):
            time.sleep(0.02)
    report = p.report
    work = report.brick("Work")
    # one top-level brick: the span is its call, exactly (the same clock)
    assert report.bricks_span_ns == work.total_ns
    assert report.bricks_span_ns <= report.wall_ns - startup_s * 1e9
    lines = report.table(width=0).splitlines()
    assert "% span" in lines[1] and "% wall" not in lines[1]
    row = next(line for line in lines if line.startswith("Work "))
    assert row.rstrip().endswith("100.0%")
    text = "\n".join(lines)
    assert f"of the bricks' span, {report.bricks_span_ns / 1e6:.3f} ms" in text
    assert f"wall time: {report.wall_ns / 1e6:.3f} ms" in text


def test_the_span_survives_the_file_and_a_report_without_one_shares_the_wall(tmp_path):
    x = torch.ones(4, device="brick")
    with bp.profile() as p:
        x + x
    back = bp.load_report(p.report.write_json(tmp_path / "report.json"))
    assert back.bricks_span_ns == p.report.bricks_span_ns is not None
    assert json.loads((tmp_path / "report.json").read_text())["bricks_span_ns"] == \
        p.report.bricks_span_ns
    data = p.report.to_dict()
    del data["bricks_span_ns"]  # a file of an older writer
    old = bp.load_report(data)
    assert old.bricks_span_ns is None
    header = old.table(width=0).splitlines()[1]
    assert "% wall" in header and "% span" not in header
    assert "% wall: of the wall time" in old.table(width=0)
    data["bricks_span_ns"] = -1
    with pytest.raises(ReportError, match=r"field 'bricks_span_ns' must be an integer >= 0"):
        bp.load_report(data)
    for bad, error, match in ((-1, ValueError, "must be >= 0"),
                              (True, TypeError, "must be an int .* got bool"),
                              (1.5, TypeError, "must be an int .* got float")):
        with pytest.raises(error, match=f"Report: bricks_span_ns {match}"):
            bp.Report(bricks=[], paths=[], wall_ns=5, sync_mode="event", device={},
                      bricks_span_ns=bad)


def test_figures_accumulated_over_profiles_have_no_span():
    x = torch.ones(4, device="brick")
    with bp.profile():
        x + x
    with bp.profile(reset=False) as p:  # its figures hold the earlier profile's too
        x + x
    assert p.report.brick("aten::add").count == 2
    assert p.report.bricks_span_ns is None
    assert "% wall" in p.report.table(width=0).splitlines()[1]


def test_the_cli_profiles_share_leaves_the_scripts_start_up_out(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(
        "import time\n"
        "import torch\n"
        "time.sleep(0.5)  # start-up\n"
        "x = torch.ones(64, device='brick')\n"
        "with torch.profiler.record_function('Work'):\n"
        "    for _ in range(20):\n"
        "        x = x + 1\n")
    done = run_cli("profile", "--no-trace", "-o", str(tmp_path), str(script), timeout=300,
                   env=child_env())
    assert done.returncode == 0, done.stderr
    report = bp.load_report(tmp_path / "report.json")
    assert 0 < report.bricks_span_ns <= report.wall_ns - 500_000_000
    header = next(line for line in done.stdout.splitlines() if line.startswith("Name "))
    assert header.rstrip().endswith("% span")
    row = next(line for line in done.stdout.splitlines() if line.startswith("Work "))
    share = 100 * report.brick("Work").total_ns / report.bricks_span_ns
    assert row.split()[-1] == f"{share:.1f}%"


# ---- tables that fit a terminal ---------------------------------------------------------------


def _brick(name: str, path: str = None, depth: int = 0, kind: str = "op") -> bp.BrickStats:
    return bp.BrickStats(name=name, path=path or name, kind=kind, device=0, depth=depth,
                         count=3, total_ns=3_000_000, min_ns=900_000, max_ns=1_100_000,
                         last_ns=1_000_000, p50_ns=1e6, p90_ns=1.1e6, p99_ns=1.1e6)


LONG = "model.layers.0.self_attn.rotary_embedding.inverse_frequency_cache_" + "x" * 40


def _report(**metadata) -> bp.Report:
    bricks = [_brick("aten::mm"), _brick(LONG, kind="range"), _brick("evil\x1b[2J\u202e")]
    paths = [_brick("aten::mm"), _brick(LONG, kind="range"),
             _brick("aten::mm", f"{LONG}/aten::mm", depth=1), _brick("evil\x1b[2J\u202e")]
    return bp.Report(bricks=bricks, paths=paths, wall_ns=20_000_000, sync_mode="event",
                     device={}, metadata=metadata or None, bricks_span_ns=10_000_000)


def test_a_file_or_a_pipe_gets_whole_rows(monkeypatch):
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # a pipe, whatever runs the test
    monkeypatch.setenv("COLUMNS", "80")
    report = _report()
    whole = report.table()
    assert whole == report.table(width=0)
    assert max(map(len, whole.splitlines())) > 150
    assert LONG in whole and "\u2026" not in whole
    for header in ("Kind", "Min us", "Max us", "P50 us", "P99 us"):
        assert header in whole


@pytest.mark.parametrize("by", ["name", "path"])
@pytest.mark.parametrize("width", [120, 80, 60])
def test_a_narrow_width_cuts_names_first_then_leaves_columns_out(by, width):
    report = _report()
    lines = report.table(by=by, width=width).splitlines()
    assert max(map(len, lines)) <= width, "\n".join(lines)
    text = "\n".join(lines).replace("\n  ", " ")  # the notes unwrapped
    assert "\u2026" in text  # LONG is cut: its start and its end shown
    assert any(line.lstrip().startswith("model.lay") and "xxxx " in line for line in lines)
    header = lines[1]
    for kept in ("Total ms", "% span"):
        assert kept in header
    left_out = [h for h in ("Kind", "Calls", "Avg us", "Min us", "Max us", "P50 us", "P99 us")
                if h not in header]
    assert "fitted to" in text and "table(width=0) shows every column" in text
    if width <= 80:
        assert {"Min us", "P50 us"} <= set(left_out)  # the least useful first
        assert f"{', '.join(left_out)} left out" in text


def test_a_wide_enough_width_changes_nothing():
    report = _report()
    whole = report.table(width=0)
    assert report.table(width=max(map(len, whole.splitlines()))) == whole


def test_a_terminal_gets_rows_of_its_width(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdout", Terminal())
    monkeypatch.setenv("COLUMNS", "90")
    for table in (_report().table(), _report().table(by="path"),
                  _module_report().table(by="module")):
        assert max(map(len, table.splitlines())) <= 90, table


def _module_report() -> bp.Report:
    outer, inner = "Model", f"Model.{LONG}"
    bricks = [_brick(outer, kind="range"), _brick(inner, kind="range")]
    paths = [_brick(outer, kind="range"), _brick(inner, f"{outer}/{inner}", 1, "range")]
    return bp.Report(bricks=bricks, paths=paths, wall_ns=20_000_000, sync_mode="event",
                     device={}, metadata={"modules": [outer, inner]})


def test_the_module_table_fits_too():
    report = _module_report()
    lines = report.table(by="module", width=70).splitlines()
    assert max(map(len, lines)) <= 70, "\n".join(lines)
    assert "Self ms" in lines[1] and "% wall" in lines[1]
    assert LONG in report.table(by="module", width=0)


def test_the_roofline_table_fits_keeping_its_rates():
    from torch_brickdev.profiler import roofline

    peak = {"flops_per_s": 1e11, "bytes_per_s": 1e11, "memory_bytes_per_s": 5e10,
            "how": "measured", "measured_at": "now", "denied_share": 0.0, "final": True}
    rows = [roofline._brick_roofline(b.path, 10**9, 10**8, b.total_ns, 0, "float32",
                                     peak).to_dict() for b in _report().paths]
    report = _report(roofline={"peaks": {"float32": peak}, "bricks": rows})
    whole = report.table(roofline=True, width=0)
    assert max(map(len, whole.splitlines())) > 190
    lines = report.table(roofline=True, width=100).splitlines()
    assert max(map(len, lines)) <= 100, "\n".join(lines)
    for kept in ("Total ms", "GFLOP/s", "%pk F", "bound"):
        assert kept in lines[1]


def test_names_are_printed_with_their_control_characters_escaped():
    report = _report()
    for width in (0, 80):
        text = report.table(width=width)
        assert "\x1b" not in text and "\u202e" not in text
        assert "evil\\x1b[2J\\u202e" in text


@pytest.mark.parametrize("width, error, match", [
    (-1, ValueError, "width must be >= 0"),
    ("80", TypeError, "width must be an int or None, got str"),
    (True, TypeError, "width must be an int or None, got bool"),
    (80.0, TypeError, "width must be an int or None, got float"),
])
def test_a_bad_width_is_refused_by_name(width, error, match):
    with pytest.raises(error, match=f"Report.table: {match}"):
        _report().table(width=width)
