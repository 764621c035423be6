"""The report reader and the decode-contract checker, fuzzed with hypothesis on malformed reports,
and every public function of ``torch_brickdev.profiler.report`` and ``torch_brickdev.tools.contract``
called with bad arguments from one table.

Starting point: a valid report dict built here (the shape the demo writes: fourteen decode range
bricks, an op nested in LmHead, decode metadata, health counters) that passes all eleven checks.
Mutations: a required field dropped, unknown fields added, values of the wrong type (str, list,
object, null, bool where a number is expected), huge integers, negative figures, NaN and
Infinity, floats where integers are required, odd brick names (unicode, empty, very long, lone
surrogates), duplicated names and keys, a non-object top level, deep nesting, truncated text,
invalid UTF-8, an empty file.

Properties:

* the reader returns a Report or raises ReportError naming the field by its path
  (``bricks[3].count``) and saying what was expected; never another exception, never a hang;
* a report that loaded holds no NaN or Infinity, writes back to JSON and reads back the same,
  and every check runs on it without raising (no "check raised" result); the command line
  returns 0 or 1 for it and 2, with the reason on stderr, for one that did not load;
* never a wrong verdict: a mutation that makes a report inconsistent or meaningless (a count
  disagreeing with total and avg_us, NaN or Infinity in totals of a Report built in memory, a
  negative figure, garbage decode metadata, a derived figure disagreeing with its source, a
  non-counter health value) never lets the checks it affects pass.

Decisions on what is accepted, documented in ``report.py``: unknown keys at the top level and
in brick entries are ignored (a newer writer may add fields); ``metadata`` and ``device`` are
free-form JSON kept as written, and unknown ``health`` counters are kept, but NaN and Infinity
are rejected everywhere (the writer never writes them), as are brick names that are empty or not
valid Unicode and objects that repeat a key.

The bad-input table prints ``bad input (report/contract): N calls tried, M clear`` at the end of
the module (``pytest tests/python/test_fuzz_report.py -q -s``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import json
import math
import os
import re
import shutil
import signal
import tempfile
import time
from typing import Callable, Dict, List, Optional, Tuple

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

import torch_brickdev  # noqa: F401  (registers brick)
from torch_brickdev.tools import contract
from torch_brickdev.tools.contract import CHECK_IDS, CheckResult, format_results, run_checks
from torch_brickdev.profiler import Report, load_report
from torch_brickdev.profiler import _report_schema
from torch_brickdev.profiler.report import ReportError
from torch_brickdev.profiler.report_key_averages import compare_with_key_averages, folded_by_pytorch

# Every property is deterministic (derandomize) and uses no example database, so CI runs the
# same examples every time; deadline: one example taking over 2 s is a failure (a hang guard,
# beside the alarm of _no_hang()).
FUZZ = settings(max_examples=150, deadline=2000, derandomize=True, database=None)
FEW = settings(FUZZ, max_examples=60)

# ---- a valid report -----------------------------------------------------------------------------

LAYERS, TOKENS = 2, 4
# Per-call nanoseconds of the decode bricks: all different, LmHead > GateProjection > RmsNorm and
# LmHead > 10 x RmsNorm, as in a real decode.
AVG_NS = {
    "Embedding": 4_000, "RmsNorm": 3_000, "QkvProjection": 20_000, "RopeEmbedding": 5_000,
    "AttentionScore": 9_000, "AttentionSoftmax": 6_000, "AttentionOutput": 8_000,
    "OutputProjection": 15_000, "GateProjection": 30_000, "UpProjection": 29_000,
    "Activation": 7_000, "DownProjection": 31_000, "LmHead": 400_000, "Sampling": 11_000,
}
PER_TOKEN = {"Embedding": 1, "RmsNorm": 2 * LAYERS + 1, "LmHead": 1, "Sampling": 1}


def _entry(name: str, path: str, kind: str, depth: int, count: int, avg_ns: int) -> dict:
    total = avg_ns * count
    return dict(name=name, path=path, kind=kind, device=0, depth=depth, count=count,
                total_ns=total, min_ns=avg_ns - 200, max_ns=avg_ns + 300, last_ns=avg_ns,
                p50_ns=float(avg_ns), p90_ns=float(avg_ns + 100), p99_ns=float(avg_ns + 250),
                avg_us=total / count / 1000)


def valid_report() -> dict:
    """A report dict as Report.to_json() writes it, passing every contract check."""
    bricks, paths = [], []
    for name, avg in AVG_NS.items():
        count = TOKENS * PER_TOKEN.get(name, LAYERS)
        bricks.append(_entry(name, name, "range", 0, count, avg))
        paths.append(_entry(name, name, "range", 0, count, avg))
    bricks.append(_entry("aten::mm", "aten::mm", "op", 0, TOKENS, 350_000))
    paths.append(_entry("aten::mm", "LmHead/aten::mm", "op", 1, TOKENS, 350_000))
    top = sum(p["total_ns"] for p in paths if p["depth"] == 0)
    wall = int(top / 0.93)
    per_token = wall // TOKENS
    latencies = [per_token - 900, per_token + 1_100, per_token, per_token + 37]
    return {
        "schema": "torch_brickdev.report", "version": 1, "created": "2026-01-01T00:00:00+00:00",
        "torch": "2.13.0", "sync_mode": "event",
        "device": {"type": "brick", "runtime": "host", "backing": "cpu", "count": 2},
        "wall_ns": wall, "wall_s": wall / 1e9, "top_level_ns": top,
        "metadata": {"decode": {
            "model": "tiny", "layers": LAYERS, "tokens": TOKENS, "runs": 3, "sync_mode": "event",
            "token_latencies_ns": latencies, "run_mean_token_ns": [per_token, per_token * 1.02,
                                                                    per_token * 0.99],
            "tokens_per_s": TOKENS / sum(latencies) * 1e9, "p50_token_ns": per_token,
            "p99_token_ns": per_token + 1_100, "final_token": "<id 7>"}},
        "health": {"unbalanced_exits": 0, "timing_failures": 0, "pending_events": 0,
                   "live_events": 12},
        "bricks": bricks, "paths": paths,
    }


BASE = valid_report()
BASE_TEXT = json.dumps(BASE)


def statuses(results) -> Dict[str, str]:
    return {r.id: r.status for r in results}


def test_the_base_report_is_valid_and_passes_every_check():
    results = run_checks(copy.deepcopy(BASE))
    assert all(r.status == "pass" for r in results), format_results(results)
    assert len(results) == len(CHECK_IDS)


def test_a_real_report_round_trips_through_the_reader(tmp_path):
    import torch
    from torch.profiler import record_function
    from torch_brickdev import profiler as bp

    x = torch.ones(8, 8, device="brick")
    with bp.profile(metadata={"run": "fuzz"}) as prof:
        with record_function("Outer"):
            torch.mm(x, x)
    path = prof.report.write_json(tmp_path / "real.json")
    loaded = load_report(path)
    assert loaded.to_dict() == prof.report.to_dict()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert contract.main([path]) in (0, 1)  # a verdict either way: not a decode
    assert out.getvalue().splitlines()[-1].startswith("verdict: ")


# ---- helpers ------------------------------------------------------------------------------------


class Hang(Exception):
    pass


@contextlib.contextmanager
def _no_hang(seconds: float = 5.0):
    """Fails (instead of hanging CI) when the body runs longer than ``seconds``."""
    def alarm(signum, frame):
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:  # re-arm the timer this one replaced (pytest-timeout's, for the whole test)
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 1e-3))


_path_text = _report_schema._path_text  # the reader's own naming of a field


def _get(data, path: Tuple):
    for part in path:
        data = data[part]
    return data


def _set(data, path: Tuple, value) -> None:
    _get(data, path[:-1])[path[-1]] = value


def _floats_in(value) -> List[float]:
    if isinstance(value, float):
        return [value]
    if isinstance(value, dict):
        return [f for v in value.values() for f in _floats_in(v)]
    if isinstance(value, (list, tuple)):
        return [f for v in value for f in _floats_in(v)]
    return []


def _load_outcome(source):
    """(Report, None) or (None, ReportError); any other exception propagates: a failure."""
    with _no_hang():
        try:
            return load_report(source), None
        except ReportError as error:
            return None, error


def _assert_clear_error(error: ReportError, where: str, field_path: Optional[str] = None):
    message = str(error)
    assert message.startswith(f"{where}: "), message
    assert re.search(r"must|expected|missing|understands", message), message
    if field_path is not None:
        assert field_path in message, (field_path, message)
    assert "Traceback" not in message


def _assert_sound(report: Report) -> None:
    """What every report that loaded must satisfy."""
    assert not [f for f in _floats_in(report.to_dict()) if not math.isfinite(f)]
    assert report.validate() is report  # what the reader accepts, the in-memory rules accept
    again = load_report(json.loads(report.to_json()))  # writes and reads back, unchanged
    assert again.to_dict() == report.to_dict()
    with _no_hang():
        results = run_checks(report)
        text = format_results(results)
    assert [r.id for r in results] == list(CHECK_IDS)
    crashed = [r.message for r in results if r.message.startswith("check raised")]
    assert not crashed, crashed
    assert all(r.status in ("pass", "fail", "n/a") and r.message for r in results)
    assert text.splitlines()[-1].startswith("verdict: ")
    report.table()
    report.table(by="path", sort_by="avg")


# ---- strategies: where the schema is, and what breaks it ----------------------------------------

TOP_REQUIRED = ("schema", "version", "sync_mode", "wall_ns", "device", "bricks", "paths")
BRICK_FIELDS = ("name", "path", "kind", "device", "depth", "count", "total_ns", "min_ns",
                "max_ns", "last_ns", "p50_ns", "p90_ns", "p99_ns")
INT_FIELDS = ("device", "depth", "count", "total_ns", "min_ns", "max_ns", "last_ns")
NUMBER_FIELDS = ("p50_ns", "p90_ns", "p99_ns", "avg_us")
N_ENTRIES = len(BASE["bricks"])

sections = st.sampled_from(["bricks", "paths"])
entry_index = st.integers(0, N_ENTRIES - 1)
non_finite = st.sampled_from([math.nan, math.inf, -math.inf])
huge_ints = st.sampled_from([2**63, 2**80, -(2**80), 10**40])
junk_values = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
    st.text(max_size=20), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3), huge_ints)


@st.composite
def brick_field_paths(draw, fields=BRICK_FIELDS):
    return (draw(sections), draw(entry_index), draw(st.sampled_from(fields)))


def _wrong_type_for(field: str):
    """Values of the wrong JSON type for a schema field."""
    common = [None, [], {}, [1, 2], {"a": 1}]
    if field in INT_FIELDS + ("wall_ns", "version", "top_level_ns"):
        return common + ["7", True, False, 3.0, 7.5, -0.0]
    if field in NUMBER_FIELDS + ("wall_s",):
        return common + ["1.5", True, False]
    if field in ("name", "path", "kind", "sync_mode", "created", "torch"):
        return common + [7, 1.5, True]
    return common + [7, "text", True]  # objects and arrays; the caller drops the right type


@st.composite
def wrong_typed(draw):
    """A schema field (top level or brick entry) set to a value of the wrong type."""
    if draw(st.booleans()):
        key = draw(st.sampled_from(("version", "sync_mode", "wall_ns", "device", "bricks",
                                    "paths", "metadata", "health", "created", "torch", "wall_s",
                                    "top_level_ns")))
        path = (key,)
    else:
        path = draw(brick_field_paths(BRICK_FIELDS + ("avg_us",)))
        key = path[-1]
    values = _wrong_type_for(key)
    if key in ("device", "metadata", "health"):
        values = [v for v in values if not isinstance(v, dict)]
    if key in ("bricks", "paths"):
        values = [v for v in values if not isinstance(v, list)]
    return path, draw(st.sampled_from(values))


@st.composite
def out_of_range(draw):
    """An integer field set to a huge, negative or fractional number."""
    path = draw(st.one_of(brick_field_paths(INT_FIELDS + NUMBER_FIELDS),
                          st.just(("wall_ns",)), st.just(("top_level_ns",)),
                          st.just(("wall_s",)), st.just(("health", "pending_events"))))
    field = path[-1]
    low = -2 if field == "device" else -1  # device -1 means "several devices": valid
    bad = [low, -10**6, -1.5] + ([2**63, 2**80, 10**40] if field not in NUMBER_FIELDS + ("wall_s",)
                                 else [])
    if field in INT_FIELDS + ("wall_ns", "top_level_ns", "pending_events"):
        bad.append(draw(st.floats(0.5, 1e6).filter(lambda f: not f.is_integer())))
    return path, draw(st.sampled_from(bad))


@st.composite
def anywhere_paths(draw):
    """A path to any value of the report, metadata and health included (never the root)."""
    data, path = BASE, ()
    while isinstance(data, (dict, list)) and data:
        keys = list(data) if isinstance(data, dict) else list(range(len(data)))
        key = draw(st.sampled_from(keys))
        path, data = path + (key,), data[key]
        if not draw(st.integers(0, 3)):
            break
    return path


# ---- 1. the reader on dict sources ---------------------------------------------------------------


@FUZZ
@given(path=st.one_of(st.sampled_from([(k,) for k in TOP_REQUIRED]), brick_field_paths()))
def test_a_missing_required_field_is_named(path):
    data = copy.deepcopy(BASE)
    del _get(data, path[:-1])[path[-1]]
    report, error = _load_outcome(data)
    assert report is None
    _assert_clear_error(error, "report", repr(path[-1]))
    if len(path) > 1:
        assert _path_text(path[:-1]) in str(error)
    assert "missing" in str(error) or "schema" in str(error)


@FUZZ
@given(case=wrong_typed())
def test_a_wrong_type_is_named_with_what_was_expected(case):
    path, value = case
    data = copy.deepcopy(BASE)
    _set(data, path, value)
    report, error = _load_outcome(data)
    assert report is None, (path, value)
    _assert_clear_error(error, "report", repr(path[-1]))
    if len(path) > 1:
        assert _path_text(path) in str(error)


@FUZZ
@given(case=out_of_range())
def test_out_of_range_numbers_are_rejected(case):
    path, value = case
    data = copy.deepcopy(BASE)
    _set(data, path, value)
    report, error = _load_outcome(data)
    assert report is None, (path, value)
    _assert_clear_error(error, "report", _path_text(path) if len(path) > 1 else repr(path[0]))


@FUZZ
@given(path=anywhere_paths(), value=non_finite)
def test_nan_and_infinity_are_rejected_anywhere(path, value):
    data = copy.deepcopy(BASE)
    _set(data, path, value)
    report, error = _load_outcome(data)
    assert report is None, f"NaN/Infinity at {_path_text(path)} loaded"
    message = str(error)
    assert _path_text(path) in message or repr(path[-1]) in message, message


@FUZZ
@given(path=anywhere_paths(), value=junk_values)
def test_any_value_anywhere_loads_soundly_or_is_a_clear_error(path, value):
    """The broad property: whatever replaces whatever, ReportError or a sound report."""
    data = copy.deepcopy(BASE)
    _set(data, path, value)
    report, error = _load_outcome(data)
    if report is None:
        _assert_clear_error(error, "report")
        return
    _assert_sound(report)


@FUZZ
@given(path=anywhere_paths(), key=st.text(min_size=1, max_size=12), value=junk_values)
def test_unknown_fields_are_ignored_or_kept_never_fatal(path, key, value):
    """Unknown keys: ignored at the top level and in brick entries, kept in free-form sections
    (metadata, device, health counters if they are counters)."""
    data = copy.deepcopy(BASE)
    container_path = path
    while not isinstance(_get(data, container_path), dict):
        container_path = container_path[:-1]
    container = _get(data, container_path)
    assume(key not in container)
    if isinstance(value, float) and not math.isfinite(value):
        value = 0.5  # NaN has its own property; here: an unknown key with a legal value
    container[key] = value
    report, error = _load_outcome(data)
    free_form = container_path[:1] in (("metadata",), ("device",))
    health_counter = container_path == ("health",) and isinstance(value, int) and not isinstance(
        value, bool) and 0 <= value < 2**63
    if container_path[:1] == ("health",) and not health_counter:
        assert report is None and _path_text(("health", key)) in str(error), str(error)
        return
    assert error is None, str(error)
    _assert_sound(report)
    baseline = load_report(copy.deepcopy(BASE)).to_dict()
    loaded = report.to_dict()
    for d in (loaded, baseline):
        d.pop("created")
    if free_form or health_counter:
        assert _get(loaded, container_path)[key] == value  # kept as written
    else:
        assert loaded == baseline  # ignored


names = st.one_of(
    st.text(alphabet=st.characters(exclude_categories=()), min_size=1, max_size=40),
    st.sampled_from(["注意力", "Ωμέγα/π", "emoji 🧱", "a" * 100_000, " ", "\t\n", "x\u0000y",
                     "a\ud800b", "LmHead", "aten::mm"]))


@FUZZ
@given(name=names, index=entry_index, section=sections)
def test_unicode_and_long_names_load_and_keep(name, index, section):
    data = copy.deepcopy(BASE)
    data[section][index]["name"] = name
    report, error = _load_outcome(data)
    if re.search("[\ud800-\udfff]", name):  # a lone surrogate: not valid Unicode text
        assert report is None and f"{section}[{index}]" in str(error) and "Unicode" in str(error)
        return
    assert error is None, str(error)
    assert getattr(report, section)[index].name == name
    _assert_sound(report)
    if name != BASE[section][index]["name"]:
        # the by-name and by-path views no longer agree, or a decode brick went missing
        assert statuses(run_checks(report))["completeness"] == "fail"


@FUZZ
@given(name=st.sampled_from(["", "\ud800", "a\udfffb"]), index=entry_index, section=sections,
       field=st.sampled_from(["name", "path"]))
def test_empty_names_and_lone_surrogates_are_rejected(name, index, section, field):
    data = copy.deepcopy(BASE)
    data[section][index][field] = name
    report, error = _load_outcome(data)
    assert report is None
    _assert_clear_error(error, "report", f"{section}[{index}].{field}")


@FUZZ
@given(index=entry_index, other=entry_index)
def test_duplicate_brick_names_load_and_fail_completeness(index, other):
    assume(index != other)
    data = copy.deepcopy(BASE)
    data["bricks"][other] = copy.deepcopy(data["bricks"][index])
    report, error = _load_outcome(data)
    assert error is None
    _assert_sound(report)
    result = {r.id: r for r in run_checks(report)}["completeness"]
    assert result.status == "fail" and "duplicate brick name" in result.message


@FUZZ
@given(top=st.one_of(st.lists(st.integers(), max_size=3), st.integers(), st.floats(),
                     st.text(max_size=10), st.none(), st.booleans()))
def test_a_top_level_that_is_not_an_object_is_rejected(top):
    # as file content (a non-dict source argument is a TypeError: see the bad-input table)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(json.dumps(top))
    try:
        report, error = _load_outcome(f.name)
    finally:
        os.unlink(f.name)
    assert report is None
    assert "must hold a JSON object" in str(error) and f.name in str(error)


# ---- 2. the reader on files: text and bytes -----------------------------------------------------

# This process's folder of report files, made (with GOOD_FILE) by the module's fixture each time
# it is set up, and removed at its teardown: a worker that steals this module's tests after it
# tore the fixture down gets them again, and one that runs none of them leaves nothing behind.
FILES = os.path.join(tempfile.gettempdir(), f"fuzz_report_{os.getpid()}")
_counter = [0]


def _file(content) -> str:
    _counter[0] += 1
    path = os.path.join(FILES, f"r{_counter[0]}.json")
    with open(path, "wb") as f:
        f.write(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
    return path


def _run_cli(path: str) -> Tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _no_hang():
        code = contract.main([path])
    return code, out.getvalue(), err.getvalue()


def _check_file(path: str, expect_error: Optional[str] = None) -> None:
    """load_report and the command line agree: a sound report and 0/1, or ReportError and 2."""
    report, error = _load_outcome(path)
    code, out, err = _run_cli(path)
    if report is None:
        _assert_clear_error(error, path)
        if expect_error is not None:
            assert expect_error in str(error), str(error)
        assert code == 2 and path in err and "Traceback" not in err and not out
    else:
        assert expect_error is None, f"expected an error about {expect_error}"
        _assert_sound(report)
        assert code in (0, 1) and out.splitlines()[-1].startswith("verdict: ") and not err


@FUZZ
@given(cut=st.integers(0, len(BASE_TEXT) - 1))
def test_truncated_text_is_not_valid_json(cut):
    text = BASE_TEXT[:cut]
    _check_file(_file(text), "the file is empty" if not text.strip() else "not valid JSON")


@FUZZ
@given(position=st.integers(0, len(BASE_TEXT)), junk=st.binary(min_size=1, max_size=4))
def test_invalid_utf8_bytes_are_named(position, junk):
    raw = BASE_TEXT.encode()
    raw = raw[:position] + junk + raw[position:]
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        _check_file(_file(raw), "not UTF-8")
        return
    _check_file(_file(raw))  # valid UTF-8 after all: a sound report or a clear error


@FUZZ
@given(depth=st.integers(1, 200_000), opener=st.sampled_from(["[", '{"a":']))
@example(depth=99, opener="[").via("the deepest that loads")
@example(depth=100, opener='{"a":').via("one level too deep")
@example(depth=5_000, opener="[").via("deeper than json's recursion limit")
def test_deep_nesting_is_an_error_not_a_recursion_error(depth, opener):
    nested = opener * depth + "1" + ("]" if opener == "[" else "}") * depth
    data = copy.deepcopy(BASE)
    data["metadata"]["deep"] = "@@"
    path = _file(json.dumps(data).replace('"@@"', nested))
    # metadata is level 0 and metadata.deep level 1: the innermost value is at level depth + 1
    _check_file(path, None if depth + 1 <= 100 else "nested")


@FUZZ
@given(digits=st.integers(20, 20_000), path=brick_field_paths(INT_FIELDS))
def test_long_integer_literals_are_out_of_range(digits, path):
    data = copy.deepcopy(BASE)
    _set(data, path, "@@")
    text = json.dumps(data).replace('"@@"', "9" * digits)
    _check_file(_file(text), _path_text(path))


@FUZZ
@given(path=brick_field_paths(), literal=st.sampled_from(["NaN", "Infinity", "-Infinity",
                                                         "1e400", "-1e999"]))
def test_nan_literals_in_the_text_are_named(path, literal):
    data = copy.deepcopy(BASE)
    _set(data, path, "@@")
    text = json.dumps(data).replace('"@@"', literal)
    _check_file(_file(text), _path_text(path))


@FUZZ
@given(path=st.one_of(brick_field_paths(), st.just(("wall_ns",)), st.just(("health",
                                                                            "pending_events"))))
def test_a_repeated_key_is_rejected(path):
    """JSON readers disagree on which of two values of a key wins: refuse to guess."""
    data = copy.deepcopy(BASE)
    key = path[-1]
    _set(data, path, "@@")
    text = json.dumps(data).replace('"@@"', f'{json.dumps(_get(BASE, path))}, "{key}": 1')
    container = _path_text(path[:-1]) if len(path) > 1 else "the report"
    _check_file(_file(text), container)


@pytest.mark.parametrize("content, words", [
    (b"", "the file is empty"), (b"   \n\t", "the file is empty"),
    (b"\xef\xbb\xbf" + BASE_TEXT.encode(), None),  # a byte-order mark: accepted
    (b"\xff\xfe" + BASE_TEXT.encode("utf-16-le"), "not UTF-8"),
    (b"null", "must hold a JSON object"), (b"[]", "must hold a JSON object"),
    (b'"report"', "must hold a JSON object"), (b"42", "must hold a JSON object"),
    (b"{}", "field 'schema'"), (b"{,}", "not valid JSON"), (b"\x00" * 10, "not valid JSON"),
], ids=["empty", "blank", "bom", "utf16", "null", "list", "string", "number", "empty-object",
        "garbage", "nul-bytes"])
def test_odd_files(content, words):
    _check_file(_file(content), words)


def test_a_directory_and_a_missing_file_are_unreadable():
    for path in (FILES, os.path.join(FILES, "absent.json")):
        report, error = _load_outcome(path)
        assert report is None and str(error).startswith(f"{path}: cannot read")
        assert _run_cli(path)[0] == 2


# ---- 3. never a wrong verdict ---------------------------------------------------------------------


@FUZZ
@given(section=sections, index=entry_index, factor=st.one_of(
    st.floats(0.01, 0.97), st.floats(1.03, 1000.0), st.integers(2, 10**6)))
def test_a_count_disagreeing_with_total_and_avg_fails_avg_agreement(section, index, factor):
    data = copy.deepcopy(BASE)
    entry = data[section][index]
    count = max(1, int(entry["count"] * factor))
    # within the tolerance after rounding is not a disagreement
    assume(abs(entry["total_ns"] / count / 1000 - entry["avg_us"]) > 0.011 * entry["avg_us"])
    entry["count"] = count
    # from the dict (or the file), as the command line does: the checks see avg_us as written
    result = {r.id: r for r in run_checks(data)}["avg-agreement"]
    assert result.status == "fail", result.message
    assert entry["path"] in result.message


@FUZZ
@given(section=sections, index=entry_index)
def test_a_zero_count_with_time_fails_avg_agreement_and_completeness(section, index):
    data = copy.deepcopy(BASE)
    data[section][index]["count"] = 0
    results = {r.id: r for r in run_checks(data)}
    assert results["avg-agreement"].status == "fail"
    assert "ran 0 times" in results["avg-agreement"].message
    assert results["completeness"].status == "fail"


# In-memory reports (built by code, then changed) skip the reader: the checks themselves must not
# pass on NaN, Infinity, a negative figure or a non-number.
BAD_FIGURES = [math.nan, math.inf, -math.inf, -1, -2.5, None, "12", [3]]

# the checks that read a brick figure, for an entry that is top level (a depth-0 path)
AFFECTED_BY_FIELD = {
    "total_ns": {"no-placeholders", "avg-agreement"},
    "min_ns": {"no-placeholders"}, "max_ns": {"no-placeholders"},
    "p50_ns": {"no-placeholders"}, "p90_ns": {"no-placeholders"}, "p99_ns": {"no-placeholders"},
    "count": {"no-placeholders", "avg-agreement", "completeness"},
}


@FUZZ
@given(section=sections, index=entry_index, field=st.sampled_from(sorted(AFFECTED_BY_FIELD)),
       value=st.sampled_from(BAD_FIGURES))
def test_bad_figures_in_memory_never_pass_the_checks_that_read_them(section, index, field, value):
    report = load_report(copy.deepcopy(BASE))
    entries = getattr(report, section)
    entry = entries[index]
    entries[index] = dataclasses.replace(entry, **{field: value})
    affected = set(AFFECTED_BY_FIELD[field])
    if section == "paths" and entry.depth == 0 and field == "total_ns":
        affected.add("coverage")
    if section == "bricks" and entry.name in ("LmHead", "GateProjection", "RmsNorm") and \
            field in ("total_ns", "count") and not (field == "count" and value == 0):
        affected.add("per-call-ordering")
    if section == "bricks" and entry.name == "LmHead" and field == "count":
        affected |= {"lmhead-count", "token-accounting"}
    with _no_hang():
        results = statuses(run_checks(report))
    passed = {c for c in affected if results[c] == "pass"}
    assert not passed, (section, entry.name, field, value, results)


@FUZZ
@given(section=sections, index=entry_index, field=st.sampled_from(sorted(AFFECTED_BY_FIELD)),
       value=st.sampled_from(BAD_FIGURES))
def test_a_bad_figure_in_memory_is_named_by_validate_and_fails_every_check(section, index,
                                                                          field, value):
    report = load_report(copy.deepcopy(BASE))
    entries = getattr(report, section)
    entries[index] = dataclasses.replace(entries[index], **{field: value})
    named = f"{section}[{index}].{field}: field {field!r} must be"
    with pytest.raises(ReportError, match=re.escape(f"Report: {named}")):
        report.validate()
    results = run_checks(report)
    assert [r.status for r in results] == ["fail"] * len(CHECK_IDS)
    assert all(named in r.message for r in results), format_results(results)


@FUZZ
@given(value=st.sampled_from(BAD_FIGURES + [0, 1.5, True]))
def test_a_bad_wall_time_in_memory_fails_coverage_and_no_placeholders(value):
    report = load_report(copy.deepcopy(BASE))
    report.wall_ns = value
    results = statuses(run_checks(report))
    assert results["coverage"] != "pass" and results["no-placeholders"] != "pass", results


DECODE_AFFECTED = {
    "tokens": {"lmhead-count", "structure"}, "layers": {"structure"},
    "tokens_per_s": {"token-accounting", "no-placeholders"},
    "token_latencies_ns": {"token-accounting", "no-placeholders"},
    "run_mean_token_ns": {"stability", "no-placeholders"},
    "p50_token_ns": {"no-placeholders"}, "p99_token_ns": {"no-placeholders"},
}
bad_metadata_values = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, None, "8", True, False, 0, -3, 0.0, -1e9,
                     10**400 - 1, 1e308, 5e-324, [], {}, [math.nan], ["x"], [0], [-1.0, 2.0],
                     [1e308, 1e308, 1e308]]),
    st.lists(st.sampled_from([math.nan, -1, 0, "1", None, math.inf]), min_size=1, max_size=4))


def _measurement(x) -> bool:
    """A finite number > 0: odd (1e308, 5e-324) but a measurement all the same."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(float(x)) and x > 0
    except OverflowError:
        return False


def _decode_affected(key: str, value) -> set:
    """The checks that must not pass with metadata.decode[key] = value."""
    checks = set(DECODE_AFFECTED[key])
    if key in ("tokens", "layers"):
        return checks  # anything but the true T and L breaks the counts or is no count
    values = value if isinstance(value, list) else [value]
    if all(_measurement(v) for v in values):
        # odd measurements are measurements: only the checks comparing them with others apply
        checks -= {"no-placeholders", "stability"}
    if value == []:
        checks.discard("no-placeholders")  # no figure at all is not a placeholder figure
    return checks


@FUZZ
@given(key=st.sampled_from(sorted(DECODE_AFFECTED)), value=bad_metadata_values,
       element=st.booleans(), in_memory=st.booleans())
def test_garbage_decode_metadata_never_passes_the_checks_that_read_it(key, value, element,
                                                                      in_memory):
    decode = copy.deepcopy(BASE["metadata"]["decode"])
    if element and isinstance(decode[key], list) and not isinstance(value, list):
        decode[key][1] = value  # one bad element in a good list
    else:
        decode[key] = value
    assume(not (key == "run_mean_token_ns" and decode[key] == []))  # no runs: nothing claimed
    if in_memory:
        report = load_report(copy.deepcopy(BASE))
        report.metadata["decode"] = decode
    else:
        data = copy.deepcopy(BASE)
        data["metadata"]["decode"] = decode
        report, error = _load_outcome(data)
        if report is None:  # NaN and Infinity never load
            assert any(not math.isfinite(f) for f in _floats_in(decode)), str(error)
            assert f"metadata.decode.{key}" in str(error)
            return
    with _no_hang():
        results = run_checks(report)
    crashed = [r.message for r in results if r.message.startswith("check raised")]
    assert not crashed, crashed
    by_id = statuses(results)
    passed = {c for c in _decode_affected(key, decode[key]) if by_id[c] == "pass"}
    assert not passed, (key, decode[key], by_id)


@FUZZ
@given(field=st.sampled_from(["top_level_ns", "wall_s"]), delta=st.one_of(
    st.integers(1, 10**9), st.integers(-10**6, -1)))
def test_a_derived_figure_disagreeing_with_its_source_fails_coverage(field, delta):
    data = copy.deepcopy(BASE)
    if field == "wall_s":
        data["wall_s"] = max(0.0, data["wall_s"] + delta / 1e6)
    else:
        data["top_level_ns"] = max(0, data["top_level_ns"] + delta)
    result = {r.id: r for r in run_checks(data)}["coverage"]
    assert result.status == "fail" and f"file's {field}" in result.message, result.message


@FUZZ
@given(key=st.sampled_from(["timing_failures", "pending_events", "unbalanced_exits",
                            "skipped_capture", "graph_captures"]),
       value=st.sampled_from([1, 2**40, math.nan, math.inf, -1, None, False, True, 0.0, "0"]))
def test_health_that_is_not_a_zero_counter_never_passes_graph_capture(key, value):
    # in memory: anything; through the reader: only counters load
    report = load_report(copy.deepcopy(BASE))
    report.health[key] = value
    assert statuses(run_checks(report))["graph-capture"] == "fail"
    data = copy.deepcopy(BASE)
    data["health"][key] = value
    loaded, error = _load_outcome(data)
    if loaded is None:
        assert f"health.{key}" in str(error)
    else:
        assert statuses(run_checks(loaded))["graph-capture"] == "fail"


@FEW
@given(name=st.sampled_from(["status", "message", "check_id", "figures", "id"]),
       value=st.integers(0, 3))
def test_health_counters_named_like_result_fields_do_not_crash(name, value):
    data = copy.deepcopy(BASE)
    data["health"][name] = value
    report, error = _load_outcome(data)
    assert error is None
    result = {r.id: r for r in run_checks(report)}["graph-capture"]
    assert not result.message.startswith("check raised"), result.message
    assert result.figures[name] == value


# ---- 4. bad arguments, from one table ---------------------------------------------------------

TRIED: Dict[str, bool] = {}


@dataclasses.dataclass
class Case:
    id: str
    call: Callable[[], object]
    error: type  # the exception expected; SystemExit-like CLI cases: int exit status
    pattern: str  # must match: names the argument and what was expected
    received: Optional[str] = None  # must appear too: the bad value or its type


class _FakeAverage:
    key, count, device_time_total = "aten::mm", 1, 12.0


class _FakeProfile:
    def key_averages(self):
        return [_FakeAverage()]


def _report() -> Report:
    return load_report(copy.deepcopy(BASE))


def _report_with_metadata(value) -> Report:
    report = _report()
    report.metadata = {"decode": {"tokens_per_s": value}, "tags": {1, 2}} if value == "set" \
        else {"decode": {"tokens_per_s": value}}
    return report


def _report_with_wall(value) -> Report:
    report = _report()
    report.wall_ns = value
    return report


def _report_with_bricks(bricks) -> Report:
    report = _report()
    report.bricks = bricks
    return report


def _good_args(**override) -> dict:
    report = _report()
    args = dict(bricks=report.bricks, paths=report.paths, wall_ns=report.wall_ns,
                sync_mode="event", device={"type": "brick"})
    args.update(override)
    return args


GOOD_FILE = os.path.join(FILES, "good.json")
MISSING_FILE = os.path.join(FILES, "absent", "report.json")

CASES: List[Case] = [
    # load_report
    Case("load_report-None", lambda: load_report(None), TypeError,
         r"load_report: source must be a path .* or a dict", "NoneType"),
    Case("load_report-int", lambda: load_report(123), TypeError, r"source must be a path", "int"),
    Case("load_report-list", lambda: load_report([BASE]), TypeError, r"source must be a path",
         "list"),
    Case("load_report-Report", lambda: load_report(_report()), TypeError,
         r"source must be a path", "Report"),
    Case("load_report-empty-path", lambda: load_report(""), ReportError,
         r"source is an empty path; expected a report file"),
    Case("load_report-NUL", lambda: load_report("a\0b"), ReportError,
         r"source .* contains a NUL character; expected a path", "'a\\x00b'"),
    Case("load_report-missing", lambda: load_report(MISSING_FILE), ReportError,
         r"cannot read", MISSING_FILE),
    Case("load_report-bad-dict", lambda: load_report({"schema": 1}), ReportError,
         r"field 'schema' must be 'torch_brickdev.report'", "integer 1"),
    # Report()
    Case("Report-bricks-None", lambda: Report(**_good_args(bricks=None)), TypeError,
         r"Report: bricks must be a list of BrickStats", "NoneType"),
    Case("Report-bricks-str", lambda: Report(**_good_args(bricks="ab")), TypeError,
         r"bricks must be a list of BrickStats", "str"),
    Case("Report-bricks-item", lambda: Report(**_good_args(bricks=[1])), TypeError,
         r"bricks\[0\] must be a BrickStats", "int"),
    Case("Report-bricks-dicts", lambda: Report(**_good_args(bricks=BASE["bricks"])), TypeError,
         r"bricks\[0\] must be a BrickStats", "dict"),
    Case("Report-paths-None", lambda: Report(**_good_args(paths=None)), TypeError,
         r"paths must be a list of BrickStats", "NoneType"),
    Case("Report-wall_ns-None", lambda: Report(**_good_args(wall_ns=None)), TypeError,
         r"wall_ns must be an int", "NoneType"),
    Case("Report-wall_ns-float", lambda: Report(**_good_args(wall_ns=1.5)), TypeError,
         r"wall_ns must be an int", "float"),
    Case("Report-wall_ns-bool", lambda: Report(**_good_args(wall_ns=True)), TypeError,
         r"wall_ns must be an int", "bool"),
    Case("Report-wall_ns-str", lambda: Report(**_good_args(wall_ns="100")), TypeError,
         r"wall_ns must be an int", "str"),
    Case("Report-wall_ns-negative", lambda: Report(**_good_args(wall_ns=-1)), ValueError,
         r"wall_ns must be >= 0", "-1"),
    Case("Report-sync_mode-None", lambda: Report(**_good_args(sync_mode=None)), TypeError,
         r"sync_mode.*SyncMode or a str", "NoneType"),
    Case("Report-sync_mode-unknown", lambda: Report(**_good_args(sync_mode="fast")), ValueError,
         r"sync_mode.*(immediate|deferred|event)", "'fast'"),
    Case("Report-device-None", lambda: Report(**_good_args(device=None)), TypeError,
         r"device must be a dict", "NoneType"),
    Case("Report-device-str", lambda: Report(**_good_args(device="brick:0")), TypeError,
         r"device must be a dict", "str"),
    Case("Report-metadata-list", lambda: Report(**_good_args(metadata=[("a", 1)])), TypeError,
         r"metadata must be a dict or None", "list"),
    Case("Report-health-str", lambda: Report(**_good_args(health="ok")), TypeError,
         r"health must be a dict or None", "str"),
    Case("Report-created-int", lambda: Report(**_good_args(created=5)), TypeError,
         r"created must be a str or None", "int"),
    Case("Report-torch_version-float", lambda: Report(**_good_args(torch_version=2.1)),
         TypeError, r"torch_version must be a str or None", "float"),
    Case("Report-written-dict", lambda: Report(**_good_args(written={"wall_s": 1.0})),
         TypeError, r"Report: written must be a WrittenFigures or None", "dict"),
    Case("Report.validate-NaN-wall", lambda: _report_with_wall(math.nan).validate(), ReportError,
         r"Report: field 'wall_ns' must be an integer >= 0", "NaN"),
    Case("Report.validate-bricks-item", lambda: _report_with_bricks([1]).validate(), ReportError,
         r"Report: bricks\[0\] must be an object", "integer 1"),
    Case("Report.capture-wall_ns", lambda: Report.capture(wall_ns=None, sync_mode="event"),
         TypeError, r"wall_ns must be an int", "NoneType"),
    Case("Report.capture-sync_mode", lambda: Report.capture(wall_ns=1, sync_mode=3), TypeError,
         r"sync_mode.*SyncMode or a str", "int"),
    Case("Report.capture-metadata", lambda: Report.capture(wall_ns=1, sync_mode="event",
                                                           metadata="x"),
         TypeError, r"metadata must be a dict or None", "str"),
    # Report methods
    Case("brick-None", lambda: _report().brick(None), TypeError, r"name must be a str",
         "NoneType"),
    Case("brick-int", lambda: _report().brick(3), TypeError, r"name must be a str", "int"),
    Case("brick-unknown", lambda: _report().brick("Nope"), KeyError, r"no brick named", "'Nope'"),
    Case("contains-None", lambda: None in _report(), TypeError, r"name must be a str",
         "NoneType"),
    Case("table-sort_by-None", lambda: _report().table(sort_by=None), TypeError,
         r"sort_by must be a str", "NoneType"),
    Case("table-sort_by-list", lambda: _report().table(sort_by=[]), TypeError,
         r"sort_by must be a str", "list"),
    Case("table-sort_by-unknown", lambda: _report().table(sort_by="speed"), ValueError,
         r"sort_by must be one of total, avg", "'speed'"),
    Case("table-by-None", lambda: _report().table(by=None), TypeError, r"by must be a str",
         "NoneType"),
    Case("table-by-unknown", lambda: _report().table(by="layer"), ValueError,
         r"by must be 'name', 'path', 'module' or 'shape'", "'layer'"),
    Case("shape_stats-by-unknown", lambda: _report().shape_stats(by="op"), ValueError,
         r"by must be 'name' or 'path'", "'op'"),
    Case("table-row_limit-str", lambda: _report().table(row_limit="3"), TypeError,
         r"row_limit must be an int >= 0 or None", "str"),
    Case("table-row_limit-bool", lambda: _report().table(row_limit=True), TypeError,
         r"row_limit must be an int >= 0 or None", "bool"),
    Case("table-row_limit-float", lambda: _report().table(row_limit=2.0), TypeError,
         r"row_limit must be an int >= 0 or None", "float"),
    Case("table-row_limit-negative", lambda: _report().table(row_limit=-1), ValueError,
         r"row_limit must be >= 0", "-1"),
    Case("to_json-indent-str", lambda: _report().to_json(indent="  "), TypeError,
         r"indent must be an int or None", "str"),
    Case("to_json-indent-bool", lambda: _report().to_json(indent=True), TypeError,
         r"indent must be an int or None", "bool"),
    Case("to_json-indent-negative", lambda: _report().to_json(indent=-2), ValueError,
         r"indent must be >= 0", "-2"),
    Case("to_json-NaN-metadata", lambda: _report_with_metadata(math.nan).to_json(), ValueError,
         r"metadata\.decode.* 'tokens_per_s' must be a finite number", "NaN"),
    Case("to_json-set-metadata", lambda: _report_with_metadata("set").to_json(), TypeError,
         r"metadata.* 'tags' must be a JSON value", "set"),
    Case("write_json-None", lambda: _report().write_json(None), TypeError,
         r"path must be a str or os.PathLike", "NoneType"),
    Case("write_json-int", lambda: _report().write_json(3), TypeError,
         r"path must be a str or os.PathLike", "int"),
    Case("write_json-empty", lambda: _report().write_json(""), ValueError,
         r"path must not be empty"),
    Case("write_json-NUL", lambda: _report().write_json("a\0b.json"), ValueError,
         r"path .* contains a NUL character", "'a\\x00b.json'"),
    Case("write_json-directory", lambda: _report().write_json(FILES), OSError,
         r"cannot write", FILES),
    Case("write_json-missing-dir", lambda: _report().write_json(MISSING_FILE), OSError,
         r"cannot write", MISSING_FILE),
    # compare_with_key_averages
    Case("compare-prof-None", lambda: compare_with_key_averages(None, _report()), TypeError,
         r"prof must be a profiler with key_averages\(\)", "NoneType"),
    Case("compare-prof-report", lambda: compare_with_key_averages(_report(), _report()),
         TypeError, r"prof must be a profiler with key_averages\(\)", "Report"),
    Case("compare-report-None", lambda: compare_with_key_averages(_FakeProfile(), None),
         TypeError, r"report must be a Report", "NoneType"),
    Case("compare-report-dict", lambda: compare_with_key_averages(_FakeProfile(), BASE),
         TypeError, r"report must be a Report", "dict"),
    Case("compare-row_limit-negative",
         lambda: compare_with_key_averages(_FakeProfile(), _report(), row_limit=-5), ValueError,
         r"row_limit must be >= 0", "-5"),
    Case("folded-report-None", lambda: folded_by_pytorch(None), TypeError,
         r"report must be a Report", "NoneType"),
    Case("compare-row_limit-str",
         lambda: compare_with_key_averages(_FakeProfile(), _report(), row_limit="all"),
         TypeError, r"row_limit must be an int >= 0 or None", "str"),
    # contract.load / run_checks
    Case("load-None", lambda: contract.load(None), TypeError,
         r"load: source must be a Report, a report dict or the path", "NoneType"),
    Case("load-float", lambda: contract.load(3.5), TypeError, r"source must be a Report",
         "float"),
    Case("load-empty-path", lambda: contract.load(""), ReportError,
         r"load: source is an empty path"),
    Case("run_checks-None", lambda: run_checks(None), TypeError,
         r"run_checks: report must be a Report, a report dict or the path", "NoneType"),
    Case("run_checks-int", lambda: run_checks(42), TypeError, r"report must be a Report", "int"),
    Case("run_checks-list", lambda: run_checks([]), TypeError, r"report must be a Report",
         "list"),
    Case("run_checks-bad-dict", lambda: run_checks({"schema": "x"}), ReportError,
         r"field 'schema' must be", "'x'"),
    Case("run_checks-missing-file", lambda: run_checks(MISSING_FILE), ReportError,
         r"cannot read", MISSING_FILE),
    Case("run_checks-layers-0", lambda: run_checks(_report(), layers=0), ValueError,
         r"layers \(decoder layers\) must be a positive int", "0"),
    Case("run_checks-layers-negative", lambda: run_checks(_report(), layers=-3), ValueError,
         r"layers .* must be a positive int", "-3"),
    Case("run_checks-layers-str", lambda: run_checks(_report(), layers="2"), TypeError,
         r"layers .* must be a positive int or None", "str"),
    Case("run_checks-layers-bool", lambda: run_checks(_report(), layers=True), TypeError,
         r"layers .* must be a positive int or None", "bool"),
    Case("run_checks-layers-float", lambda: run_checks(_report(), layers=2.0), TypeError,
         r"layers .* must be a positive int or None", "float"),
    Case("run_checks-tokens-0", lambda: run_checks(_report(), tokens=0), ValueError,
         r"tokens \(decoded tokens\) must be a positive int", "0"),
    Case("run_checks-tokens-str", lambda: run_checks(_report(), tokens="8"), TypeError,
         r"tokens .* must be a positive int or None", "str"),
    Case("run_checks-only-int", lambda: run_checks(_report(), only=3), TypeError,
         r"only must be a check id or an iterable of check ids", "int"),
    Case("run_checks-only-None-item", lambda: run_checks(_report(), only=[None]), TypeError,
         r"only must hold check ids \(str\)", "NoneType"),
    Case("run_checks-only-empty", lambda: run_checks(_report(), only=[]), ValueError,
         r"only names no check; expected some of coverage"),
    Case("run_checks-only-unknown", lambda: run_checks(_report(), only=["nope"]), ValueError,
         r"only: unknown check id.*expected some of coverage", "'nope'"),
    Case("run_checks-only-typo", lambda: run_checks(_report(), only="covrage"), ValueError,
         r"only: unknown check id", "'covrage'"),
    # failures / format_results / CheckResult
    Case("failures-None", lambda: contract.failures(None), TypeError,
         r"failures: results must be a list of CheckResult", "NoneType"),
    Case("failures-str", lambda: contract.failures("fail"), TypeError,
         r"results must be a list of CheckResult", "str"),
    Case("failures-item", lambda: contract.failures([1]), TypeError,
         r"failures: results\[0\] must be a CheckResult", "int"),
    Case("format_results-None", lambda: format_results(None), TypeError,
         r"format_results: results must be a list of CheckResult", "NoneType"),
    Case("format_results-item", lambda: format_results([{"status": "pass"}]), TypeError,
         r"results\[0\] must be a CheckResult", "dict"),
    Case("format_results-empty", lambda: format_results([]), ValueError,
         r"format_results: results is empty; expected the results of at least one check"),
    Case("CheckResult-status", lambda: CheckResult("coverage", "t", "maybe", "m"), ValueError,
         r"status must be one of 'pass', 'fail', 'inconclusive', 'n/a'", "'maybe'"),
    Case("CheckResult-id-None", lambda: CheckResult(None, "t", "pass", "m"), TypeError,
         r"id must be a str", "NoneType"),
    Case("CheckResult-figures", lambda: CheckResult("coverage", "t", "pass", "m", []),
         TypeError, r"figures must be a dict", "list"),
    # main
    Case("main-argv-str", lambda: contract.main(GOOD_FILE), TypeError,
         r"main: argv must be a list of str or None", "str"),
    Case("main-argv-item", lambda: contract.main([GOOD_FILE, 3]), TypeError,
         r"main: argv\[1\] must be a str", "int"),
    Case("main-prog", lambda: contract.main([GOOD_FILE], prog=None), TypeError,
         r"main: prog must be a str", "NoneType"),
    # the command line: exit status 2 and the reason on stderr (int "error": the status)
    Case("cli-no-report", lambda: contract.main([]), 2, r"arguments are required: report"),
    Case("cli-layers-0", lambda: contract.main([GOOD_FILE, "--layers", "0"]), 2,
         r"--layers: expected a positive integer", "0"),
    Case("cli-tokens-word", lambda: contract.main([GOOD_FILE, "--tokens", "eight"]), 2,
         r"--tokens: expected a positive integer", "'eight'"),
    Case("cli-only-unknown", lambda: contract.main([GOOD_FILE, "--only", "nope"]), 2,
         r"--only: unknown check id\(s\) 'nope'; expected some of coverage"),
    Case("cli-missing-file", lambda: contract.main([MISSING_FILE]), 2, r"cannot read",
         MISSING_FILE),
    Case("cli-directory", lambda: contract.main([FILES]), 2, r"cannot read", FILES),
]
# every check function, with None and with a dict in place of a Report
for _check_id, _fn in contract.CHECKS:
    for _bad, _type_name in ((None, "NoneType"), (BASE, "dict")):
        CASES.append(Case(f"{_fn.__name__}-{_type_name}", (lambda fn=_fn, bad=_bad: fn(bad)),
                          TypeError, rf"{_fn.__name__}: report must be a Report", _type_name))


@pytest.fixture(scope="module", autouse=True)
def report_files():
    """FILES with GOOD_FILE in it, for the module's tests (see FILES)."""
    shutil.rmtree(FILES, ignore_errors=True)  # (left by an earlier process of the same id)
    os.makedirs(FILES)
    with open(GOOD_FILE, "w") as f:
        f.write(BASE_TEXT)
    yield
    shutil.rmtree(FILES, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def bad_input_count():
    yield
    clear = sum(TRIED.values())
    print(f"\nbad input (report/contract): {len(TRIED)} calls tried, {clear} clear")
    unclear = sorted(case_id for case_id, ok in TRIED.items() if not ok)
    if unclear:
        print(f"unclear ({len(unclear)}): {', '.join(unclear)}")


def _unclear_reasons(case: Case) -> List[str]:
    if isinstance(case.error, int):  # a command-line case: status and stderr
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = case.call()
        message = err.getvalue()
        reasons = [] if code == case.error else [f"exit status {code}, expected {case.error}"]
        if "Traceback" in message or out.getvalue():
            reasons.append("a traceback or output on stdout")
    else:
        try:
            case.call()
        except Exception as error:  # judged below: its type and its message
            message = str(error.args[0]) if isinstance(error, KeyError) else str(error)
            reasons = [] if isinstance(error, case.error) else [
                f"raised {type(error).__name__}, expected {case.error.__name__}: {message}"]
        else:
            return ["raised nothing"]
    if not re.search(case.pattern, message):
        reasons.append(f"message {message!r} does not match {case.pattern!r}")
    if case.received is not None and case.received not in message:
        reasons.append(f"message {message!r} does not show what was received ({case.received})")
    return reasons


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_raises_a_clear_error(case):
    reasons = _unclear_reasons(case)
    TRIED[case.id] = not reasons
    assert not reasons, reasons


def test_bad_input_table_ids_are_unique():
    assert len({c.id for c in CASES}) == len(CASES)
