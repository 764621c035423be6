// A per-thread pool of timing events, so the op path never creates or destroys one.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <vector>

#include "runtime/runtime.h"

namespace brick::profiler {

// Device events the profiler holds, in every pool and in use, per device: reported by health()
// so a long run can show the figure stays bounded, and that a profile makes events (on CUDA,
// contexts) only on the devices it records on.
inline std::array<std::atomic<int64_t>, runtime::kMaxDevices> g_live_events{};

// Whether the runtime runs work asynchronously (CUDA; the host runtime with deferred
// completion): timing events may complete after the call that recorded them, and streams may be
// captured into CUDA graphs. Decided once, when first asked (after the runtime exists).
inline bool async_runtime() {
  static const bool is_async = runtime::get().asynchronous();
  return is_async;
}

// Bricks and stub records skipped because their stream was being captured into a CUDA graph
// (recording an event there is illegal): reported by health().
inline std::atomic<uint64_t> g_capture_skipped{0};

inline runtime::Event* create_timing_event(int device) {
  runtime::Event* event = runtime::get().create_event(device, /*enable_timing=*/true);
  g_live_events[device].fetch_add(1, std::memory_order_relaxed);
  return event;
}

inline void destroy_timing_event(int device, runtime::Event* event) noexcept {
  runtime::get().destroy_event(event);
  g_live_events[device].fetch_sub(1, std::memory_order_relaxed);
}

class EventPool {
 public:
  EventPool() = default;
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  ~EventPool() {
    for (size_t device = 0; device < free_.size(); ++device) {
      for (runtime::Event* event : free_[device]) {
        destroy_timing_event(static_cast<int>(device), event);
      }
    }
  }

  runtime::Event* acquire(int device) {
    if (device >= static_cast<int>(free_.size())) free_.resize(device + 1);
    auto& events = free_[device];
    if (events.empty()) {
      ++created_;
      return create_timing_event(device);
    }
    runtime::Event* event = events.back();
    events.pop_back();
    return event;
  }

  void release(int device, runtime::Event* event) {
    if (device >= static_cast<int>(free_.size())) free_.resize(device + 1);
    free_[device].push_back(event);
  }

  bool has_free(int device) const noexcept {
    return device < static_cast<int>(free_.size()) && !free_[device].empty();
  }

  size_t created() const noexcept { return created_; }

 private:
  std::vector<std::vector<runtime::Event*>> free_;
  size_t created_ = 0;
};

}  // namespace brick::profiler
