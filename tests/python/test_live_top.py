"""The live view: a process profiled with live=True publishes its bricks, ``top`` lists and
watches it (one reading as text or JSON, a stream, the terminal UI), says when it ends, and only
this user's publishers in a directory only this user can write are read. Each publisher runs in
a subprocess with its own BRICK_LIVE_DIR."""

from __future__ import annotations

import json
import os
import pty
import select
import stat
import subprocess
import sys
import time

import pytest

from helpers import child_env, ended_pid, run_cli, start_python

import torch
import torch_brickdev  # noqa: F401
from torch_brickdev import profiler as bp
from torch_brickdev.profiler import live

# Publishes for argv[1] seconds, or until the file argv[2] (if given) exists. The tests give 600 s
# and end it themselves: a loaded machine's slow starts must not end a publisher a test still reads.
LOOP = """
import os, sys, time, torch, torch_brickdev
from torch.profiler import record_function
from torch_brickdev import profiler as bp
x = torch.randn(64, 64, device="brick")
stop = sys.argv[2] if len(sys.argv) > 2 else None
with bp.profile(live=True):
    print("publishing", flush=True)
    end = time.time() + float(sys.argv[1])
    while time.time() < end and not (stop and os.path.exists(stop)):
        with record_function("Block"):
            x @ x
        time.sleep(0.002)
"""


@pytest.fixture
def env(tmp_path):
    directory = tmp_path / "live"
    # COLUMNS wide enough for a whole argv: top fits its lines to COLUMNS where it is set.
    return child_env(BRICK_LIVE_DIR=str(directory), COLUMNS="400")


def start(env, seconds, tmp_path, stop=None):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    args = [str(script), str(seconds)] + ([str(stop)] if stop else [])
    proc = start_python(*args, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "publishing"
    return proc


def top(env, *args, timeout=120):
    return run_cli("top", *args, env=env, timeout=timeout)


@pytest.mark.timeout(200)
def test_top_lists_and_reads_a_running_process(env, tmp_path):
    proc = start(env, 600, tmp_path)
    try:
        listed = top(env, "--list")
        assert listed.returncode == 0 and str(proc.pid) in listed.stdout
        assert "loop.py 600" in listed.stdout
        reading = top(env, "--once", "--json", "--pid", str(proc.pid))
        assert reading.returncode == 0, reading.stderr
        data = json.loads(reading.stdout)
        assert [p["pid"] for p in data["publishers"]] == [proc.pid]
        block = next(r for r in data["rows"] if r["name"] == "Block")
        for part in ("interval", "start"):
            figures = block[part]
            assert figures["calls_per_s"] > 0 and 0 < figures["wall"] <= 1.0
            assert 0 < figures["p50_us"] <= figures["p99_us"]
        text = top(env, "--once", "--filter", "mm", "--sort", "name")
        lines = text.stdout.splitlines()
        names = [line.split()[0] for line in lines[5:]]
        assert names == sorted(names) and all("mm" in n for n in names) and names
        assert "last interval" in lines[3] and "since start" in lines[3]
        # The publishing directory and file: this user's only.
        directory = env["BRICK_LIVE_DIR"]
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(os.path.join(directory, f"{proc.pid}.json")).st_mode) == 0o600
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.timeout(200)
def test_two_processes_merged_or_one_view_each(env, tmp_path):
    first, second = start(env, 600, tmp_path), start(env, 600, tmp_path)
    try:
        merged = top(env, "--once", "--json")
        data = json.loads(merged.stdout)
        assert sorted(p["pid"] for p in data["publishers"]) == sorted([first.pid, second.pid])
        assert [r["name"] for r in data["rows"]].count("Block") == 1  # one row, both summed
        apart = top(env, "--once", "--per-rank")
        assert apart.returncode == 0, apart.stderr
        assert apart.stdout.count("brick top — pid") == 2
        assert f"pid {first.pid}" in apart.stdout and f"pid {second.pid}" in apart.stdout
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()


@pytest.mark.timeout(200)
def test_top_says_when_the_watched_process_ends(env, tmp_path):
    stop = tmp_path / "stop"
    proc = start(env, 600, tmp_path, stop)  # ends once top has shown it (the stop file)
    view = start_python("-m", "torch_brickdev", "top", "--pid", str(proc.pid), "--rows", "3",
                        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        text=True)  # not a terminal: a stream
    try:
        seen = []
        for line in view.stdout:  # bounded by the test's timeout; ends if top does
            seen.append(line)
            if "brick top" in line:
                break
        stop.touch()
        rest, errors = view.communicate(timeout=120)
    finally:
        stop.touch()
        proc.wait(timeout=120)
        if view.poll() is None:
            view.kill()
    output = "".join(seen) + rest
    assert view.returncode == 0, errors
    assert output.count("brick top") >= 1
    assert output.rstrip().splitlines()[-1].startswith(f"process {proc.pid} ended")
    assert not os.listdir(env["BRICK_LIVE_DIR"])  # the publisher removed its file
    gone = top(env, "--once")
    assert gone.returncode == 1 and "no brick process of this user is publishing" in gone.stderr


@pytest.mark.timeout(200)
def test_the_terminal_view_runs_and_quits(env, tmp_path):
    proc = start(env, 600, tmp_path)
    main, child = pty.openpty()
    view = start_python("-m", "torch_brickdev", "top", "--pid", str(proc.pid),
                        env=dict(env, TERM="xterm", COLUMNS="160", LINES="40"),
                        stdin=child, stdout=child, stderr=child)
    os.close(child)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while b"Block" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 1.0)
            if ready:
                try:
                    seen += os.read(main, 65536)
                except OSError:
                    break
        assert b"brick top" in seen and b"Block" in seen, seen[-2000:]
        os.write(main, b"s")  # next sort column, then quit
        os.write(main, b"q")
        assert view.wait(timeout=30) == 0
    finally:
        if view.poll() is None:
            view.kill()
        proc.kill()
        proc.wait()
        os.close(main)


def test_a_dead_publisher_leaves_nothing_behind(env, monkeypatch):
    monkeypatch.setenv("BRICK_LIVE_DIR", env["BRICK_LIVE_DIR"])
    directory = live.live_dir(create=True)
    dead = ended_pid()
    with open(os.path.join(directory, f"{dead}.json"), "w") as f:
        json.dump({"format": live.FORMAT, "version": live.VERSION, "pid": dead,
                   "start_time": None, "bricks": []}, f)
    with open(os.path.join(directory, f"{dead}.7.tmp"), "w") as f:
        f.write("{half a snap")
    assert live.publishers() == []
    assert os.listdir(directory) == []


def test_a_directory_others_may_write_is_refused(env, monkeypatch):
    directory = env["BRICK_LIVE_DIR"]
    os.makedirs(directory)
    os.chmod(directory, 0o777)
    monkeypatch.setenv("BRICK_LIVE_DIR", directory)
    with pytest.raises(live.LiveError, match=r"has mode 0777; expected 0700"):
        live.publishers()
    with pytest.raises(live.LiveError, match=r"has mode 0777"):
        with bp.profile(live=True):
            pass
    assert not bp.is_enabled()  # the refused profile left nothing on
    done = top(env, "--once")
    assert done.returncode == 2 and "expected 0700" in done.stderr


def test_nothing_is_published_unless_asked(env, monkeypatch, one_thread):
    monkeypatch.setenv("BRICK_LIVE_DIR", env["BRICK_LIVE_DIR"])
    monkeypatch.delenv("BRICK_LIVE", raising=False)
    x = torch.ones(8, device="brick")
    with bp.profile() as p:
        x + 1
        assert not os.path.exists(env["BRICK_LIVE_DIR"])
    assert "live" not in p.report.metadata
    monkeypatch.setenv("BRICK_LIVE", "1")
    with bp.profile() as p:
        x + 1
        assert [d["pid"] for d in live.publishers()] == [os.getpid()]
    assert live.publishers() == []
    cost = p.report.metadata["live"]
    assert cost["snapshots"] >= 1 and cost["cost_ns"] > 0


TMUX_SESSION = "brick-top-test"


@pytest.mark.timeout(200)
def test_the_live_view_in_a_real_terminal(tmp_path):
    """top's terminal view, driven in tmux as a user would: it shows the bricks of a running
    process, sorts on a key, filters, and quits."""
    import shutil

    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (scripts/run.sh installs it)")
    env = child_env(BRICK_LIVE_DIR=str(tmp_path / "live"))
    script = tmp_path / "model.py"
    script.write_text(
        "import time, torch, torch_brickdev\n"
        "from torch import nn\n"
        "from torch_brickdev import profiler as bp\n"
        "model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).to('brick')\n"
        "x = torch.randn(16, 64, device='brick')\n"
        "with bp.profile(live=True, modules=True):\n"
        "    print('publishing', flush=True)\n"
        "    end = time.time() + 90\n"
        "    while time.time() < end:\n"
        "        model(x)\n"
        "        time.sleep(0.002)\n")
    proc = start_python(str(script), env=env, stdout=subprocess.PIPE, text=True)

    def tmux(*args):
        return subprocess.run(["tmux", *args], capture_output=True, text=True, timeout=30,
                              env=env)

    def screen_with(text, without=None, seconds=60):
        """The screen once it shows ``text`` and not ``without``: tmux may capture the pane
        while curses is still redrawing it, header first."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            shown = tmux("capture-pane", "-p", "-t", TMUX_SESSION).stdout
            if text in shown and (without is None or without not in shown):
                return shown
            time.sleep(0.3)
        unwanted = f" without {without!r}" if without else ""
        raise AssertionError(f"{text!r} never shown{unwanted}; the screen:\n{shown}")

    try:
        assert proc.stdout.readline().strip() == "publishing"
        command = f"{sys.executable} -m torch_brickdev top --pid {proc.pid}"
        assert tmux("new-session", "-d", "-s", TMUX_SESSION, "-x", "160", "-y", "40",
                    command).returncode == 0
        shown = screen_with("Sequential")
        assert f"pid {proc.pid}" in shown and "last interval" in shown and "0" in shown
        tmux("send-keys", "-t", TMUX_SESSION, "s")  # wall -> calls
        screen_with("sort calls")
        tmux("send-keys", "-t", TMUX_SESSION, "m")  # module bricks only
        shown = screen_with("module bricks", without="aten::addmm")
        assert "Sequential" in shown
        tmux("send-keys", "-t", TMUX_SESSION, "q")
        deadline = time.monotonic() + 30
        while tmux("has-session", "-t", TMUX_SESSION).returncode == 0:
            assert time.monotonic() < deadline, "top did not quit on q"
            time.sleep(0.2)
    finally:
        tmux("kill-session", "-t", TMUX_SESSION)
        proc.kill()
        proc.wait()
