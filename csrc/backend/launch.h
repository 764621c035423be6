// Announces the work the backend queues on a brick device to an installed kernel timer, launch
// observer and queue hook (runtime/launch_observer.h). Costs one atomic load (acquire: a plain
// load on x86) of the hook table per launch, and a compare of it with the empty table.
#pragma once

#include <c10/core/Device.h>

#include "runtime/launch_observer.h"
#include "runtime/work_marks.h"

namespace brick::backend {

class LaunchScope {
 public:
  LaunchScope(const char* name, runtime::LaunchKind kind) noexcept
      : hooks_(runtime::launch_hooks()) {
    if (runtime::any_hook(hooks_)) [[unlikely]]
      begin(name, kind);
  }
  ~LaunchScope() {
    if (runtime::any_hook(hooks_)) [[unlikely]]
      end();
  }
  LaunchScope(const LaunchScope&) = delete;
  LaunchScope& operator=(const LaunchScope&) = delete;

  // The backing kernel is about to be queued on `device`'s current stream.
  void queue(c10::DeviceIndex device) noexcept {
    runtime::announce_queue(hooks_, device);
    if (runtime::any_hook(hooks_)) [[unlikely]]
      observe_queue(device);
  }

 private:
  // The hooks' calls, out of line: the hot path keeps only the compare (a profiler that
  // installs hooks pays a call per launch).
  [[gnu::noinline]] void begin(const char* name, runtime::LaunchKind kind) noexcept {
    if (hooks_.kernel_timer != nullptr) hooks_.kernel_timer->begin(name);
    if (hooks_.observer != nullptr) {
      launch_.name = name;
      launch_.kind = kind;
      hooks_.observer->begin(launch_);
    }
  }
  [[gnu::noinline]] void observe_queue(c10::DeviceIndex device) noexcept {
    if (hooks_.observer != nullptr) {
      launch_.device = device;
      hooks_.observer->queue(launch_);
    }
    if (hooks_.trace != nullptr && !traced_) {
      traced_ = true;
      ++runtime::detail::tls_traced_launches;
      runtime::push_segment_for_launch();
      hooks_.trace->queued();
    }
  }
  [[gnu::noinline]] void end() noexcept {
    if (traced_) {
      hooks_.trace->done();
      --runtime::detail::tls_traced_launches;
      runtime::segment_launch_done();
    }
    if (hooks_.observer != nullptr) hooks_.observer->end(launch_);
    if (hooks_.kernel_timer != nullptr) hooks_.kernel_timer->end();
  }

  const runtime::LaunchHooks& hooks_;  // read once: begin, queue and end call the same hooks
  runtime::Launch launch_;
  bool traced_ = false;  // the trace saw this launch queued: it is told when it is done
};

}  // namespace brick::backend
