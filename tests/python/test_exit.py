"""A program that ran backward on brick exits cleanly: PyTorch's autograd device threads finish
their last task before the interpreter shuts down (torch_brickdev/_autograd_exit.py). Without
that, 4 of 40 runs of the script below aborted at exit beside two busy loops on a 2-core machine
("terminate called without an active exception"); with it, 0 of 100."""

from __future__ import annotations

import os
import subprocess

import pytest

from helpers import busy_loops, run_python, start_python

TRAIN = """
import torch, torch_brickdev
from torch import nn
m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Flatten(),
                  nn.Linear(16 * 32 * 32, 10)).to("brick")
x = torch.randn(8, 3, 32, 32, device="brick")
for _ in range(3):
    m(x).sum().backward()
"""


def test_the_device_threads_are_seen_once_backward_started_them():
    code = ("import torch, torch_brickdev\n"
            "from torch_brickdev._autograd_exit import _autograd_threads_running as running\n"
            "before = running()\n"
            "x = torch.ones(2, device='brick', requires_grad=True)\n"
            "x.sum().backward()\n"
            "print(before, running())\n")
    done = run_python("-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]


@pytest.mark.timeout(240)
def test_training_scripts_exit_cleanly_on_a_busy_machine(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    loops = busy_loops(len(os.sched_getaffinity(0)), seconds=200)
    # 12 scripts, 4 at a time: each exits while the loops and the other scripts want the CPUs
    # (busier than one at a time), in about a third of the wall time.
    codes, batch = [], []
    try:
        for _ in range(3):
            batch = [start_python(str(script), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(4)]
            for run in batch:
                try:
                    _, stderr = run.communicate(timeout=120)
                except subprocess.TimeoutExpired:
                    run.kill()
                    _, stderr = run.communicate()
                    stderr += "\n(killed: still running after 120 s)"
                codes.append(subprocess.CompletedProcess(run.args, run.returncode, "", stderr))
    finally:
        for p in loops + batch:
            p.kill()
            p.wait()
    failed = [c for c in codes if c.returncode != 0]
    assert not failed, (f"{len(failed)} of {len(codes)} runs failed, the first with exit "
                        f"{failed[0].returncode}: {failed[0].stderr[-2000:]}")
