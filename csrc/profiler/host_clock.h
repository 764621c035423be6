// The host clocks the profiler relates: steady_clock (runtime events, the registry) and Unix time
// (std::chrono::system_clock, which is what c10::getTime() and PyTorch's profiler timestamps
// read on Linux). Plain C++.
#pragma once

#include <chrono>
#include <climits>
#include <cstdint>

#include "common/steady_clock.h"

namespace brick::profiler {

inline int64_t steady_time_ns() noexcept { return steady_ns(); }

inline int64_t unix_time_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// (Unix time - steady time) in ns: the tightest of a few bracketed samples.
inline int64_t steady_to_unix_offset_ns() noexcept {
  int64_t best_width = INT64_MAX;
  int64_t offset = 0;
  for (int i = 0; i < 16; ++i) {
    const int64_t before = steady_time_ns();
    const int64_t unix_ns = unix_time_ns();
    const int64_t after = steady_time_ns();
    if (after - before < best_width) {
      best_width = after - before;
      offset = unix_ns - (before + (after - before) / 2);
    }
  }
  return offset;
}

}  // namespace brick::profiler
