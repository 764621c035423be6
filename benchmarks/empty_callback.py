"""The floor of any RecordFunction-based profiler: a global callback that does nothing.

PyTorch runs an op's RecordFunction machinery (the dispatcher's slow path, the RecordFunction
object, the callback calls) as soon as any global callback is registered; what a profiler adds
beyond that is its own cost. This module compiles (once; PyTorch's extension cache keeps it) a
callback pair that returns at once, registered with brick's observer's own options
(csrc/profiler/observer_callback.h), so the benchmarks can measure that floor in the same run as
the profilers they compare with it.
"""

import os

from torch.utils.cpp_extension import load_inline

_CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "csrc")

_SOURCE = r"""
#include "profiler/observer_callback.h"

namespace {
at::CallbackHandle g_handle = 0;
std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction&) { return nullptr; }
void on_exit(const at::RecordFunction&, at::ObserverContext*) {}
}  // namespace

void set_enabled(bool enabled) {
  if (enabled && g_handle == 0) {
    g_handle = at::addGlobalCallback(brick::profiler::observer_callback(&on_enter, &on_exit));
  } else if (!enabled && g_handle != 0) {
    at::removeCallback(g_handle);
    g_handle = 0;
  }
}
"""

_module = None


def load():
    """The compiled module (set_enabled(bool)); the first call in a fresh cache takes ~30 s."""
    global _module
    if _module is None:
        _module = load_inline("brick_bench_empty_callback", cpp_sources=_SOURCE,
                              functions=["set_enabled"], extra_cflags=["-O2"],
                              extra_include_paths=[_CSRC])
    return _module
