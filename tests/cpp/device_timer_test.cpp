// GoogleTest suite for the device-interval timer the three profilers share (device_timer.h),
// without torch. CTest runs it twice: on the host runtime as it is, and with
// BRICK_HOST_COMPLETION=deferred (device_timer_deferred), whose events complete after they are
// recorded, as a GPU's do.
#include "profiler/device_timer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>

#include "runtime_test_util.h"

namespace {

using brick::profiler::DeviceInterval;
using brick::profiler::EventPool;
using brick::profiler::g_live_events;
using brick::profiler::read_interval;
using brick::profiler::skip_in_capture;
using brick::profiler::TimingClient;

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

TEST(DeviceTimer, AnIntervalIsTheDevicesDurationAndItsStartIsPlacedInsideTheCallersWindow) {
  auto& rt = brick::runtime::get();
  EventPool pool;
  brick::runtime::Event* start = pool.acquire(0);
  brick::runtime::Event* end = pool.acquire(0);
  const int64_t before = steady_ns();
  rt.record_event(start, 0, rt.current_stream(0));
  brick::test::device_work(rt, 0, std::chrono::microseconds(2000));
  const int64_t end_recorded_after = steady_ns();
  rt.record_event(end, 0, rt.current_stream(0));
  DeviceInterval interval;
  if (rt.asynchronous()) {
    // Just recorded and not waited for: not complete before its completion time. (A thread
    // preempted past that time may find it complete, which a busy machine does.)
    const bool complete = read_interval(rt, start, end, /*wait=*/false, /*place=*/true, &interval);
    const int64_t asked_by = steady_ns();
    if (complete) {
      EXPECT_GE(asked_by - end_recorded_after, brick::runtime::kDeferredCompletionNs)
          << "complete before its completion time";
    }
  }
  ASSERT_TRUE(read_interval(rt, start, end, /*wait=*/true, /*place=*/true, &interval));
  const int64_t after = steady_ns();
  EXPECT_GE(interval.duration_ns, 2'000'000);
  EXPECT_LE(interval.duration_ns, after - before);
  // Placed on the host clock within the calibration's error (none on the host runtime).
  const int64_t slack_ns = rt.asynchronous() ? 100'000 : 0;
  EXPECT_GE(interval.start_ns, before - slack_ns);
  EXPECT_LE(interval.start_ns + interval.duration_ns, after + 100'000);
  DeviceInterval unplaced;
  ASSERT_TRUE(read_interval(rt, start, end, /*wait=*/true, /*place=*/false, &unplaced));
  EXPECT_EQ(unplaced.start_ns, -1) << "placed only when asked";
  EXPECT_EQ(unplaced.duration_ns, interval.duration_ns);
  pool.release(0, start);
  pool.release(0, end);
}

TEST(DeviceTimer, EventsAreMadeOnlyOnTheDevicesAskedForCountedAndReturnedByThePool) {
  auto& rt = brick::runtime::get();
  if (rt.device_count() < 2) GTEST_SKIP() << "needs 2 devices, have " << rt.device_count();
  const int64_t on_0 = g_live_events[0].load();
  const int64_t on_1 = g_live_events[1].load();
  {
    EventPool pool;
    brick::runtime::Event* first = pool.acquire(0);
    pool.release(0, first);
    EXPECT_EQ(pool.acquire(0), first) << "pooled: the op path creates no second event";
    pool.release(0, first);
    EXPECT_EQ(g_live_events[0].load(), on_0 + 1);
    EXPECT_EQ(g_live_events[1].load(), on_1) << "no event on a device not asked for";
  }
  EXPECT_EQ(g_live_events[0].load(), on_0) << "the pool destroys its events";
}

TEST(DeviceTimer, ASharedEventReturnsToThePoolWithItsLastReference) {
  EventPool pool;
  brick::runtime::Event* event = pool.acquire(0);
  pool.share(event);  // three intervals end (or start) at this one point of the stream
  pool.share(event);
  pool.release(0, event);
  pool.release(0, event);
  EXPECT_FALSE(pool.has_free(0)) << "still referenced once: not reusable yet";
  pool.release(0, event);
  ASSERT_TRUE(pool.has_free(0));
  EXPECT_EQ(pool.acquire(0), event);
  EXPECT_EQ(event->extra_refs, 0u) << "a reused event starts with one reference";
  EXPECT_EQ(pool.created(), 1u);
  pool.release(0, event);
}

TEST(DeviceTimer, NothingIsSkippedOnAStreamThatIsNotBeingCaptured) {
  auto& rt = brick::runtime::get();
  const uint64_t before = brick::profiler::capture_skipped(TimingClient::Registry);
  EXPECT_FALSE(skip_in_capture(rt, 0, rt.current_stream(0), TimingClient::Registry));
  EXPECT_EQ(brick::profiler::capture_skipped(TimingClient::Registry), before);
}

}  // namespace
