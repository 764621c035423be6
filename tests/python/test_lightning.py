"""PyTorch Lightning on brick: ``Trainer(accelerator="brick", devices=N, precision=...)``.

Each run is lightning_script.py in a fresh process (Lightning's DDP launcher re-runs the script
for its other ranks), compared with the same script on ``accelerator="cpu"``: the trained
parameters must be bit-equal (brick runs the CPU's kernels; the DDP runs reduce over brick's
backend where the CPU's use gloo, both summing two ranks in the same order).
"""

import functools
import json
import os
import re
import tempfile
import textwrap

import pytest

from helpers import run_python

pytest.importorskip("lightning", reason="Lightning is not installed")

SCRIPT = os.path.join(os.path.dirname(__file__), "lightning_script.py")


def _clean_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MASTER_", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
                                "RANK", "TORCHELASTIC", "PL_"))}
    env["OMP_NUM_THREADS"] = "1"  # two ranks on two cores; the same for brick and the CPU
    return env


def train(accelerator, devices=1, strategy="auto", precision="32-true", *extra, timeout=240):
    with tempfile.TemporaryDirectory() as cwd:  # Lightning's profiler writes its traces there
        done = run_python(SCRIPT, accelerator, str(devices), strategy, precision, *extra,
                          timeout=timeout, env=_clean_env(), cwd=cwd)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, (
        f"lightning_script.py {accelerator} {devices} {strategy} {precision} exited with "
        f"{done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    result["output"] = done.stdout + done.stderr  # Lightning logs its reports to stderr
    return result


def test_one_device_trains_on_brick_equal_to_the_cpu():
    brick, cpu = train("brick"), train("cpu")
    assert (brick["accelerator"], brick["strategy"], brick["root_device"]) == (
        "BrickAccelerator", "SingleDeviceStrategy", "brick:0")
    assert brick["batch_devices"] == ["brick:0"]  # not silently the CPU
    assert brick["parameters"] == cpu["parameters"]


def test_bf16_mixed_autocasts_on_brick():
    brick, cpu = train("brick", precision="bf16-mixed"), train("cpu", precision="bf16-mixed")
    assert brick["compute_dtypes"] == ["torch.bfloat16"] == cpu["compute_dtypes"]
    assert brick["parameters"] == cpu["parameters"]


@functools.lru_cache(maxsize=None)
def _cpu_ddp_parameters():
    """The CPU's two-process DDP run, the reference of both brick strategies below (brick's
    "auto" is DDP too): trained once per session."""
    return train("cpu", 2, "ddp")["parameters"]


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_two_devices_train_with_ddp_over_brick(strategy):
    brick = train("brick", 2, strategy)
    assert (brick["strategy"], brick["root_device"], brick["backend"]) == (
        "BrickDDPStrategy", "brick:0", "brick")
    assert brick["batch_devices"] == ["brick:0"]  # rank 0's; rank 1 trains on brick:1
    assert brick["parameters"] == _cpu_ddp_parameters()


def test_lightning_profiler_shows_brick_device_time():
    result = train("brick", 1, "auto", "32-true", "--profile")
    lines = result["output"].splitlines()
    header = next(line for line in lines if "Self CPU %" in line)
    columns = re.split(r"\s{2,}", header.strip())
    assert "BRICK total" in columns, header
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines]
    matmuls = [row for row in rows if row[0] in ("aten::addmm", "aten::mm")]
    assert matmuls, "no matmul row in Lightning's profiler report"
    for row in matmuls:
        assert not row[columns.index("BRICK total")].startswith("0.000"), row


_OTHER_TRAINERS = """
import json, torch, torch_brickdev
import lightning.pytorch as pl
chosen = {}
for accelerator in ("auto", "cpu"):
    trainer = pl.Trainer(accelerator=accelerator, devices=1, logger=False,
                         enable_progress_bar=False)
    chosen[accelerator] = [type(trainer.accelerator).__name__, str(trainer.strategy.root_device)]
mixed = pl.Trainer(accelerator="cpu", devices=1, precision="bf16-mixed", logger=False)
chosen["cpu bf16-mixed"] = mixed.precision_plugin.device
print(json.dumps(chosen))
"""


def test_other_trainers_are_left_as_lightning_makes_them():
    done = run_python("-c", textwrap.dedent(_OTHER_TRAINERS), env=_clean_env())
    assert done.returncode == 0, done.stderr[-2000:]
    chosen = json.loads(done.stdout.strip().splitlines()[-1])
    assert chosen == {"auto": ["CPUAccelerator", "cpu"], "cpu": ["CPUAccelerator", "cpu"],
                      "cpu bf16-mixed": "cpu"}


_BAD_DEVICES = """
import torch_brickdev
import lightning.pytorch as pl
from lightning.pytorch.utilities.exceptions import MisconfigurationException
for devices in (0, 3, [0, 0], [5], "x", True):
    try:
        pl.Trainer(accelerator="brick", devices=devices, logger=False)
    except MisconfigurationException as error:
        print(repr(devices), "->", error)
    else:
        print(repr(devices), "-> accepted")
"""


def test_bad_devices_are_refused_with_what_was_expected():
    done = run_python("-c", textwrap.dedent(_BAD_DEVICES), env=_clean_env())
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 6 and not any("accepted" in line for line in lines), done.stdout
    assert "devices=0" in lines[0]  # Lightning's own check
    for line in lines[1:]:
        assert "devices=" in line and "expected a positive count of brick devices" in line, line


_WITHOUT_LIGHTNING = """
import sys
class NoLightning:
    def find_spec(self, name, path=None, target=None):
        if name == "lightning" or name.startswith("lightning."):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, NoLightning())
import torch, torch_brickdev
print("brick", torch.ones(2, device="brick").sum().item())
try:
    import torch_brickdev.integrations.lightning
except ImportError as error:
    print("integration:", error)
"""


def test_brick_imports_without_lightning():
    done = run_python("-c", textwrap.dedent(_WITHOUT_LIGHTNING), env=_clean_env())
    assert done.returncode == 0, done.stderr[-2000:]
    assert "brick 2.0" in done.stdout and "integration: No module named 'lightning'" in done.stdout
