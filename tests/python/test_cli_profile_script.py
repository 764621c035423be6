"""python -m torch_brickdev profile runs a script (or -m module) as python runs it: the same
__name__, sys.argv, sys.path[0], __file__ and working directory; the same exit status, message
and traceback when it exits, raises or is interrupted; and the report of what ran is written,
marked incomplete, when it ended early."""

import json
import os
import select
import signal
import subprocess
import textwrap

import pytest

from helpers import child_env, run_python, start_python
from torch_brickdev.profiler import ReportError, load_report

TIMEOUT_S = 300  # a child imports torch; generous for a busy machine, never reached when well

PROBE = """
import json, os, sys
import sibling  # beside the script: its folder is first on sys.path
print("PROBE " + json.dumps({
    "name": __name__, "argv": sys.argv, "file": __file__, "path0": sys.path[0],
    "main_module": sys.modules["__main__"].__dict__ is globals(),
    "cwd_file": open("data.txt").read(), "sibling": sibling.VALUE,
}))
"""


def python(*args, cwd):
    return run_python(*args, cwd=cwd, env=child_env(), timeout=TIMEOUT_S)


def profile(*args, cwd, output):
    return python("-m", "torch_brickdev", "profile", "--no-trace", "-o", str(output), *args,
                  cwd=cwd)


def probe_of(out) -> dict:
    lines = [line for line in out.stdout.splitlines() if line.startswith("PROBE ")]
    assert len(lines) == 1, out.stdout[-2000:] + out.stderr[-2000:]
    return json.loads(lines[0][len("PROBE "):])


@pytest.fixture
def layout(tmp_path):
    """A script with a sibling module in scripts/, a package in work/ (the working folder),
    and a data file there that the script opens by a relative path."""
    scripts, work = tmp_path / "scripts", tmp_path / "work"
    scripts.mkdir()
    (work / "mypkg").mkdir(parents=True)
    (scripts / "probe.py").write_text(PROBE)
    (scripts / "sibling.py").write_text("VALUE = 'beside the script'\n")
    (work / "mypkg" / "__init__.py").write_text("")
    (work / "mypkg" / "tool.py").write_text(PROBE.replace("import sibling",
                                                          "from . import sibling"))
    (work / "mypkg" / "sibling.py").write_text("VALUE = 'in the package'\n")
    (work / "data.txt").write_text("read from the working folder")
    return tmp_path


def test_a_script_sees_what_python_gives_it(layout):
    # Options of profile's own names after the script, and `--`, are the script's arguments.
    args = ["../scripts/probe.py", "a", "--rows", "3", "--", "-m", "x"]
    plain = python(*args, cwd=layout / "work")
    profiled = profile(*args, cwd=layout / "work", output=layout / "out")
    assert plain.returncode == 0, plain.stderr
    assert profiled.returncode == 0, profiled.stderr[-3000:]
    expected = probe_of(plain)
    assert expected["argv"] == args
    assert expected["path0"] == os.path.realpath(layout / "scripts")
    assert probe_of(profiled) == expected
    report = json.loads((layout / "out" / "report.json").read_text())
    assert report["metadata"]["script"] == "../scripts/probe.py"
    assert report["metadata"]["argv"] == args[1:] and "incomplete" not in report["metadata"]


def test_dash_m_runs_a_module_as_python_does(layout):
    args = ["a", "--", "--output", "x"]
    plain = python("-m", "mypkg.tool", *args, cwd=layout / "work")
    profiled = profile("-m", "mypkg.tool", *args, cwd=layout / "work", output=layout / "out")
    assert plain.returncode == 0, plain.stderr
    assert profiled.returncode == 0, profiled.stderr[-3000:]
    expected = probe_of(plain)
    assert expected["argv"] == [os.path.realpath(layout / "work" / "mypkg" / "tool.py"), *args]
    assert probe_of(profiled) == expected
    assert json.loads((layout / "out" / "report.json").read_text())["metadata"]["module"] == \
        "mypkg.tool"
    missing = profile("-m", "mypkg.absent", cwd=layout / "work", output=layout / "out2")
    assert missing.returncode == 2 and "no module named 'mypkg.absent'" in missing.stderr
    nothing = profile("-m", cwd=layout / "work", output=layout / "out2")
    assert nothing.returncode == 2 and "-m expects a module name" in nothing.stderr


def _traceback(stderr: str) -> str:
    return stderr[stderr.index("Traceback (most recent call last):"):]


ENDINGS = {
    # body: (exit status, what stderr ends with, why the report is incomplete (None: complete))
    "sys.exit()": (0, "", None),
    "sys.exit(3)": (3, "", None),
    "sys.exit('stopped: no data')": (1, "stopped: no data\n", None),
    "raise ValueError('boom')": (1, "ValueError: boom\n", "work.py raised ValueError: boom"),
    "raise KeyboardInterrupt": (-signal.SIGINT, "KeyboardInterrupt\n",
                                "work.py was interrupted (KeyboardInterrupt)"),
}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_the_scripts_ending_is_pythons_and_the_report_says_what_ran(tmp_path, ending):
    status, stderr_end, incomplete = ENDINGS[ending]
    (tmp_path / "work.py").write_text(textwrap.dedent(f"""
        import sys
        import torch
        import torch_brickdev  # for the plain run (profile registers brick itself)

        def step(x):
            return torch.tanh(x @ x)

        x = step(torch.ones(4, 4, device="brick"))
        {ending}
    """))
    plain = python("work.py", cwd=tmp_path)
    profiled = profile("work.py", cwd=tmp_path, output=tmp_path / "out")
    assert plain.returncode == status and plain.stderr.endswith(stderr_end), plain.stderr
    assert profiled.returncode == status, profiled.stderr[-3000:]
    assert profiled.stderr.endswith(stderr_end), profiled.stderr[-3000:]
    if "Traceback" in plain.stderr:  # the script's own frames, as python shows them
        assert _traceback(profiled.stderr) == _traceback(plain.stderr)
    report = load_report(tmp_path / "out" / "report.json")
    assert report.brick("aten::tanh").count == 1  # what ran before the end is kept
    assert report.incomplete == incomplete
    assert ("warning: incomplete: " + incomplete in profiled.stdout) if incomplete else \
        "incomplete" not in profiled.stdout


def test_ctrl_c_on_a_long_run_writes_the_report_of_what_ran(tmp_path):
    (tmp_path / "long.py").write_text(textwrap.dedent("""
        import time
        import torch

        x = torch.zeros(8, device="brick")
        for _ in range(3):
            x = x + 1
        print("started", flush=True)
        end = time.monotonic() + 120  # bounded should the interrupt never come
        while time.monotonic() < end:
            x = x + 1
            time.sleep(0.001)
    """))
    # Ctrl-C's default disposition for the child, as a terminal gives it: the suite itself may
    # run with SIGINT ignored (as CI runners start it), which a child would inherit, and Python
    # raises KeyboardInterrupt only where SIGINT was not ignored at its start.
    with start_python("-m", "torch_brickdev", "profile", "--no-trace", "-o",
                      str(tmp_path / "out"), "long.py", cwd=tmp_path, env=child_env(),
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) as child:
        try:
            ready, _, _ = select.select([child.stdout], [], [], TIMEOUT_S)
            assert ready and child.stdout.readline() == "started\n", child.stderr.read()
            child.send_signal(signal.SIGINT)
            stdout, stderr = child.communicate(timeout=TIMEOUT_S)
        finally:
            child.kill()
    assert child.returncode == -signal.SIGINT, stderr[-3000:]
    assert stderr.endswith("KeyboardInterrupt\n") and "cli.py" not in stderr, stderr[-3000:]
    report = load_report(tmp_path / "out" / "report.json")
    assert report.incomplete == "long.py was interrupted (KeyboardInterrupt)"
    assert report.brick("aten::add").count >= 3  # the work before the interrupt is kept
    assert "(incomplete: what ran)" in stdout


def test_the_incomplete_marker_is_checked_where_reports_are_read(tmp_path):
    (tmp_path / "work.py").write_text("import torch\ntorch.ones(2, device='brick').sum()\n"
                                      "raise RuntimeError('lost')\n")
    assert profile("work.py", cwd=tmp_path, output=tmp_path).returncode == 1
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["metadata"]["incomplete"] == "work.py raised RuntimeError: lost"
    for wrong in (5, "", None):
        data["metadata"]["incomplete"] = wrong
        with pytest.raises(ReportError, match=r"metadata\.incomplete: field 'incomplete' must "
                                              r"be a non-empty string"):
            load_report(data)
