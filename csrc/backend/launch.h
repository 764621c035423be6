// Announces the work the backend queues on a brick device to an installed kernel timer, launch
// observer and queue hook (runtime/launch_observer.h). Costs one atomic load (acquire: a plain
// load on x86) of the hook table per launch, and a test of each hook.
#pragma once

#include <c10/core/Device.h>

#include "runtime/launch_observer.h"

namespace brick::backend {

class LaunchScope {
 public:
  LaunchScope(const char* name, runtime::LaunchKind kind) noexcept
      : hooks_(runtime::launch_hooks()) {
    if (hooks_.kernel_timer != nullptr) [[unlikely]]
      hooks_.kernel_timer->begin(name);
    if (hooks_.observer != nullptr) [[unlikely]] {
      launch_.name = name;
      launch_.kind = kind;
      hooks_.observer->begin(launch_);
    }
  }
  ~LaunchScope() {
    if (hooks_.observer != nullptr) [[unlikely]]
      hooks_.observer->end(launch_);
    if (hooks_.kernel_timer != nullptr) [[unlikely]]
      hooks_.kernel_timer->end();
  }
  LaunchScope(const LaunchScope&) = delete;
  LaunchScope& operator=(const LaunchScope&) = delete;

  // The backing kernel is about to be queued on `device`'s current stream.
  void queue(c10::DeviceIndex device) noexcept {
    runtime::announce_queue(hooks_, device);
    if (hooks_.observer != nullptr) [[unlikely]] {
      launch_.device = device;
      hooks_.observer->queue(launch_);
    }
  }

 private:
  const runtime::LaunchHooks& hooks_;  // read once: begin, queue and end call the same hooks
  runtime::Launch launch_;
};

}  // namespace brick::backend
