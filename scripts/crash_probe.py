"""Where a crash seen on the GPU machine happens, for the GPU job (`scripts/run.sh gpu --more`).

GPU runs saw segfaults in NCCL collectives of a process that had loaded brick, and in the first op
profiled with input shapes. Each case below runs alone, in a fresh process (one rank for the NCCL
ones), so a crash names its case, with its native backtrace:
  plain         a cuda tensor on NCCL, brick not loaded          (the machine's NCCL itself)
  brick-loaded  a cuda tensor on NCCL, brick loaded, not used    (brick's mere presence)
  brick         a brick tensor through brick's backend on NCCL   (brick's path)
  engine-alone  a cuda tensor on NCCL made as brick makes it     (no process group around it)
  cuda-after-brick  plain NCCL on a cuda tensor once brick ran    (brick's runtime in the process)
  mixed-group   brick's and a cuda tensor's all_reduce in one "cpu:gloo,cuda:nccl,brick:brick"
                group (test_distributed's NCCL scenario)
  brick-async   a brick tensor's all_reduce(async_op=True), its Work waited for, its future read
  mixed-async   the same after synchronous ones on brick and cuda in a mixed group (as
                test_distributed's NCCL scenario, which crashed there)
  record-shapes one mm on brick profiled in event mode with input shapes (test_record_shapes)
Under gdb, where the machine has it, a crash also prints its C++ backtrace; without gdb, a
preloaded handler (scripts/segv_backtrace.c, built with the machine's C compiler) prints the
crashing thread's frames, each of brick's own named by addr2line where the machine has it.

Run: python scripts/crash_probe.py [case ...]   (exit status: the number of cases that failed)
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

CASE_BODY = {
    "plain": "import torch, torch.distributed as dist\n"
             "dist.init_process_group('nccl', store=store, rank=0, world_size=1)\n"
             "t = torch.ones(8, device='cuda')\n",
    "brick-loaded": "import torch, torch_brickdev, torch.distributed as dist\n"
                    "dist.init_process_group('nccl', store=store, rank=0, world_size=1)\n"
                    "t = torch.ones(8, device='cuda')\n",
    "brick": "import torch, torch_brickdev, torch.distributed as dist\n"
             "dist.init_process_group('brick', store=store, rank=0, world_size=1)\n"
             "t = torch.ones(8, device='brick')\n",
    # Plain NCCL on a cuda tensor after brick's CUDA runtime was used in the process.
    "cuda-after-brick": "import torch, torch_brickdev, torch.distributed as dist\n"
                        "dist.init_process_group('nccl', store=store, rank=0, world_size=1)\n"
                        "(torch.ones(8, device='brick') * 2).cpu()\n"
                        "t = torch.ones(8, device='cuda')\n",
    # One group, an engine per device type (as test_distributed's NCCL scenario): brick's
    # collective, then plain NCCL's on a cuda tensor.
    "mixed-group": "import torch, torch_brickdev, torch.distributed as dist\n"
                   "dist.init_process_group('cpu:gloo,cuda:nccl,brick:brick', store=store,\n"
                   "                        rank=0, world_size=1)\n"
                   "b = torch.ones(8, device='brick'); dist.all_reduce(b)\n"
                   "assert b.cpu().tolist() == [1.0] * 8, b\n"
                   "t = torch.ones(8, device='cuda')\n",
    # NCCL made as brick makes its engine (no process group around it), on a cuda tensor.
    "engine-alone": "import torch, torch_brickdev, torch.distributed as dist\n"
                    "engine = dist.ProcessGroupNCCL(dist.PrefixStore('nccl/', store), 0, 1,\n"
                    "                               dist.ProcessGroupNCCL.Options())\n"
                    "all_reduce = lambda t: engine.allreduce([t]).wait()\n"
                    "t = torch.ones(8, device='cuda')\n",
    "brick-async": "import torch, torch_brickdev, torch.distributed as dist\n"
                   "dist.init_process_group('brick', store=store, rank=0, world_size=1)\n"
                   "def all_reduce(t):\n"
                   "    work = dist.all_reduce(t, async_op=True)\n"
                   "    print('queued', flush=True)\n"
                   "    work.wait()\n"
                   "    print('waited', flush=True)\n"
                   "    assert work.get_future().wait()[0].data_ptr() == t.data_ptr()\n"
                   "t = torch.ones(8, device='brick')\n",
    # test_distributed's NCCL scenario up to its crash: synchronous all_reduces on brick and on
    # cuda in one mixed group, then brick's asynchronous one.
    "mixed-async": "import torch, torch_brickdev, torch.distributed as dist\n"
                   "dist.init_process_group('cpu:gloo,cuda:nccl,brick:brick', store=store,\n"
                   "                        rank=0, world_size=1)\n"
                   "torch.cuda.set_device(0); torch.brick.set_device(0)\n"
                   "for d in ('brick', 'cuda'):\n"
                   "    x = torch.ones(8, device=d) * 3; dist.all_reduce(x)\n"
                   "    print('sync ok on', d, flush=True)\n"
                   "def all_reduce(t):\n"
                   "    work = dist.all_reduce(t, async_op=True)\n"
                   "    print('queued', flush=True)\n"
                   "    work.wait()\n"
                   "    assert work.get_future().wait()[0].data_ptr() == t.data_ptr()\n"
                   "t = torch.ones(8, device='brick')\n",
}

# Cases that are not an all_reduce: the whole script (it prints "probe ok" when it got through).
WHOLE_SCRIPT = {
    "record-shapes": "import torch, torch_brickdev.profiler as bp\n"
                     "w = torch.randn(8, 16, device='brick')\n"
                     "a = torch.randn(4, 8, device='brick')\n"
                     "print('made', flush=True)\n"
                     "with bp.profile(sync_mode='event', record_shapes=True) as p:\n"
                     "    torch.mm(a, w)\n"
                     "    print('mm queued', flush=True)\n"
                     "print(p.report.shape_stats())\n"
                     "print('probe ok')\n",
}

PRELUDE = ("import datetime, sys\n"
           "import torch.distributed as dist\n"
           "store = dist.FileStore(sys.argv[1], 1)\n"
           "all_reduce = dist.all_reduce\n")
EPILOGUE = ("all_reduce(t)\n"
            "assert t.cpu().tolist() == [1.0] * 8, t\n"
            "if dist.is_initialized(): dist.destroy_process_group()\n"
            "print('probe ok')\n")


def build_backtrace_preload(workdir: str):
    """The crash-backtrace handler as a shared library, or None (no C compiler)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "segv_backtrace.c")
    library = os.path.join(workdir, "segv_backtrace.so")
    done = subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", library, source, "-ldl"],
                          capture_output=True, text=True, timeout=60)
    return library if done.returncode == 0 else None


FRAME = re.compile(r"^(?P<lib>[^ (]+)\((?P<symbol>[^)+]*)\+(?P<offset>0x[0-9a-f]+)\)")


def symbolize(output: str) -> str:
    """Each backtrace frame of a library with an offset, followed by addr2line's function and
    line where the machine has it (symbols of brick's hidden functions, say)."""
    addr2line = shutil.which("addr2line")
    lines = []
    for line in output.splitlines():
        lines.append(line)
        match = FRAME.match(line.strip())
        if addr2line is None or match is None or match["symbol"]:
            continue
        if "torch_brickdev" not in match["lib"] and "/build/" not in match["lib"]:
            continue  # brick's own frames only: PyTorch's exported ones are named already
        try:
            command = [addr2line, "-f", "-C", "-i", "-e", match["lib"], match["offset"]]
            named = subprocess.run(command, capture_output=True, text=True, timeout=20).stdout.split("\n")
        except (OSError, subprocess.TimeoutExpired):
            continue
        lines.append("        = " + " at ".join(part for part in named[:6] if part))
    text = "\n".join(lines)
    if shutil.which("c++filt"):  # the exported C++ symbols' names, demangled
        try:
            text = subprocess.run(["c++filt"], input=text, capture_output=True, text=True,
                                  timeout=20).stdout or text
        except (OSError, subprocess.TimeoutExpired):
            pass
    return text


def run_case(case: str, workdir: str) -> bool:
    script = os.path.join(workdir, f"{case}.py")
    with open(script, "w") as f:
        f.write(WHOLE_SCRIPT[case] if case in WHOLE_SCRIPT
                else PRELUDE + CASE_BODY[case] + EPILOGUE)
    command = [sys.executable, script, os.path.join(workdir, f"{case}.store")]
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    if case == "plain":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # brick is not loaded at all
    if shutil.which("gdb"):
        command = ["gdb", "-q", "-batch", "-ex", "run", "-ex", "bt 40", "--args"] + command
    else:
        preload = build_backtrace_preload(workdir)
        if preload is not None:
            env["LD_PRELOAD"] = preload
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        print(f"crash-probe {case}: TIMED OUT after 120 s")
        return False
    output = done.stdout + done.stderr
    # (Under gdb the exit status is gdb's: a program that exited cleanly says so.)
    finished = done.returncode == 0 or "exited normally" in output
    ok = finished and "probe ok" in output and "received signal" not in output
    print(f"crash-probe {case}: {'ok' if ok else f'FAILED (exit {done.returncode})'}")
    if not ok:
        print("\n".join("    " + line for line in symbolize(output).strip().splitlines()[-160:]))
    return ok


def main() -> int:
    known = list(CASE_BODY) + list(WHOLE_SCRIPT)
    cases = sys.argv[1:] or known
    unknown = [c for c in cases if c not in known]
    if unknown:
        print(f"crash_probe: unknown case(s) {unknown}; expected some of {known}")
        return 2
    with tempfile.TemporaryDirectory() as workdir:
        return sum(not run_case(case, workdir) for case in cases)


if __name__ == "__main__":
    sys.exit(main())
