// A per-thread pool of timing events, so the op path never creates or destroys one.
#pragma once

#include <vector>

#include "runtime/runtime.h"

namespace brick::profiler {

class EventPool {
 public:
  EventPool() = default;
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  ~EventPool() {
    for (auto& events : free_) {
      for (runtime::Event* event : events) runtime::get().destroy_event(event);
    }
  }

  runtime::Event* acquire(int device) {
    if (device >= static_cast<int>(free_.size())) free_.resize(device + 1);
    auto& events = free_[device];
    if (events.empty()) {
      ++created_;
      return runtime::get().create_event(device, /*enable_timing=*/true);
    }
    runtime::Event* event = events.back();
    events.pop_back();
    return event;
  }

  void release(int device, runtime::Event* event) { free_[device].push_back(event); }

  size_t created() const noexcept { return created_; }

 private:
  std::vector<std::vector<runtime::Event*>> free_;
  size_t created_ = 0;
};

}  // namespace brick::profiler
