// Announces the work the backend queues on a brick device to an installed kernel timer, launch
// observer and queue hook (runtime/launch_observer.h). Costs three atomic loads (acquire: plain
// loads on x86) when none is installed.
#pragma once

#include <c10/core/Device.h>

#include "runtime/launch_observer.h"

namespace brick::backend {

class LaunchScope {
 public:
  LaunchScope(const char* name, runtime::LaunchKind kind) noexcept
      : timer_(runtime::kernel_timer()), observer_(runtime::launch_observer()) {
    if (timer_ != nullptr) [[unlikely]]
      timer_->begin(name);
    if (observer_ != nullptr) [[unlikely]] {
      launch_.name = name;
      launch_.kind = kind;
      observer_->begin(launch_);
    }
  }
  ~LaunchScope() {
    if (observer_ != nullptr) [[unlikely]]
      observer_->end(launch_);
    if (timer_ != nullptr) [[unlikely]]
      timer_->end();
  }
  LaunchScope(const LaunchScope&) = delete;
  LaunchScope& operator=(const LaunchScope&) = delete;

  // The backing kernel is about to be queued on `device`'s current stream.
  void queue(c10::DeviceIndex device) noexcept {
    runtime::announce_queue(device);
    if (observer_ != nullptr) [[unlikely]] {
      launch_.device = device;
      observer_->queue(launch_);
    }
  }

 private:
  const runtime::KernelTimer* timer_;
  runtime::LaunchObserver* observer_;
  runtime::Launch launch_;
};

}  // namespace brick::backend
