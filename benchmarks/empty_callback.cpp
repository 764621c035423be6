// The floor of any RecordFunction-based profiler: a global callback pair that returns at once,
// registered with brick's observer's own options (csrc/profiler/observer_callback.h), so the
// benchmarks measure that floor in the same run as the profilers they compare with it.
// Built by CMake beside the module (target brick_bench_empty_callback), loaded with ctypes by
// benchmarks/empty_callback.py: nothing is compiled at run time, so no interrupted run can leave
// a half-built helper or a stale compile lock behind.
#include "profiler/observer_callback.h"

namespace {
at::CallbackHandle g_handle = 0;
std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction&) { return nullptr; }
void on_exit(const at::RecordFunction&, at::ObserverContext*) {}
}  // namespace

// Registers (1) or removes (0) the empty callback pair; idempotent. Called from one thread.
extern "C" __attribute__((visibility("default"))) void brick_bench_empty_callback_set_enabled(
    int enabled) {
  if (enabled && g_handle == 0) {
    g_handle = at::addGlobalCallback(brick::profiler::observer_callback(&on_enter, &on_exit));
  } else if (!enabled && g_handle != 0) {
    at::removeCallback(g_handle);
    g_handle = 0;
  }
}
