"""The roofline's peaks cache (profiler/roofline_peaks.py): a measurement taken on a busy machine
is provisional and measured again by a later process, keeping the best figures; a user refreshes
them on request; a malformed cache file is ignored with a warning, never a crash; a report says
when its peaks are provisional.

The measurement itself is replaced by a fake of known figures (the machine's load must not decide
a test); test_roofline.py measures for real."""

from __future__ import annotations

import json
import warnings

import pytest

import torch_brickdev  # noqa: F401  (registers brick)
from torch_brickdev import profiler as bp
from torch_brickdev.profiler import roofline, roofline_peaks


class FakeMeasurement:
    """Stands for roofline_peaks._measure: each call returns the next of ``results``, each
    ``(GFLOP/s, denied share)``, and counts the calls."""

    def __init__(self, monkeypatch, *results):
        self.results, self.calls = list(results), 0
        monkeypatch.setattr(roofline_peaks, "_measure", self)

    def __call__(self, dtype):
        gflops, denied = self.results[self.calls]
        self.calls += 1
        return {"flops_per_s": gflops * 1e9, "bytes_per_s": gflops * 2e9,
                "memory_bytes_per_s": gflops * 1e9, "how": "a fake measurement",
                "measured_at": f"call {self.calls}", "denied_share": denied,
                "final": denied <= roofline_peaks.BUSY_SHARE, "measurements": 1}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache file of the test's own, and a fresh process as far as the cache can tell."""
    path = tmp_path / "roofline.json"
    monkeypatch.setenv("BRICK_ROOFLINE_CACHE", str(path))
    monkeypatch.delenv("BRICK_ROOFLINE_REFRESH", raising=False)
    new_process(monkeypatch)
    return path


def new_process(monkeypatch):
    """What a new process knows: nothing measured by it yet."""
    monkeypatch.setattr(roofline_peaks, "_MEASURED_HERE", set())


def cached_entry(path):
    entries = json.loads(path.read_text())
    assert len(entries) == 1, entries
    return next(iter(entries.values()))


def test_a_busy_measurement_is_measured_again_by_the_next_process_keeping_the_best(
        cache, monkeypatch):
    fake = FakeMeasurement(monkeypatch, (40.1, 0.72), (35.0, 0.5), (92.0, 0.05))
    first = roofline.peaks("float32")
    assert first["flops_per_s"] == 40.1e9 and first["final"] is False
    assert roofline_peaks.provisional(cached_entry(cache))
    # the same process does not measure again: every profile of a busy one would take seconds
    assert roofline.peaks("float32") == first and fake.calls == 1

    new_process(monkeypatch)  # busy again: still provisional, the better figures kept
    second = roofline.peaks("float32")
    assert fake.calls == 2
    assert second["flops_per_s"] == 40.1e9 and second["final"] is False
    assert second["measurements"] == 2 and second["denied_share"] == 0.5

    new_process(monkeypatch)  # a quiet machine: final
    third = roofline.peaks("float32")
    assert fake.calls == 3
    assert third["flops_per_s"] == 92.0e9 and third["final"] is True
    assert cached_entry(cache) == third

    new_process(monkeypatch)
    assert roofline.peaks("float32") == third and fake.calls == 3  # final: cached for good


def test_an_entry_without_the_final_flag_is_judged_by_its_denied_share(cache, monkeypatch):
    fake = FakeMeasurement(monkeypatch, (90.0, 0.0))
    key = roofline_peaks._machine_key("float32")
    old = {"flops_per_s": 40.1e9, "bytes_per_s": 1e10, "memory_bytes_per_s": 1e10,
           "how": "an older writer", "measured_at": "then", "denied_share": 0.72}
    cache.write_text(json.dumps({key: old}))
    assert roofline.peaks("float32")["flops_per_s"] == 90.0e9 and fake.calls == 1
    old["denied_share"] = 0.01
    cache.write_text(json.dumps({key: old}))
    new_process(monkeypatch)
    assert roofline.peaks("float32") == old and fake.calls == 1


def test_a_user_refreshes_the_peaks(cache, monkeypatch):
    fake = FakeMeasurement(monkeypatch, (92.0, 0.0), (80.0, 0.0), (85.0, 0.0), (70.0, 0.0))
    roofline.peaks("float32")
    assert roofline.peaks("float32", refresh=True)["flops_per_s"] == 80.0e9  # replaced
    assert cached_entry(cache)["flops_per_s"] == 80.0e9 and fake.calls == 2
    assert roofline.measure_peaks("float32")["flops_per_s"] == 85.0e9 and fake.calls == 3

    new_process(monkeypatch)
    monkeypatch.setenv("BRICK_ROOFLINE_REFRESH", "1")
    assert roofline.peaks("float32")["flops_per_s"] == 70.0e9 and fake.calls == 4
    assert roofline.peaks("float32")["flops_per_s"] == 70.0e9 and fake.calls == 4  # once
    with pytest.raises(TypeError, match="refresh must be a bool"):
        roofline.peaks("float32", refresh=1)
    with pytest.raises(ValueError, match="dtype"):
        roofline.peaks("int8")


@pytest.mark.parametrize("content, problem", [
    (b"\x00\xff not json", "is not JSON"),
    (b'{"truncated": {"flops_per_s": 1', "is not JSON"),
    (b"[1, 2, 3]", "holds list"),
    (b"[" * 100_000 + b"]" * 100_000, "is not JSON"),
    (b" " * (roofline_peaks.MAX_CACHE_BYTES + 1), "is larger than"),
    ("ENTRY", "flops_per_s"),
    ("ENTRY_NAN", "flops_per_s"),
    ("ENTRY_NOT_OBJECT", "must be an object"),
    ("ENTRY_BAD_SHARE", "denied_share"),
], ids=["bytes", "truncated", "list", "deep", "huge", "text-rate", "nan-rate", "entry-list",
        "share"])
def test_a_malformed_cache_is_ignored_with_a_warning_and_measured_again(cache, monkeypatch,
                                                                        content, problem):
    key = roofline_peaks._machine_key("float32")
    entry = {"flops_per_s": 1e9, "bytes_per_s": 1e9, "memory_bytes_per_s": 1e9, "how": "x",
             "measured_at": "y"}
    entries = {"ENTRY": {**entry, "flops_per_s": "fast"},
               "ENTRY_NAN": {**entry, "flops_per_s": float("nan")},
               "ENTRY_NOT_OBJECT": [1e9],
               "ENTRY_BAD_SHARE": {**entry, "denied_share": 7}}
    if isinstance(content, str):
        content = json.dumps({key: entries[content], "another machine": "kept"}).encode()
    cache.write_bytes(content)
    fake = FakeMeasurement(monkeypatch, (92.0, 0.0))
    with pytest.warns(RuntimeWarning, match=problem) as caught:
        peak = roofline.peaks("float32")
    assert str(cache) in str(caught[0].message) and "measured again" in str(caught[0].message)
    assert peak["flops_per_s"] == 92.0e9 and fake.calls == 1
    rewritten = json.loads(cache.read_text())
    assert rewritten[key] == peak
    assert roofline_peaks.entry_problem(peak) is None


def test_a_cache_that_cannot_be_read_or_written_is_measured_each_process(tmp_path, monkeypatch):
    directory = tmp_path / "roofline.json"
    directory.mkdir()  # a directory where the file should be
    monkeypatch.setenv("BRICK_ROOFLINE_CACHE", str(directory))
    new_process(monkeypatch)
    fake = FakeMeasurement(monkeypatch, (92.0, 0.0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert roofline.peaks("float32")["flops_per_s"] == 92.0e9
    messages = [str(w.message) for w in caught]
    assert any("cannot be read" in m for m in messages), messages
    assert any("cannot write" in m and "next process measures them again" in m
               for m in messages), messages
    assert fake.calls == 1 and not list(tmp_path.glob("*.tmp"))


def _report_with_peaks(peak: dict) -> bp.Report:
    row = roofline._brick_roofline("aten::mm", 2 * 64 ** 3, 3 * 4 * 64 * 64, 1_000_000, 0,
                                   "float32", peak).to_dict()
    brick = bp.BrickStats(name="aten::mm", path="aten::mm", kind="op", device=0, depth=0,
                          count=1, total_ns=1_000_000, min_ns=1_000_000, max_ns=1_000_000,
                          last_ns=1_000_000, p50_ns=1e6, p90_ns=1e6, p99_ns=1e6)
    return bp.Report(bricks=[brick], paths=[brick], wall_ns=2_000_000, sync_mode="event",
                     device={}, metadata={"roofline": {"peaks": {"float32": peak},
                                                       "bricks": [row]}})


def test_the_table_says_when_the_peaks_are_provisional(cache, monkeypatch):
    FakeMeasurement(monkeypatch, (40.1, 0.72), (92.0, 0.0))
    busy = _report_with_peaks(roofline_peaks._measure("float32"))
    text = busy.table(roofline=True, width=0)
    assert "warning: the float32 peaks are provisional" in text
    assert "72% of the time" in text and "refresh=True" in text
    quiet = _report_with_peaks(roofline_peaks._measure("float32"))
    assert "provisional" not in quiet.table(roofline=True, width=0)


def test_a_reports_malformed_peaks_are_refused_by_name():
    peak = {"flops_per_s": 1e9, "bytes_per_s": 1e9, "memory_bytes_per_s": 1e9, "how": "x",
            "measured_at": "y"}
    report = _report_with_peaks(peak)
    report.metadata["roofline"]["peaks"]["float32"] = {**peak, "how": 5}
    with pytest.raises(ValueError, match=r"metadata.roofline.peaks\['float32'\] has how 5"):
        report.table(roofline=True)
    report.metadata["roofline"]["peaks"] = ["float32"]
    with pytest.raises(ValueError, match="metadata.roofline.peaks must be an object"):
        report.roofline()
