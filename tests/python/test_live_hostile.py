"""The live view against what other processes leave in the live directory: malformed, truncated,
other-version or oversized snapshots, FIFOs, symbolic links and directories under a publisher's
names, a stale temporary file of a reused pid, the directory swapped for a symbolic link while a
publisher runs, and names or arguments holding terminal escapes. ``top`` skips each bad file with
a one-line note, the publisher warns once and never raises into the profiled program."""

from __future__ import annotations

import json
import os
import subprocess
import unicodedata
import warnings

import pytest

from helpers import child_env, ended_pid, imported, run_cli, run_importtime

import torch
import torch_brickdev  # noqa: F401
from torch_brickdev import profiler as bp
from torch_brickdev.profiler import live
from torch_brickdev.tools import top


@pytest.fixture
def directory(tmp_path, monkeypatch):
    """An empty live directory of this test's own, made as a publisher makes it."""
    monkeypatch.setenv("BRICK_LIVE_DIR", str(tmp_path / "live"))
    monkeypatch.delenv("BRICK_LIVE", raising=False)
    return live.live_dir(create=True)


@pytest.fixture
def other_pids():
    """Three live processes of this user besides this one (a file named after a process that
    ended is removed unread, whatever it holds)."""
    sleepers = [subprocess.Popen(["sleep", "300"]) for _ in range(3)]
    yield [p.pid for p in sleepers]
    for sleeper in sleepers:
        sleeper.kill()
        sleeper.wait()


def snapshot(**changes) -> dict:
    """A well-formed snapshot naming this (live) process, with ``changes`` applied (a value of
    ``...`` removes the field)."""
    now = 2_000_000_000
    data = {"format": live.FORMAT, "version": live.VERSION, "pid": os.getpid(), "start_time": None,
            "rank": None, "argv": ["train.py", "--epochs", "3"], "started_ns": now - 10**9,
            "seq": 1, "time_ns": now, "sync_mode": "async", "modules": None,
            "bricks": [{"name": "Block", "kind": "range", "count": 4, "total_ns": 4000,
                        "histogram": [[40, 4]]}]}
    data.update(changes)
    return {k: v for k, v in data.items() if v is not ...}


def plant(directory, data, name=None) -> str:
    """Writes ``data`` (JSON, or text/bytes as they are) as a snapshot file; its path."""
    path = os.path.join(directory, name or f"{os.getpid()}.json")
    if isinstance(data, (dict, list)):
        data = json.dumps(data)
    with open(path, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    return path


def scanned(directory):
    found = live.scan()
    assert found.directory == directory
    return found


BAD_SNAPSHOTS = {
    "no seq": (snapshot(seq=...), "seq: missing"),
    "truncated": (json.dumps(snapshot())[:-40], "not JSON"),
    "other version": (snapshot(version=2), "version integer 2; this reader reads version 1"),
    "huge pid": (snapshot(pid=10**30), "integer literal of 31 digits"),
    "pid past any process id": (snapshot(pid=2**40), "pid"),
    "pid -1": (snapshot(pid=-1), "pid"),
    "pid 0": (snapshot(pid=0), "pid"),
    "pid true": (snapshot(pid=True), "pid"),
    "another process's pid": (snapshot(pid=1), "pid 1"),
    "not an object": ([1, 2], "not a JSON object"),
    "bricks a string": (snapshot(bricks="Block"), "bricks"),
    "count a string": (snapshot(bricks=[{"name": "B", "kind": "op", "count": "3",
                                         "total_ns": 1, "histogram": []}]), "count"),
    "name a number": (snapshot(bricks=[{"name": 7, "kind": "op", "count": 3, "total_ns": 1,
                                        "histogram": []}]), "name"),
    "bucket out of range": (snapshot(bricks=[{"name": "B", "kind": "op", "count": 3,
                                              "total_ns": 1, "histogram": [[10**6, 3]]}]),
                            "bucket 1000000"),
    "bucket not a pair": (snapshot(bricks=[{"name": "B", "kind": "op", "count": 3,
                                            "total_ns": 1, "histogram": [["a", 3, 4]]}]),
                          "histogram"),
    "argv of numbers": (snapshot(argv=[1, 2]), "argv"),
    "time before start": (snapshot(time_ns=5, started_ns=10), "time_ns"),
    "rank a string": (snapshot(rank="0"), "rank"),
    "not UTF-8": (b"\xff\xfe\x00{", "not JSON"),
    "nested past any snapshot": ("[" * 100_000, "not JSON"),
}


@pytest.mark.parametrize("case", sorted(BAD_SNAPSHOTS))
def test_a_malformed_snapshot_is_skipped_with_a_note(directory, case):
    data, what = BAD_SNAPSHOTS[case]
    path = plant(directory, data)
    found = scanned(directory)
    assert found.publishers == []
    assert len(found.skipped) == 1, found.skipped
    note = found.skipped[0]
    assert path in note and what in note, note
    assert "\n" not in note


def test_a_snapshot_named_after_no_process_is_skipped(directory):
    plant(directory, snapshot(pid=0), name="0.json")
    plant(directory, snapshot(pid=10**12), name=f"{10**12}.json")
    found = scanned(directory)
    assert found.publishers == []
    assert sorted(found.skipped) == sorted([
        f"{directory}/0.json: pid 0 is not a process id (expected 1..{live.MAX_PID})",
        f"{directory}/{10**12}.json: pid {10**12} is not a process id "
        f"(expected 1..{live.MAX_PID})"])


def test_a_good_snapshot_beside_bad_ones_is_read(directory, tmp_path, other_pids):
    first, second, third = other_pids
    plant(directory, snapshot())
    plant(directory, snapshot(version=9, pid=first), name=f"{first}.json")
    os.symlink(plant(tmp_path, snapshot(pid=second), name="elsewhere.json"),
               os.path.join(directory, f"{second}.json"))
    os.mkdir(os.path.join(directory, f"{third}.json"))
    found = scanned(directory)
    assert [d["pid"] for d in found.publishers] == [os.getpid()]
    assert sorted(found.skipped) == sorted([
        f"{directory}/{first}.json: version integer 9; this reader reads version 1",
        f"{directory}/{second}.json: a symbolic link, not a snapshot",
        f"{directory}/{third}.json: not a regular file (a directory)"])


def test_what_an_ended_process_left_is_removed_unread(directory):
    pid = ended_pid()
    plant(directory, "{truncated", name=f"{pid}.json")
    plant(directory, "{", name=f"{pid}.json.3.tmp")
    os.mkfifo(os.path.join(directory, f"{pid}.json.4.tmp"))
    assert scanned(directory).skipped == []
    assert os.listdir(directory) == []


def test_an_oversized_snapshot_is_skipped_unread(directory, monkeypatch):
    monkeypatch.setattr(live, "MAX_SNAPSHOT_BYTES", 1000)
    path = plant(directory, snapshot(argv=["x" * 2000]))
    found = scanned(directory)
    assert found.publishers == []
    assert found.skipped == [f"{path}: larger than 1000 bytes (no snapshot is)"]


@pytest.mark.timeout(120)
def test_a_fifo_is_skipped_without_hanging(directory, tmp_path):
    fifo = os.path.join(directory, f"{os.getpid()}.json")
    os.mkfifo(fifo, 0o600)
    try:  # a reader that opens the FIFO blocks until a writer comes: the timeout ends it
        listed = run_cli("top", "--list", env=child_env(), timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("top --list hung on a FIFO in the live directory")
    assert listed.returncode == 1
    assert f"{fifo}: not a regular file (a FIFO)" in listed.stderr
    assert "Traceback" not in listed.stderr


def test_top_list_reads_without_torch(directory):
    """--list shows no percentiles: it leaves the histograms' buckets unchecked, which would load
    torch, and starts at once."""
    plant(directory, snapshot())
    listed = run_importtime("-m", "torch_brickdev", "top", "--list", env=child_env())
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert f"{os.getpid():>8}  rank    -  train.py --epochs 3" in listed.stdout
    modules = imported(listed.stderr)
    assert "torch_brickdev.tools.top" in modules  # the measurement saw the command's imports
    assert "torch" not in modules and "torch_brickdev._C" not in modules


def test_top_notes_each_bad_file_once_and_goes_on(directory, capsys, monkeypatch, other_pids):
    monkeypatch.setenv("COLUMNS", "200")
    first, second = sorted(other_pids, key=str)[:2]
    plant(directory, snapshot())
    plant(directory, snapshot(pid=first, seq=...), name=f"{first}.json")
    plant(directory, snapshot(pid=second, bricks=[{"name": "B\x1b]0;owned\x07", "kind": "op",
                                                   "count": "x", "total_ns": 1,
                                                   "histogram": []}]),
          name=f"{second}.json")
    assert top.main(["--once"]) == 0  # reads the directory again and again for a new snapshot
    out, err = capsys.readouterr()
    assert "Block" in out
    lines = err.splitlines()
    assert len(lines) == 2, lines
    assert lines[0] == f"skipped {directory}/{first}.json: seq: missing"
    assert lines[1].startswith(
        f"skipped {directory}/{second}.json: bricks[0] 'B\\x1b]0;owned\\x07': count: ")
    assert "\x1b" not in err


def test_top_list_says_where_it_looked(directory, capsys):
    assert top.main(["--list"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"no brick process of this user is publishing in {directory}: run it "
                          "with profile(live=True)")
    assert err.count("\n") == 1


HOSTILE = "Attn\x1b[2J\x1b]0;pwned\x07\u202eevil"


def test_top_prints_names_and_argv_as_text(directory, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    plant(directory, snapshot(argv=["train.py", "--tag", "\x1b[31mred\u2066"],
                              bricks=[{"name": HOSTILE, "kind": "range", "count": 4,
                                       "total_ns": 4000, "histogram": [[40, 4]]}]))
    assert top.main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert "\\x1b[31mred\\u2066" in listed
    assert top.main(["--once"]) == 0
    out = capsys.readouterr().out
    for shown in (listed, out):
        assert not any(unicodedata.category(c) in ("Cc", "Cf") for c in shown.replace("\n", ""))
    assert "Attn\\x1b[2J\\x1b]0;pwned\\x07\\u202eevil" in out
    assert "\\x1b[31mred" in out


def display_width(line: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in line)


@pytest.mark.parametrize("columns", [60, 80, 120])
def test_tables_fit_the_terminal(directory, capsys, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    long_name = "model.encoder.layers.11.self_attention.output_projection.linear"
    plant(directory, snapshot(argv=["train.py"] + ["--flag"] * 40, bricks=[
        {"name": long_name, "kind": "module", "count": 4, "total_ns": 4000,
         "histogram": [[40, 4]]},
        {"name": "注意力" * 20, "kind": "range", "count": 2, "total_ns": 900,
         "histogram": [[30, 2]]}]))
    assert top.main(["--once", "--sort", "p99"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert all(display_width(line) <= columns for line in lines), \
        [(display_width(line), line) for line in lines]
    assert any(line.startswith(long_name[:16]) and "…" in line for line in lines)
    assert any(line.startswith("注意力") and "…" in line for line in lines)
    assert "p99 us" in lines[4]  # the sort column stays
    assert top.main(["--list"]) == 0
    assert all(display_width(line) <= columns for line in capsys.readouterr().out.splitlines())


def test_a_wide_terminal_shows_every_column(directory, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    plant(directory, snapshot())
    assert top.main(["--once"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "last interval" in lines[3] and "since start" in lines[3]
    assert lines[4].split() == ["brick"] + ["calls/s", "avg", "us", "p50", "us", "p99", "us",
                                            "%", "wall", "|"] + ["calls/s", "avg", "us", "p50",
                                                                 "us", "p99", "us", "%", "wall"]


# ---- the publisher ----------------------------------------------------------------------------


def test_a_stale_temporary_file_of_this_pid_is_replaced(directory, one_thread):
    """A process killed mid-write under this pid left its temporary file: every profile of this
    process publishes anyway (BRICK_LIVE=1 makes each profile a publisher)."""
    stale = os.path.join(directory, f"{os.getpid()}.json.1.tmp")
    x = torch.ones(8, device="brick")
    for _ in range(2):
        with open(stale, "w") as f:
            f.write('{"half a sn')
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with bp.profile(live=True) as p:
                x + 1
                assert [d["pid"] for d in live.publishers()] == [os.getpid()]
        assert not [w for w in caught if "brick live" in str(w.message)]
        assert p.report.metadata["live"]["snapshots"] >= 1
        assert os.listdir(directory) == []


def test_a_directory_in_place_of_the_snapshot_warns_once(directory):
    blocked = os.path.join(directory, f"{os.getpid()}.json")
    os.mkdir(blocked)
    publisher = live.Publisher(interval=3600)  # publishes at start and when asked only
    with pytest.warns(RuntimeWarning) as caught:
        publisher.start()
        publisher.publish()
        publisher.stop()
    messages = [str(w.message) for w in caught if "brick live" in str(w.message)]
    assert messages == [f"brick live: cannot publish {blocked}: Is a directory; the profile "
                        "goes on unpublished"]
    assert os.listdir(directory) == [f"{os.getpid()}.json"]  # no temporary file left
    assert os.listdir(blocked) == []


def test_a_profile_whose_snapshot_cannot_be_written_goes_on(directory, one_thread, capfd):
    """Even where warnings are errors: the message goes to stderr, nothing is raised."""
    os.mkdir(os.path.join(directory, f"{os.getpid()}.json"))
    x = torch.ones(8, device="brick")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with bp.profile(live=True) as p:
            x + 1
    assert "aten::add" in p.report
    assert "brick live: cannot publish" in capfd.readouterr().err
    assert os.listdir(directory) == [f"{os.getpid()}.json"]


def test_a_swapped_directory_redirects_no_write(directory, tmp_path):
    """Once a publisher started, replacing its directory by a symbolic link to another directory
    changes nothing it writes or removes: it writes through the directory it opened."""
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    (target / "keep.json").write_text("{}")
    publisher = live.Publisher(interval=3600)  # publishes at start and when asked only
    publisher.start()
    try:
        os.rename(directory, tmp_path / "moved")
        os.symlink(target, directory)
        publisher.publish()
        publisher.publish()
    finally:
        publisher.stop()
    assert sorted(os.listdir(target)) == ["keep.json"]
    assert os.listdir(tmp_path / "moved") == []  # its own file written there and removed
    assert publisher.snapshots == 3


def test_a_publisher_refuses_a_symbolic_link_for_its_directory(tmp_path, monkeypatch):
    (tmp_path / "real").mkdir(mode=0o700)
    os.symlink(tmp_path / "real", tmp_path / "link")
    monkeypatch.setenv("BRICK_LIVE_DIR", str(tmp_path / "link"))
    with pytest.raises(live.LiveError, match="is not a directory"):
        live.Publisher()


def test_a_snapshot_is_encoded_by_the_c_encoder(directory, monkeypatch):
    """json.dump to a file encodes with the pure-Python encoder, about 4x the C encoder's time
    for a snapshot: publishing must not take that path."""
    import json.encoder

    def pure_python_encoder(*args, **kwargs):
        raise AssertionError("the snapshot went through the pure-Python JSON encoder")

    monkeypatch.setattr(json.encoder, "_make_iterencode", pure_python_encoder)
    publisher = live.Publisher(interval=3600)
    publisher.start()
    try:
        assert [d["pid"] for d in live.publishers()] == [os.getpid()]
    finally:
        publisher.stop()
