"""What many test files share: child Python processes of this interpreter (the package's command
line, torchrun, busy loops, ``-X importtime`` readings) and edits of report dicts.

A test file imports it as ``from helpers import ...`` (tests/python is on sys.path under pytest,
as for the other shared modules here). It imports neither torch nor torch_brickdev."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The folder holding the torch_brickdev under test (the checkout where it is built in place or
# installed editable), and the pytest plugin module beside it: found without importing it.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(importlib.util.find_spec("torch_brickdev").origin))
# A child that imports torch ends well within it, also on a loaded 2-core machine.
TIMEOUT_S = 120


def child_env(**changes) -> dict:
    """This process's environment with PACKAGE_ROOT first on PYTHONPATH (a child started in
    another folder imports the torch_brickdev under test), and ``changes``."""
    path = os.pathsep.join(filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, **changes)


def no_autoload_env(**changes) -> dict:
    """This process's environment for a child whose ``import torch`` loads no device backend
    (brick only where the child imports torch_brickdev), and ``changes``."""
    return dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0", **changes)


def run_python(*args, timeout=TIMEOUT_S, capture_output=True, **kwargs):
    """``python *args`` with this interpreter, waited for; its output captured as text unless
    ``capture_output=False`` (then it goes where ``stdout``/``stderr`` say, by default to the
    test's own). Other keywords (env, cwd, check) go to subprocess.run."""
    return subprocess.run([sys.executable, *args], capture_output=capture_output, text=True,
                          timeout=timeout, **kwargs)


def run_cli(*args, **kwargs):
    """``python -m torch_brickdev *args``, as run_python runs it."""
    return run_python("-m", "torch_brickdev", *args, **kwargs)


def start_python(*args, **kwargs) -> subprocess.Popen:
    """``python *args`` with this interpreter, started; keywords go to subprocess.Popen."""
    return subprocess.Popen([sys.executable, *args], **kwargs)


def ended_pid() -> int:
    """The pid of a child of this process that has run to its end."""
    return int(run_python("-c", "import os; print(os.getpid())", timeout=60).stdout)


def run_torchrun(nproc, *args, timeout, env=None):
    """``torchrun --standalone --nproc-per-node nproc *args``, waited for; running past
    ``timeout`` fails the test with the tails of what it printed."""
    try:
        return run_python("-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                          str(nproc), *args, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"torchrun {' '.join(map(str, args))} ran past {timeout} s: "
                    f"{str(expired.stdout)[-2000:]}\n{str(expired.stderr)[-2000:]}")


def busy_loops(n, seconds, cpu=None) -> list:
    """``n`` processes that each spin for ``seconds`` (on CPU ``cpu`` alone where given); the
    caller kills them."""
    pin = "" if cpu is None else f"os.sched_setaffinity(0, {{{cpu}}})\n"
    code = f"import os, time\n{pin}end = time.time() + {seconds}\nwhile time.time() < end: pass\n"
    return [start_python("-c", code) for _ in range(n)]


def run_importtime(*args, **kwargs):
    """``python -X importtime *args``, as run_python runs it; ``imported`` reads its stderr."""
    return run_python("-X", "importtime", *args, **kwargs)


def imported(importtime_stderr: str) -> list:
    """The modules a ``python -X importtime`` run imported, in its stderr's order."""
    return [line.rsplit("|", 1)[-1].strip() for line in importtime_stderr.splitlines()
            if line.startswith("import time:")]


def set_avg(report_dict, name, avg_ns):
    """Gives the per-name brick ``name`` of a report dict the average ``avg_ns`` over its calls,
    its min, max and avg_us kept consistent with it (the report's integrity check reads them)."""
    brick = next(b for b in report_dict["bricks"] if b["name"] == name)
    brick["total_ns"] = int(avg_ns * brick["count"])
    brick["max_ns"] = max(brick["max_ns"], int(avg_ns) + 1)
    brick["min_ns"] = min(brick["min_ns"], int(avg_ns) - 1)
    brick["avg_us"] = brick["total_ns"] / brick["count"] / 1000
