"""Nothing the test command builds can be left half-built by an interrupted run.

The benchmarks' native helper (benchmarks/empty_callback.cpp) is a CMake target: a run killed
mid-compile leaves what ninja knows to redo, never a lock that blocks every later run (as
``torch.utils.cpp_extension``'s compile lock did once its compile was killed).
"""

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import run_python

ROOT = Path(__file__).resolve().parents[2]


def _compiler_running(build_dir: Path) -> bool:
    """A compiler (cc1plus) or linker working for this build folder's ninja."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        name = os.path.basename(cmdline[0]).decode(errors="replace")
        if cwd == str(build_dir) and name in ("cc1plus", "ld", "collect2"):
            return True
    return False


def _configure(build_dir: Path, env: dict) -> None:
    subprocess.run(
        ["cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
         f"-DPython_EXECUTABLE={sys.executable}", "-DBRICK_BUILD_BENCHMARKS=ON",
         "-DBRICK_WITH_CUDA=OFF"],
        check=True, env=env, stdout=subprocess.DEVNULL, timeout=300)


def _build(build_dir: Path, env: dict, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        ["cmake", "--build", str(build_dir), "--target", "brick_bench_empty_callback"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        **kwargs)


@pytest.mark.skipif(shutil.which("ninja") is None, reason="needs ninja")
@pytest.mark.timeout(900)
def test_a_build_killed_mid_compile_is_completed_by_the_next(tmp_path):
    build_dir = tmp_path / "build"
    # The compiler itself, not a cache hit: a compile to interrupt must happen.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CMAKE_") or "LAUNCHER" not in k}
    env["CCACHE_DISABLE"] = "1"
    _configure(build_dir, env)

    first = _build(build_dir, env)
    deadline = time.monotonic() + 300
    while not _compiler_running(build_dir) and first.poll() is None:
        assert time.monotonic() < deadline, "the build never started its compiler"
        time.sleep(0.05)
    assert first.poll() is None, "the build ended before it could be interrupted"
    time.sleep(random.uniform(0.0, 1.0))  # somewhere inside the compile
    os.killpg(first.pid, signal.SIGKILL)  # as `timeout --kill-after` or a lost CI runner does
    first.wait(timeout=60)
    library = build_dir / "libbrick_bench_empty_callback.so"

    second = _build(build_dir, env)
    output, _ = second.communicate(timeout=600)
    assert second.returncode == 0, output.decode(errors="replace")
    assert library.is_file()

    # The rebuilt helper loads and registers and removes its callback around real ops.
    check = (
        "import sys, torch; sys.path.insert(0, sys.argv[1]); import empty_callback\n"
        "module = empty_callback.load()\n"
        "module.set_enabled(True); y = torch.ones(3) + 1; module.set_enabled(False)\n"
        "assert y.sum().item() == 6.0\n"
        "print('loaded', empty_callback.library_path())\n"
    )
    run = run_python("-c", check, str(ROOT / "benchmarks"),
                     env={**env, "BRICK_BUILD_DIR": str(build_dir)}, timeout=300)
    assert run.returncode == 0, run.stderr
    assert str(library) in run.stdout


def test_no_test_or_benchmark_compiles_at_run_time():
    """A compile started by a test or benchmark (torch.utils.cpp_extension.load/load_inline) is
    what an interrupted run can leave locked for good: native helpers are CMake targets."""
    offenders = []
    for folder in ("tests", "benchmarks", "torch_brickdev", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == Path(__file__).resolve():
                continue
            text = path.read_text(errors="replace")
            if "cpp_extension import load" in text or "cpp_extension.load" in text:
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"compiled at run time: {offenders}"


def test_a_missing_helper_is_named_with_the_way_to_build_it(tmp_path):
    check = (
        "import sys; sys.path.insert(0, sys.argv[1]); import empty_callback\n"
        "try:\n    empty_callback.load()\n"
        "except FileNotFoundError as error:\n    print(error)\n"
    )
    run = run_python("-c", check, str(ROOT / "benchmarks"),
                     env=dict(os.environ, BRICK_BUILD_DIR=str(tmp_path)))
    assert run.returncode == 0, run.stderr
    assert "libbrick_bench_empty_callback.so is missing" in run.stdout
    assert "BRICK_BUILD_BENCHMARKS=ON" in run.stdout
