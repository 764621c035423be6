"""Lets PyTorch's autograd device threads of the brick devices finish before the interpreter
shuts down (registered with atexit on import).

Backward on brick runs on PyTorch's autograd device threads (one per brick device), as on
CUDA. After ``backward()`` returns, such a thread still drops its last reference to the finished
task, whose captured thread-local state can hold Python objects; done while the interpreter
finalizes, taking the GIL for them ends the thread inside a C++ frame and the process aborts
("terminate called without an active exception", seen in 2 of 40 runs of a three-step brick
training script on a loaded 2-core machine, and under DDP's backward tail), turning a finished
run into a failed one.

A trivial backward queued on each device makes the caller wait until that device's thread takes
its next task, i.e. has finished the previous one (the GIL is released while the caller waits);
a short sleep then lets the thread drop the trivial task too (it completes the caller's wait
just before it drops the task). Done only where PyTorch started the device threads.
"""

from __future__ import annotations

import os
import threading
import time

import torch

from . import _C

_TIMEOUT_S = 5.0  # exit never waits longer, whatever the device does
_SETTLE_S = 0.02


def _autograd_threads_running() -> bool:
    """Whether PyTorch started its autograd device threads (named ``pt_autograd_<device>``):
    only then is there anything to wait for. Starting them at exit would itself race with the
    shutdown (each takes the GIL as it starts)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                if f.read().startswith("pt_autograd_"):
                    return True
        except OSError:  # a thread that ended meanwhile
            continue
    return False


def drain_autograd_device_threads() -> None:
    if not _autograd_threads_running():
        return
    devices = _C._devices_in_use()  # (never a CUDA context on an unused GPU)

    def trivial_backwards():
        for index in devices:
            try:
                x = torch.zeros((), device=torch.device("brick", index), requires_grad=True)
                x.sum().backward()
            except Exception:  # shutting down: never turn an exit into an error
                pass

        time.sleep(_SETTLE_S)  # the GIL released: the device threads end their iteration

    thread = threading.Thread(target=trivial_backwards, name="brick-autograd-drain", daemon=True)
    thread.start()
    thread.join(_TIMEOUT_S)
