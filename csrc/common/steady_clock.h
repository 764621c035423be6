// The monotonic clock every layer stamps host events with (runtime events, the registry,
// collectives, the profiler): std::chrono::steady_clock in nanoseconds. Plain C++, the floor
// below the runtime.
#pragma once

#include <chrono>
#include <cstdint>

namespace brick {

inline int64_t steady_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace brick
