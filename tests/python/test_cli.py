"""python -m torch_brickdev: the profile command (and the training demo's arguments)."""

import json
import os
import re
import subprocess

import pytest

from contract_fixtures import MACHINE_TIMED
from helpers import imported, run_cli, run_importtime, run_python
from torch_brickdev.tools.cli import EXIT_CLOSED_PIPE
from torch_brickdev.tools.contract import EXIT_INCONCLUSIVE

pytestmark = pytest.mark.timing

SCRIPT = """
import sys, torch
x = torch.randn(32, 32, device="brick")
for _ in range(int(sys.argv[1])):
    with torch.profiler.record_function("Step"):
        x = torch.tanh(x @ x)
print("argv", sys.argv[1:])
sys.exit(int(sys.argv[2]))
"""


def test_profile_runs_a_script_and_writes_report_and_trace(tmp_path):
    script = tmp_path / "work.py"
    script.write_text(SCRIPT)
    out = run_cli("profile", "-o", str(tmp_path / "out"), str(script), "4", "0")
    assert out.returncode == 0, out.stderr
    assert "argv ['4', '0']" in out.stdout  # the script sees its own argv
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    bricks = {b["name"]: b for b in report["bricks"]}
    assert bricks["Step"]["count"] == 4 and bricks["aten::tanh"]["count"] == 4
    assert report["metadata"]["script"] == str(script)
    trace = json.loads((tmp_path / "out" / "trace.json").read_text())
    assert any(e.get("cat") == "kernel" and e["name"] == "aten::tanh" for e in trace["traceEvents"])


def test_profile_passes_on_the_scripts_exit_code(tmp_path):
    script = tmp_path / "work.py"
    script.write_text(SCRIPT)
    out = run_cli("profile", "--no-trace", "--sync-mode", "deferred", "-o", str(tmp_path),
                  str(script), "1", "3")
    assert out.returncode == 3
    assert json.loads((tmp_path / "report.json").read_text())["sync_mode"] == "deferred"
    assert not (tmp_path / "trace.json").exists()


def test_profile_missing_script_is_a_clear_error(tmp_path):
    out = run_cli("profile", str(tmp_path / "absent.py"))
    assert out.returncode == 2
    assert "no such script" in out.stderr


def test_bad_flags_are_rejected_before_work():
    out = run_cli("train", "--width", "0")
    assert out.returncode == 2 and "positive integer" in out.stderr
    out = run_cli("demo", "--layers", "0")
    assert out.returncode == 2 and "positive integer" in out.stderr
    out = run_cli("demo", "--compile", "--layers", "0")  # the flag parses; the config is checked
    assert out.returncode == 2 and "positive integer" in out.stderr
    out = run_cli("demo", "--device", "brick:7")
    assert out.returncode == 2 and "brick device" in out.stderr
    out = run_cli("demo", "--hidden", "256", "--heads", "6", "--no-progress")
    assert out.returncode == 2 and "heads (6) must divide hidden size (256)" in out.stderr


def test_demo_writes_files_that_load_back_and_recheck(tmp_path):
    out = run_cli("demo", "--no-progress", "--layers", "2", "--hidden", "256", "--heads", "4",
                  "--vocab", "32000", "--prompt-tokens", "4", "--tokens", "16", "--runs", "3",
                  # one kernel thread: run-to-run variation (the stability check) stays low on a
                  # busy 2-core machine
                  "--threads", "1",
                  "-o", str(tmp_path))
    # Every check passes but those whose verdict on a real run is the machine's (see
    # contract_fixtures.MACHINE_TIMED): those may fail, or be inconclusive when the report shows
    # the machine busy; the exit status follows the verdict, and the check command reads the
    # same verdict back from the report.
    lines = out.stdout.splitlines()
    failed = [line.split()[1] for line in lines if line.startswith("FAIL ")]
    unsure = [line for line in lines if line.startswith("INCONCLUSIVE ")]
    assert set(failed) | {line.split()[1] for line in unsure} <= set(MACHINE_TIMED), \
        out.stdout[-3000:] + out.stderr[-3000:]
    assert all("the thread waited for a CPU" in line for line in unsure), unsure
    verdict = "FAIL" if failed else "INCONCLUSIVE" if unsure else "PASS"
    assert out.returncode == {"FAIL": 1, "INCONCLUSIVE": EXIT_INCONCLUSIVE, "PASS": 0}[verdict], \
        out.stdout[-3000:] + out.stderr[-3000:]
    assert f"verdict: {verdict}" in out.stdout
    assert "tokens/s" in out.stdout
    assert (tmp_path / "trace.json").exists()
    check = run_cli("check", str(tmp_path / "report.json"))
    assert check.returncode == out.returncode, check.stdout
    assert sum(line.startswith("PASS ") for line in check.stdout.splitlines()) == \
        11 - len(failed) - len(unsure)
    # A report violating the contract: the check command exits 1 and names the check.
    data = json.loads((tmp_path / "report.json").read_text())
    for brick in data["bricks"]:
        if brick["name"] == "LmHead":
            brick["count"] += 1
            brick["total_ns"] += brick["max_ns"]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    bad = run_cli("check", str(tmp_path / "bad.json"))
    assert bad.returncode == 1 and re.search(r"^FAIL +lmhead-count ", bad.stdout, re.M), bad.stdout
    (tmp_path / "truncated.json").write_text((tmp_path / "report.json").read_text()[:200])
    broken = run_cli("check", str(tmp_path / "truncated.json"))
    assert broken.returncode == 2 and "truncated.json" in broken.stderr


def test_the_demo_writes_no_progress_frames_or_kineto_notices_into_a_log(tmp_path):
    # stdout and stderr are pipes here, as in a log or CI output: no `\r` frames pile up there,
    # and Kineto's "USDT: profiler_start/stop" notices of the profilers brick starts are dropped.
    out = run_cli("demo", "--layers", "1", "--hidden", "64", "--heads", "2", "--kv-heads", "1",
                  "--vocab", "256", "--prompt-tokens", "2", "--tokens", "4", "--runs", "1",
                  "-o", str(tmp_path))
    (tmp_path / "work.py").write_text("import torch\nprint(torch.ones(2, device='brick').sum())\n")
    assert "verdict:" in out.stdout, out.stderr[-3000:]
    assert "\r" not in out.stderr and "\r" not in out.stdout
    assert "USDT:" not in out.stderr
    profiled = run_cli("profile", "-o", str(tmp_path / "profiled"), str(tmp_path / "work.py"))
    assert profiled.returncode == 0 and "USDT:" not in profiled.stderr, profiled.stderr[-2000:]


def _small_report() -> dict:
    bricks = [{"name": f"aten::op{i}", "path": f"aten::op{i}", "kind": "op", "device": 0,
               "depth": 0, "count": 10, "total_ns": 10_000 * (i + 1), "min_ns": 1000 * (i + 1),
               "max_ns": 1000 * (i + 1), "last_ns": 1000 * (i + 1), "p50_ns": 1000.0 * (i + 1),
               "p90_ns": 1000.0 * (i + 1), "p99_ns": 1000.0 * (i + 1)} for i in range(30)]
    return {"schema": "torch_brickdev.report", "version": 1, "sync_mode": "event",
            "wall_ns": 10**9, "device": {"type": "brick"}, "torch": "2.13", "bricks": bricks,
            "paths": bricks}


@pytest.mark.parametrize("command", [
    ["--help"], *([name, "--help"] for name in ("demo", "train", "profile", "check", "diff",
                                                 "merge", "top")),
    # the commands that read JSON, each on a report
    ["check", "{report}"], ["diff", "{report}", "{report}"],
    ["merge", "{report}", "{report}", "-o", "{out}"],
], ids=" ".join)
def test_json_commands_and_help_do_not_import_torch(tmp_path, command):
    (tmp_path / "report.json").write_text(json.dumps(_small_report()))
    command = [arg.format(report=tmp_path / "report.json", out=tmp_path / "merged.json")
               for arg in command]
    out = run_importtime("-m", "torch_brickdev", *command)
    assert out.returncode in (0, 1), out.stderr[-3000:]  # check: the decode contract fails it
    modules = imported(out.stderr)
    assert "torch_brickdev.tools.cli" in modules  # the measurement saw the command's imports
    assert "torch" not in modules and "torch_brickdev._C" not in modules, command


def test_every_command_is_quiet_on_a_closed_pipe(tmp_path):
    # `... | head -1`: the reader has gone when the command writes; no traceback, status 141.
    (tmp_path / "report.json").write_text(json.dumps(_small_report()))
    report = str(tmp_path / "report.json")
    for command in (["diff", report, report, "--all"], ["check", report],
                    ["merge", report, report, "-o", str(tmp_path / "m.json")]):
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            out = run_cli(*command, capture_output=False, stdout=write_end,
                          stderr=subprocess.PIPE)
        finally:
            os.close(write_end)
        assert out.returncode == EXIT_CLOSED_PIPE and out.stderr == "", (command, out.stderr)


def test_only_the_command_line_defers_loading_brick():
    # `import torch_brickdev` registers brick as it always did, and so does running one of the
    # package's modules with -m (only `python -m torch_brickdev` itself defers it).
    code = "import torch_brickdev, torch; print(torch.ones(1, device='brick').device)"
    out = run_python("-c", code)
    assert out.stdout.split() == ["brick:0"], out.stderr[-2000:]
    out = run_importtime("-m", "torch_brickdev.tools._args")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "torch_brickdev._C" in imported(out.stderr)
