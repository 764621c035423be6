"""The GPU job's step accounting (scripts/gpu_job.sh): each failed step is counted and named
once, a step killed by its bound says so in its own log, and a rehearsal's bounds are hang guards
scaled past what a busy machine needs."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _job(script: str, tmp_path, time_scale: int = 1) -> subprocess.CompletedProcess:
    """Runs ``script`` in bash with the GPU job's functions and a fresh step state."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    prelude = (
        "set -euo pipefail\n"
        f"cd {ROOT}\n"
        "source scripts/gpu_job.sh\n"
        f"logs={tmp_path}\n"
        ": >\"$logs/summary.txt\"\n"
        f"ran_steps=() failed_steps=() time_scale={time_scale}\n"
        "deadline=$(($(date +%s) + 600))\n"
    )
    return subprocess.run(["bash", "-c", prelude + script], capture_output=True, text=True,
                          timeout=120)


def test_a_timed_out_step_is_one_failure_named_with_its_log(tmp_path):
    run = _job(
        "gpu_step quick 10 echo fine\n"
        "gpu_step silent 6 sleep 60\n"  # killed before it prints anything
        "gpu_step loud 10 bash -c 'echo 3 passed'\n"
        "gpu_summary || echo \"summary exit $?\"\n",
        tmp_path)
    assert run.returncode == 0, run.stderr
    last = run.stdout.strip().splitlines()
    assert "gpu: 3 step(s), 1 failed (silent);" in last[-2], run.stdout
    assert last[-1] == "summary exit 1"
    assert "TIMED OUT after 6 s" in run.stdout
    log = (tmp_path / "silent.log").read_text()
    assert "killed after 6 s; load average" in log


def test_a_passing_step_with_an_empty_log_is_named(tmp_path):
    run = _job("gpu_step mute 10 true\ngpu_summary || echo \"summary exit $?\"\n", tmp_path)
    assert "gpu: mute passed but left an empty log" in run.stderr
    assert "gpu: 1 step(s), 1 failed (mute);" in run.stdout
    assert run.stdout.strip().endswith("summary exit 1")


def test_every_step_passing_passes(tmp_path):
    run = _job("gpu_step one 10 echo hello\ngpu_step two 10 echo world\ngpu_summary\n", tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "gpu: 2 step(s), 0 failed; logs in" in run.stdout


def test_a_rehearsal_scales_each_bound(tmp_path):
    # A 3 s bound at 8x holds a 10 s step: a busy machine's slowness is not a hang. At 2x, the
    # same bound kills it.
    step = "gpu_step slow 3 bash -c 'sleep 10; echo done'\ngpu_summary\n"
    scaled = _job(step, tmp_path / "scaled", time_scale=8)
    assert "gpu: 1 step(s), 0 failed;" in scaled.stdout, scaled.stdout + scaled.stderr
    unscaled = _job(step, tmp_path / "unscaled", time_scale=2)
    assert "TIMED OUT after 6 s" in unscaled.stdout, unscaled.stdout + unscaled.stderr
