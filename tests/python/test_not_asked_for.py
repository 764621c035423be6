"""Brick changes nothing it is not asked for: with brick installed, a Python that does not ask for
it (``import torch_brickdev``, ``python -m torch_brickdev``, ``BRICK_AUTOLOAD=1``) behaves as if
brick were not installed. Each case runs in a fresh interpreter (what ``import torch`` loads is
decided once per process)."""

import json
import os
import shutil
import subprocess
import textwrap

import pytest

from helpers import run_python

STATE = """
import json, sys, torch
accelerator = torch.accelerator.current_accelerator()
print(json.dumps({"privateuse1": torch._C._get_privateuse1_backend_name(),
                  "loaded": "torch_brickdev" in sys.modules,
                  "accelerator": None if accelerator is None else str(accelerator)}))
"""


def python(script: str, timeout: float = 120.0, **env_changes) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("BRICK_AUTOLOAD",
                                                            "TORCH_DEVICE_BACKEND_AUTOLOAD")}
    env.update(env_changes)
    return run_python("-c", textwrap.dedent(script), env=env, timeout=timeout)


def state(prefix: str = "", **env_changes) -> dict:
    done = python(prefix + STATE, **env_changes)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_torch_leaves_the_process_as_without_brick():
    unasked = state()
    without_backends = state(TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert unasked == without_backends
    assert unasked["privateuse1"] == "privateuseone" and not unasked["loaded"]


def test_asking_for_brick_makes_it_the_accelerator():
    # PyTorch, not brick, decides this: a registered PrivateUse1 backend comes before CUDA.
    for asked in (state("import torch_brickdev\n"), state(BRICK_AUTOLOAD="1")):
        assert asked == {"privateuse1": "brick", "loaded": True, "accelerator": "brick"}
    done = python("import torch; print(torch.ones(2, device='brick').device)", BRICK_AUTOLOAD="1")
    assert done.returncode == 0 and done.stdout.strip() == "brick:0", done.stderr[-2000:]


def test_brick_autoload_takes_only_0_or_1():
    done = python("import torch", BRICK_AUTOLOAD="yes")
    assert done.returncode != 0
    assert "BRICK_AUTOLOAD='yes'" in done.stderr and "expected 1" in done.stderr
    assert state(BRICK_AUTOLOAD="0")["privateuse1"] == "privateuseone"


def test_the_pytest_plugin_loads_no_brick():
    done = python("""
        import sys, pytest_torch_brickdev, torch
        print(torch._C._get_privateuse1_backend_name(), "torch_brickdev" in sys.modules)
    """)
    assert done.returncode == 0 and done.stdout.split() == ["privateuseone", "False"], done.stderr


FSDP2_CPU_SCRIPT = """
import json, os, sys
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
fully_shard(model)  # no mesh: FSDP2 builds its default one on torch.accelerator's device
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(4, 8)
losses = []
for _ in range(3):
    loss = model(x).pow(2).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    losses.append(loss.item())
devices = sorted({p.device.type for p in model.parameters()})
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({"losses": losses, "devices": devices}, f)
dist.destroy_process_group()
# Out at once: on a loaded machine PyTorch's own gloo/FSDP2 teardown at interpreter exit
# sometimes aborts ("terminate called without an active exception"), with or without brick
# installed; what is compared here is the run and its results.
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.timeout(300)
def test_a_cpu_only_fsdp2_script_runs_as_without_brick(tmp_path):
    script = tmp_path / "fsdp2_cpu.py"
    script.write_text(FSDP2_CPU_SCRIPT)
    results = {}
    for name, env_changes in (("unasked", {}), ("without", {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})):
        out = tmp_path / f"{name}.json"
        done = python(f"""
            import sys
            from torch.distributed.run import main
            sys.exit(main(["--standalone", "--nproc-per-node", "2", {str(script)!r},
                           {str(out)!r}]))
        """, timeout=240, OMP_NUM_THREADS="1", **env_changes)
        assert done.returncode == 0, (name, done.stderr[-4000:])
        results[name] = json.loads(out.read_text())
    assert results["unasked"] == results["without"]
    assert results["unasked"]["devices"] == ["cpu"]


def test_the_module_exports_its_init_function_and_none_of_brick_s_own():
    # An exported function of brick's could stand in for a like-named one of another library
    # loaded after it, or be replaced by one (ELF symbol interposition): brick's module exports
    # only what Python loads it by. (The standard library's template code compiled into it keeps
    # libstdc++'s default visibility.)
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm (binutils) to read the module's dynamic symbols")
    import torch_brickdev._C as module

    listed = subprocess.run([nm, "-D", "-C", "--defined-only", module.__file__],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    names = [line.split(" ", 2)[2] for line in listed.splitlines() if line.count(" ") >= 2]
    assert "PyInit__C" in names
    # brick's functions, and the guard variables, type info and vtables of brick's types
    assert [name for name in names if "brick::" in name and not name.startswith("std::")] == []
