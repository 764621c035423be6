// The plain-C++ floor every layer shares (csrc/common).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "common/steady_clock.h"

namespace {

TEST(SteadyClockTest, NeverGoesBackAndMeasuresASleep) {
  int64_t previous = brick::steady_ns();
  for (int i = 0; i < 100000; ++i) {
    const int64_t now = brick::steady_ns();
    ASSERT_GE(now, previous) << "read " << i;
    previous = now;
  }
  const int64_t before = brick::steady_ns();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const int64_t slept = brick::steady_ns() - before;
  EXPECT_GE(slept, 5'000'000);
  EXPECT_LT(slept, 5'000'000'000) << "a 5 ms sleep read as " << slept << " ns";
}

TEST(SteadyClockTest, OneClockForEveryThread) {
  // A stamp taken on one thread after another thread's stamp is published is not earlier.
  std::atomic<int64_t> published{0};
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      published.store(brick::steady_ns(), std::memory_order_release);
    }
  });
  for (int i = 0; i < 100000; ++i) {
    const int64_t seen = published.load(std::memory_order_acquire);
    ASSERT_GE(brick::steady_ns(), seen) << "read " << i;
  }
  stop = true;
  writer.join();
}

}  // namespace
