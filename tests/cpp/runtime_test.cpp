// GoogleTest suite for the brick runtime on its own (no torch).
//
// Every test builds its own runtime with make_host_runtime(n), so memory statistics and stream
// counts start from zero and no test depends on another's leftovers.
#include "runtime/runtime.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace brick::runtime {
namespace {

// Runs `fn`, expects it to throw brick::runtime::Error, and returns the message.
template <typename Fn>
std::string error_message(Fn&& fn) {
  return brick::test::thrown_message<Error>(fn, "brick::runtime::Error");
}

// Runs `fn` on a fresh std::thread and waits for it.
template <typename Fn>
void on_other_thread(Fn&& fn) {
  std::thread thread(std::forward<Fn>(fn));
  thread.join();
}

class RuntimeTest : public ::testing::Test {
 protected:
  static constexpr int kDevices = 3;
  void SetUp() override { rt_ = make_host_runtime(kDevices); }
  void TearDown() override {
    // Leave the calling thread as a fresh runtime would find it (see the ThreadState tests).
    if (rt_ == nullptr) return;
    for (int d = 0; d < kDevices; ++d) rt_->set_current_stream(d, kDefaultStream);
    rt_->set_current_device(0);
  }
  Runtime& rt() { return *rt_; }

  std::unique_ptr<Runtime> rt_;
};

// ---------------------------------------------------------------------------------------------
// Construction and identity

TEST(HostRuntimeConstruction, AcceptsOneToMaxDevices) {
  EXPECT_EQ(make_host_runtime(1)->device_count(), 1);
  EXPECT_EQ(make_host_runtime(2)->device_count(), 2);
  EXPECT_EQ(make_host_runtime(kMaxDevices)->device_count(), kMaxDevices);
}

TEST(HostRuntimeConstruction, RejectsZeroAndTooManyDevices) {
  EXPECT_CONTAINS(error_message([] { make_host_runtime(0); }), ("got 0"));
  EXPECT_CONTAINS(error_message([] { make_host_runtime(-1); }), ("got -1"));
  const std::string too_many = error_message([] { make_host_runtime(kMaxDevices + 1); });
  EXPECT_CONTAINS(too_many, (std::to_string(kMaxDevices + 1)));
  EXPECT_CONTAINS(too_many, ("1 to " + std::to_string(kMaxDevices)));
}

TEST_F(RuntimeTest, IdentifiesAsHost) {
  EXPECT_EQ(rt().backing_kind(), BackingKind::Host);
  EXPECT_STREQ(rt().name(), "host");
  for (int d = 0; d < kDevices; ++d) EXPECT_EQ(rt().backing_device_index(d), -1);
  EXPECT_STREQ(backing_kind_name(BackingKind::Host), "host");
  EXPECT_STREQ(backing_kind_name(BackingKind::Cuda), "cuda");
}

TEST_F(RuntimeTest, DeviceCount) { EXPECT_EQ(rt().device_count(), kDevices); }

// ---------------------------------------------------------------------------------------------
// check_device

TEST_F(RuntimeTest, CheckDeviceAcceptsEveryValidIndex) {
  for (int d = 0; d < kDevices; ++d) EXPECT_NO_THROW(rt().check_device(d)) << "device " << d;
}

TEST_F(RuntimeTest, CheckDeviceRejectsOutOfRangeIndices) {
  for (const int bad : {kDevices, kDevices + 1, -1, -7, kMaxDevices, 1000}) {
    const std::string message = error_message([&] { rt().check_device(bad); });
    EXPECT_CONTAINS(message, ("device index " + std::to_string(bad) + " is out of range"))
        << "index " << bad;
    EXPECT_CONTAINS(message, ("0.." + std::to_string(kDevices - 1))) << message;
    EXPECT_CONTAINS(message, (std::to_string(kDevices) + " brick device(s)")) << message;
  }
}

TEST_F(RuntimeTest, EveryDeviceTakingCallValidatesTheIndex) {
  EXPECT_THROW(rt().set_current_device(kDevices), Error);
  EXPECT_THROW(rt().allocate(kDevices, 16), Error);
  EXPECT_THROW(rt().allocate(-1, 16), Error);
  EXPECT_THROW(rt().memory_stats(kDevices), Error);
  EXPECT_THROW(rt().reset_peak_memory_stats(-1), Error);
  EXPECT_THROW(rt().create_stream(kDevices, 0), Error);
  EXPECT_THROW(rt().current_stream(kDevices), Error);
  EXPECT_THROW(rt().synchronize_device(kDevices), Error);
  EXPECT_THROW(rt().create_event(kDevices, false), Error);
  // A failed set_current_device leaves the current device alone.
  EXPECT_EQ(rt().current_device(), 0);
}

// ---------------------------------------------------------------------------------------------
// Current device (per thread)

TEST_F(RuntimeTest, CurrentDeviceDefaultsToZeroAndCanBeSet) {
  EXPECT_EQ(rt().current_device(), 0);
  rt().set_current_device(2);
  EXPECT_EQ(rt().current_device(), 2);
  rt().set_current_device(1);
  EXPECT_EQ(rt().current_device(), 1);
}

TEST_F(RuntimeTest, CurrentDeviceIsPerThread) {
  rt().set_current_device(2);
  int seen_default = -1;
  int seen_after_set = -1;
  on_other_thread([&] {
    seen_default = rt().current_device();
    rt().set_current_device(1);
    seen_after_set = rt().current_device();
  });
  EXPECT_EQ(seen_default, 0) << "a new thread starts on device 0";
  EXPECT_EQ(seen_after_set, 1);
  EXPECT_EQ(rt().current_device(), 2) << "the other thread's setting leaked into this one";
}

TEST_F(RuntimeTest, ManyThreadsKeepTheirOwnCurrentDevice) {
  constexpr int kThreads = 6;
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int mine = t % kDevices;
      rt().set_current_device(mine);
      for (int i = 0; i < 2000; ++i) {
        if (rt().current_device() != mine) ++mismatches[t];
        std::this_thread::yield();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

// Each runtime instance is documented as isolated, so the calling thread's current device and
// streams must belong to the instance, not to whichever instance the thread touched last.
TEST(RuntimeThreadState, InterleavedRuntimesKeepTheirOwnCurrentDevice) {
  auto a = make_host_runtime(2);
  auto b = make_host_runtime(2);
  a->set_current_device(1);
  EXPECT_EQ(b->current_device(), 0);
  EXPECT_EQ(a->current_device(), 1);
  a->set_current_device(0);
}

TEST(RuntimeThreadState, FreshRuntimeDoesNotInheritADeadRuntimesState) {
  // Thread state is keyed by a unique runtime id: a runtime allocated where a destroyed one
  // lived must not inherit its current device or streams.
  for (int attempt = 0; attempt < 16; ++attempt) {
    auto first = make_host_runtime(2);
    const void* address = first.get();
    first->set_current_device(1);
    first->set_current_stream(1, first->create_stream(1, 0));
    first.reset();
    auto second = make_host_runtime(2);
    EXPECT_EQ(second->current_device(), 0);
    EXPECT_EQ(second->current_stream(1), kDefaultStream);
    second->set_current_device(0);
    second->set_current_stream(1, kDefaultStream);
    if (second.get() == address) return;  // the address was reused: the case this checks
  }
}

// ---------------------------------------------------------------------------------------------
// Allocation

TEST_F(RuntimeTest, AllocateIsSixtyFourByteAlignedAndWritable) {
  for (const size_t nbytes : {size_t{1}, size_t{3}, size_t{63}, size_t{64}, size_t{65},
                              size_t{1000}, size_t{4096}, size_t{1} << 20}) {
    void* ptr = rt().allocate(0, nbytes);
    ASSERT_NE(ptr, nullptr) << nbytes;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(ptr) % 64, 0u) << nbytes << " bytes";
    std::memset(ptr, 0xab, nbytes);  // the whole requested range is usable
    EXPECT_EQ(static_cast<unsigned char*>(ptr)[nbytes - 1], 0xab);
    rt().deallocate(ptr);
  }
}

TEST_F(RuntimeTest, ZeroSizeAllocationIsNullAndUncounted) {
  EXPECT_EQ(rt().allocate(1, 0), nullptr);
  const MemoryStats stats = rt().memory_stats(1);
  EXPECT_EQ(stats.allocations, 0);
  EXPECT_EQ(stats.total_allocations, 0);
  // Zero-size allocation still validates the device.
  EXPECT_THROW(rt().allocate(kDevices, 0), Error);
}

TEST_F(RuntimeTest, DeallocateReportsSizeAndDevice) {
  void* a = rt().allocate(0, 100);
  void* b = rt().allocate(2, 12345);
  const Runtime::Released ra = rt().deallocate(a);
  const Runtime::Released rb = rt().deallocate(b);
  EXPECT_EQ(ra.nbytes, 100u);
  EXPECT_EQ(ra.device, 0);
  EXPECT_EQ(rb.nbytes, 12345u);
  EXPECT_EQ(rb.device, 2);
}

TEST_F(RuntimeTest, DeallocateNullIsANoOp) {
  const Runtime::Released released = rt().deallocate(nullptr);
  EXPECT_EQ(released.nbytes, 0u);
  EXPECT_EQ(released.device, -1);
  EXPECT_EQ(rt().memory_stats(0).total_frees, 0);
}

TEST_F(RuntimeTest, DeallocateFromAnotherThread) {
  void* ptr = rt().allocate(1, 256);
  Runtime::Released released{0, -1};
  on_other_thread([&] { released = rt().deallocate(ptr); });
  EXPECT_EQ(released.nbytes, 256u);
  EXPECT_EQ(released.device, 1);
  EXPECT_EQ(rt().memory_stats(1).allocated_bytes, 0);
}

TEST_F(RuntimeTest, AllocationUsesTheGivenDeviceNotTheCurrentOne) {
  rt().set_current_device(2);
  void* ptr = rt().allocate(1, 64);
  EXPECT_EQ(rt().memory_stats(1).allocated_bytes, 64);
  EXPECT_EQ(rt().memory_stats(2).allocated_bytes, 0);
  EXPECT_EQ(rt().deallocate(ptr).device, 1);
}

// ---------------------------------------------------------------------------------------------
// Memory statistics

TEST_F(RuntimeTest, FreshRuntimeHasZeroStats) {
  for (int d = 0; d < kDevices; ++d) {
    const MemoryStats s = rt().memory_stats(d);
    EXPECT_EQ(s.allocated_bytes, 0);
    EXPECT_EQ(s.peak_allocated_bytes, 0);
    EXPECT_EQ(s.allocations, 0);
    EXPECT_EQ(s.peak_allocations, 0);
    EXPECT_EQ(s.total_allocations, 0);
    EXPECT_EQ(s.total_frees, 0);
    EXPECT_EQ(s.allocated_bytes_total, 0);
    EXPECT_EQ(s.freed_bytes_total, 0);
    EXPECT_EQ(s.adopted_bytes, 0);
  }
}

TEST_F(RuntimeTest, StatsTrackAllocationsPeaksAndTotals) {
  void* a = rt().allocate(0, 100);
  void* b = rt().allocate(0, 300);
  MemoryStats s = rt().memory_stats(0);
  EXPECT_EQ(s.allocated_bytes, 400);  // requested bytes, not the padded block size
  EXPECT_EQ(s.peak_allocated_bytes, 400);
  EXPECT_EQ(s.allocations, 2);
  EXPECT_EQ(s.peak_allocations, 2);
  EXPECT_EQ(s.total_allocations, 2);
  EXPECT_EQ(s.allocated_bytes_total, 400);

  rt().deallocate(b);
  s = rt().memory_stats(0);
  EXPECT_EQ(s.allocated_bytes, 100);
  EXPECT_EQ(s.peak_allocated_bytes, 400) << "peak survives a free";
  EXPECT_EQ(s.allocations, 1);
  EXPECT_EQ(s.peak_allocations, 2);
  EXPECT_EQ(s.total_frees, 1);
  EXPECT_EQ(s.freed_bytes_total, 300);

  rt().reset_peak_memory_stats(0);
  s = rt().memory_stats(0);
  EXPECT_EQ(s.peak_allocated_bytes, 100) << "reset_peak lowers the peak to the current value";
  EXPECT_EQ(s.peak_allocations, 1);
  EXPECT_EQ(s.total_allocations, 2) << "reset_peak leaves the monotonic totals alone";
  EXPECT_EQ(s.allocated_bytes_total, 400);

  void* c = rt().allocate(0, 50);
  s = rt().memory_stats(0);
  EXPECT_EQ(s.allocated_bytes, 150);
  EXPECT_EQ(s.peak_allocated_bytes, 150);
  EXPECT_EQ(s.peak_allocations, 2);

  rt().deallocate(a);
  rt().deallocate(c);
  s = rt().memory_stats(0);
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.allocations, 0);
  EXPECT_EQ(s.peak_allocated_bytes, 150);
  EXPECT_EQ(s.total_allocations, 3);
  EXPECT_EQ(s.total_frees, 3);
  EXPECT_EQ(s.allocated_bytes_total, 450);
  EXPECT_EQ(s.freed_bytes_total, 450);
}

TEST_F(RuntimeTest, StatsAreKeptPerDevice) {
  void* ptr = rt().allocate(1, 1024);
  EXPECT_EQ(rt().memory_stats(0).allocated_bytes, 0);
  EXPECT_EQ(rt().memory_stats(1).allocated_bytes, 1024);
  EXPECT_EQ(rt().memory_stats(2).allocated_bytes, 0);
  rt().reset_peak_memory_stats(0);
  EXPECT_EQ(rt().memory_stats(1).peak_allocated_bytes, 1024) << "reset touched another device";
  rt().deallocate(ptr);
}

TEST_F(RuntimeTest, StatsOfSeparateRuntimesAreIndependent) {
  auto other = make_host_runtime(kDevices);
  void* ptr = other->allocate(0, 512);
  EXPECT_EQ(other->memory_stats(0).allocated_bytes, 512);
  EXPECT_EQ(rt().memory_stats(0).allocated_bytes, 0);
  other->deallocate(ptr);
}

TEST_F(RuntimeTest, AdoptedBytesCountAsAllocatedUntilReleased) {
  void* own = rt().allocate(0, 100);
  rt().record_adopted(0, 1000);
  MemoryStats s = rt().memory_stats(0);
  EXPECT_EQ(s.adopted_bytes, 1000);
  EXPECT_EQ(s.allocated_bytes, 1100);
  EXPECT_EQ(s.allocations, 2);
  EXPECT_EQ(s.peak_allocated_bytes, 1100);
  EXPECT_EQ(s.total_allocations, 2);
  EXPECT_EQ(s.allocated_bytes_total, 1100);
  EXPECT_EQ(rt().memory_stats(1).adopted_bytes, 0);

  rt().release_adopted(0, 1000);
  s = rt().memory_stats(0);
  EXPECT_EQ(s.adopted_bytes, 0);
  EXPECT_EQ(s.allocated_bytes, 100);
  EXPECT_EQ(s.allocations, 1);
  EXPECT_EQ(s.peak_allocated_bytes, 1100);
  EXPECT_EQ(s.total_frees, 1);
  EXPECT_EQ(s.freed_bytes_total, 1000);

  rt().deallocate(own);
  s = rt().memory_stats(0);
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.allocations, 0);
}

// ---------------------------------------------------------------------------------------------
// Copy

TEST_F(RuntimeTest, CopyBetweenHostAndDevices) {
  constexpr size_t kBytes = 1000;
  std::vector<unsigned char> host(kBytes);
  for (size_t i = 0; i < kBytes; ++i) host[i] = static_cast<unsigned char>(i * 7 + 1);
  auto* d0 = static_cast<unsigned char*>(rt().allocate(0, kBytes));
  auto* d1 = static_cast<unsigned char*>(rt().allocate(1, kBytes));

  rt().copy(d0, 0, host.data(), -1, kBytes);  // host -> brick:0
  EXPECT_EQ(std::memcmp(d0, host.data(), kBytes), 0);
  rt().copy(d1, 1, d0, 0, kBytes);  // brick:0 -> brick:1
  EXPECT_EQ(std::memcmp(d1, host.data(), kBytes), 0);
  std::vector<unsigned char> back(kBytes, 0);
  rt().copy(back.data(), -1, d1, 1, kBytes);  // brick:1 -> host
  EXPECT_EQ(back, host);

  rt().deallocate(d0);
  rt().deallocate(d1);
}

TEST_F(RuntimeTest, CopyHandlesOverlapAndZeroBytes) {
  auto* buf = static_cast<unsigned char*>(rt().allocate(0, 16));
  for (int i = 0; i < 16; ++i) buf[i] = static_cast<unsigned char>(i);
  rt().copy(buf + 4, 0, buf, 0, 8);  // overlapping ranges behave like memmove
  const unsigned char expected[16] = {0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15};
  EXPECT_EQ(std::memcmp(buf, expected, 16), 0);
  EXPECT_NO_THROW(rt().copy(nullptr, 0, nullptr, 1, 0));
  rt().deallocate(buf);
}

TEST_F(RuntimeTest, CopyValidatesDevices) {
  unsigned char a[8] = {};
  unsigned char b[8] = {};
  EXPECT_CONTAINS(error_message([&] { rt().copy(a, kDevices, b, -1, 8); }),
                  ("device index " + std::to_string(kDevices)));
  EXPECT_CONTAINS(error_message([&] { rt().copy(a, -1, b, 9, 8); }), ("device index 9"));
}

// ---------------------------------------------------------------------------------------------
// Streams

TEST_F(RuntimeTest, DefaultStreamIsZeroOnEveryDevice) {
  EXPECT_EQ(kDefaultStream, 0);
  for (int d = 0; d < kDevices; ++d) EXPECT_EQ(rt().current_stream(d), kDefaultStream);
}

TEST_F(RuntimeTest, CreateStreamGivesDistinctIds) {
  std::vector<StreamId> ids;
  for (int i = 0; i < 10; ++i) ids.push_back(rt().create_stream(0, i % 2 == 0 ? 0 : -1));
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_NE(ids[i], kDefaultStream);
    for (size_t j = i + 1; j < ids.size(); ++j) EXPECT_NE(ids[i], ids[j]);
  }
}

TEST_F(RuntimeTest, CreateStreamIdsAreDistinctAcrossThreads) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 500;
  std::vector<std::vector<StreamId>> ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) ids[t].push_back(rt().create_stream(1, 0));
    });
  }
  for (auto& thread : threads) thread.join();
  std::vector<StreamId> all;
  for (const auto& v : ids) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end()) << "duplicate stream id";
  EXPECT_EQ(all.size(), static_cast<size_t>(kThreads * kPerThread));
}

TEST_F(RuntimeTest, SetCurrentStreamIsPerDevice) {
  const StreamId s = rt().create_stream(1, 0);
  rt().set_current_stream(1, s);
  EXPECT_EQ(rt().current_stream(1), s);
  EXPECT_EQ(rt().current_stream(0), kDefaultStream);
  EXPECT_EQ(rt().current_stream(2), kDefaultStream);
  rt().set_current_stream(1, kDefaultStream);
  EXPECT_EQ(rt().current_stream(1), kDefaultStream);
}

TEST_F(RuntimeTest, CurrentStreamIsPerThread) {
  const StreamId mine = rt().create_stream(0, 0);
  const StreamId theirs = rt().create_stream(0, 0);
  rt().set_current_stream(0, mine);
  StreamId seen_default = -1;
  StreamId seen_after_set = -1;
  on_other_thread([&] {
    seen_default = rt().current_stream(0);
    rt().set_current_stream(0, theirs);
    seen_after_set = rt().current_stream(0);
  });
  EXPECT_EQ(seen_default, kDefaultStream) << "a new thread starts on the default stream";
  EXPECT_EQ(seen_after_set, theirs);
  EXPECT_EQ(rt().current_stream(0), mine);
}

TEST_F(RuntimeTest, InvalidStreamIdsAreRejected) {
  const StreamId created = rt().create_stream(0, 0);
  const StreamId missing = created + 1;
  const std::string message = error_message([&] { rt().set_current_stream(0, missing); });
  EXPECT_CONTAINS(message, ("stream " + std::to_string(missing) + " does not exist"));
  EXPECT_CONTAINS(message, ("brick:0"));
  EXPECT_THROW(rt().set_current_stream(0, -1), Error);
  EXPECT_THROW(rt().query_stream(0, missing), Error);
  EXPECT_THROW(rt().synchronize_stream(0, missing), Error);
  // Stream ids are per device: brick:0's stream does not exist on brick:2.
  EXPECT_CONTAINS(error_message([&] { rt().set_current_stream(2, created); }), ("brick:2"));
  EXPECT_THROW(rt().set_current_stream(kDevices, kDefaultStream), Error);
  EXPECT_EQ(rt().current_stream(0), kDefaultStream) << "a failed set changed the stream";
}

TEST_F(RuntimeTest, StreamsQueryAndSynchronize) {
  const StreamId s = rt().create_stream(2, 0);
  EXPECT_TRUE(rt().query_stream(2, kDefaultStream));
  EXPECT_TRUE(rt().query_stream(2, s));
  EXPECT_NO_THROW(rt().synchronize_stream(2, s));
  EXPECT_NO_THROW(rt().synchronize_device(2));
}

// ---------------------------------------------------------------------------------------------
// Events

struct EventDeleter {
  Runtime* runtime;
  void operator()(Event* event) const { runtime->destroy_event(event); }
};
using EventPtr = std::unique_ptr<Event, EventDeleter>;

class EventTest : public RuntimeTest {
 protected:
  EventPtr make_event(DeviceIndex device, bool timing) {
    return EventPtr(rt().create_event(device, timing), EventDeleter{&rt()});
  }
};

TEST_F(EventTest, EventsKnowTheirDevice) {
  EXPECT_EQ(rt().event_device(make_event(0, false).get()), 0);
  EXPECT_EQ(rt().event_device(make_event(2, true).get()), 2);
}

TEST_F(EventTest, ElapsedTimeMeasuresTheHostClock) {
  auto start = make_event(1, true);
  auto end = make_event(1, true);
  rt().record_event(start.get(), 1, kDefaultStream);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  rt().record_event(end.get(), 1, kDefaultStream);
  const double ms = rt().elapsed_ms(start.get(), end.get());
  EXPECT_GE(ms, 4.5);
  EXPECT_LE(ms, 50.0);
  // Reversed order gives the negative interval.
  EXPECT_DOUBLE_EQ(rt().elapsed_ms(end.get(), start.get()), -ms);
}

TEST_F(EventTest, RecordingOnANonDefaultStream) {
  const StreamId s = rt().create_stream(0, 0);
  auto start = make_event(0, true);
  auto end = make_event(0, true);
  rt().record_event(start.get(), 0, s);
  rt().record_event(end.get(), 0, s);
  EXPECT_GE(rt().elapsed_ms(start.get(), end.get()), 0.0);
}

TEST_F(EventTest, ReRecordingRestampsTheEvent) {
  auto start = make_event(0, true);
  auto end = make_event(0, true);
  rt().record_event(start.get(), 0, kDefaultStream);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  rt().record_event(start.get(), 0, kDefaultStream);  // restamp: the sleep is no longer inside
  rt().record_event(end.get(), 0, kDefaultStream);
  EXPECT_LT(rt().elapsed_ms(start.get(), end.get()), 4.5);
}

TEST_F(EventTest, ElapsedTimeNeedsTimingEvents) {
  auto timed = make_event(0, true);
  auto untimed = make_event(0, false);
  rt().record_event(timed.get(), 0, kDefaultStream);
  rt().record_event(untimed.get(), 0, kDefaultStream);
  EXPECT_CONTAINS(error_message([&] { rt().elapsed_ms(timed.get(), untimed.get()); }),
                  ("enable_timing"));
  EXPECT_CONTAINS(error_message([&] { rt().elapsed_ms(untimed.get(), timed.get()); }),
                  ("enable_timing"));
}

TEST_F(EventTest, ElapsedTimeNeedsBothEventsRecorded) {
  auto start = make_event(0, true);
  auto end = make_event(0, true);
  EXPECT_CONTAINS(error_message([&] { rt().elapsed_ms(start.get(), end.get()); }), ("recorded"));
  rt().record_event(start.get(), 0, kDefaultStream);
  EXPECT_CONTAINS(error_message([&] { rt().elapsed_ms(start.get(), end.get()); }), ("recorded"));
  EXPECT_CONTAINS(error_message([&] { rt().elapsed_ms(end.get(), start.get()); }), ("recorded"));
}

TEST_F(EventTest, ElapsedTimeNeedsBothEventsOnOneDevice) {
  auto start = make_event(0, true);
  auto end = make_event(1, true);
  rt().record_event(start.get(), 0, kDefaultStream);
  rt().record_event(end.get(), 1, kDefaultStream);
  EXPECT_CONTAINS(error_message([&] { rt().elapsed_ms(start.get(), end.get()); }),
                  ("both events on the same device, got brick:0 and brick:1"));
}

TEST_F(EventTest, QueryAndSynchronize) {
  auto event = make_event(0, false);
  EXPECT_TRUE(rt().query_event(event.get())) << "an unrecorded event counts as complete";
  EXPECT_NO_THROW(rt().synchronize_event(event.get()));
  rt().record_event(event.get(), 0, kDefaultStream);
  EXPECT_TRUE(rt().query_event(event.get()));
  EXPECT_NO_THROW(rt().synchronize_event(event.get()));
  const StreamId s = rt().create_stream(0, 0);
  EXPECT_NO_THROW(rt().stream_wait_event(0, s, event.get()));
  EXPECT_THROW(rt().stream_wait_event(0, s + 1, event.get()), Error);
}

TEST_F(EventTest, RecordingOnAnotherDevicesStreamThrows) {
  auto event = make_event(0, true);
  const std::string message =
      error_message([&] { rt().record_event(event.get(), 1, kDefaultStream); });
  EXPECT_CONTAINS(message, ("brick:0"));
  EXPECT_CONTAINS(message, ("brick:1"));
  // The failed record left the event unrecorded.
  auto end = make_event(0, true);
  rt().record_event(end.get(), 0, kDefaultStream);
  EXPECT_THROW(rt().elapsed_ms(event.get(), end.get()), Error);
}

TEST_F(EventTest, RecordingOnAnInvalidStreamThrows) {
  auto event = make_event(0, false);
  EXPECT_CONTAINS(error_message([&] { rt().record_event(event.get(), 0, 42); }),
                  ("stream 42 does not exist"));
  EXPECT_THROW(rt().record_event(event.get(), kDevices, kDefaultStream), Error);
}

TEST_F(EventTest, DestroyNullEventIsANoOp) { EXPECT_NO_FATAL_FAILURE(rt().destroy_event(nullptr)); }

TEST_F(EventTest, HostEventsAreNeverCapturedAndHaveNoNativeStream) {
  const StreamId s = rt().create_stream(1, -1);
  for (const StreamId stream : {kDefaultStream, s}) {
    EXPECT_EQ(rt().native_stream(1, stream), nullptr);
    EXPECT_FALSE(rt().is_capturing(1, stream));
  }
  EXPECT_CONTAINS(error_message([&] { rt().native_stream(1, s + 1); }), ("does not exist"));
  EXPECT_THROW(rt().is_capturing(1, s + 1), Error);
  EXPECT_THROW(rt().native_stream(kDevices, kDefaultStream), Error);
}

TEST_F(RuntimeTest, StreamFromNativeIsNotSupportedByTheHostRuntime) {
  int handle = 0;
  EXPECT_CONTAINS(error_message([&] { rt().stream_from_native(0, &handle); }), ("not supported"));
  EXPECT_CONTAINS(error_message([&] { rt().stream_from_native(kDevices, nullptr); }),
                  ("device index"));
}

TEST_F(RuntimeTest, RecordStreamIsANoOpThatValidatesTheStream) {
  void* ptr = rt().allocate(0, 128);
  const StreamId s = rt().create_stream(0, 0);
  EXPECT_NO_THROW(rt().record_stream(ptr, 0, s));
  EXPECT_NO_THROW(rt().record_stream(ptr, 1, kDefaultStream));  // used on another device
  EXPECT_THROW(rt().record_stream(ptr, 0, s + 1), Error);
  EXPECT_THROW(rt().record_stream(ptr, kDevices, kDefaultStream), Error);
  const Runtime::Released released = rt().deallocate(ptr);
  EXPECT_EQ(released.nbytes, 128u);
  EXPECT_EQ(rt().memory_stats(0).allocations, 0);
}

// ---------------------------------------------------------------------------------------------
// Concurrency

TEST_F(RuntimeTest, ConcurrentAllocationsBalanceExactly) {
  constexpr int kThreads = 8;
  constexpr int kBlocks = 10000;
  constexpr int kLive = 64;  // each thread keeps up to this many blocks alive at once
  std::vector<int64_t> bytes_per_device(kDevices, 0);
  std::vector<std::vector<int64_t>> bytes(kThreads, std::vector<int64_t>(kDevices, 0));
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<void*> live;
      std::vector<size_t> live_sizes;
      std::vector<int> live_devices;
      uint32_t seed = 12345u + static_cast<uint32_t>(t);
      for (int i = 0; i < kBlocks; ++i) {
        seed = seed * 1664525u + 1013904223u;
        const size_t nbytes = 1 + (seed >> 8) % 4096;
        const int device = static_cast<int>((seed >> 4) % kDevices);
        void* ptr = rt().allocate(device, nbytes);
        if (reinterpret_cast<std::uintptr_t>(ptr) % 64 != 0) ++failures[t];
        static_cast<unsigned char*>(ptr)[0] = static_cast<unsigned char>(t);
        static_cast<unsigned char*>(ptr)[nbytes - 1] = static_cast<unsigned char>(t);
        bytes[t][device] += static_cast<int64_t>(nbytes);
        live.push_back(ptr);
        live_sizes.push_back(nbytes);
        live_devices.push_back(device);
        if (live.size() >= kLive) {
          // Free a pseudo-random half so blocks die in a different order than they were born.
          for (size_t j = 0; j < live.size();) {
            if (((seed >> j % 16) & 1u) != 0) {
              const Runtime::Released r = rt().deallocate(live[j]);
              if (r.nbytes != live_sizes[j] || r.device != live_devices[j]) ++failures[t];
              live[j] = live.back();
              live_sizes[j] = live_sizes.back();
              live_devices[j] = live_devices.back();
              live.pop_back();
              live_sizes.pop_back();
              live_devices.pop_back();
            } else {
              ++j;
            }
            seed = seed * 1664525u + 1013904223u;
          }
        }
      }
      for (size_t j = 0; j < live.size(); ++j) {
        const Runtime::Released r = rt().deallocate(live[j]);
        if (r.nbytes != live_sizes[j] || r.device != live_devices[j]) ++failures[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(failures[t], 0) << "thread " << t;
    for (int d = 0; d < kDevices; ++d) bytes_per_device[d] += bytes[t][d];
  }

  int64_t total_allocations = 0;
  for (int d = 0; d < kDevices; ++d) {
    const MemoryStats s = rt().memory_stats(d);
    EXPECT_EQ(s.allocated_bytes, 0) << "device " << d;
    EXPECT_EQ(s.allocations, 0) << "device " << d;
    EXPECT_EQ(s.total_allocations, s.total_frees) << "device " << d;
    EXPECT_EQ(s.allocated_bytes_total, bytes_per_device[d]) << "device " << d;
    EXPECT_EQ(s.freed_bytes_total, bytes_per_device[d]) << "device " << d;
    EXPECT_GT(s.peak_allocated_bytes, 0) << "device " << d;
    EXPECT_LE(s.peak_allocated_bytes, bytes_per_device[d]) << "device " << d;
    EXPECT_LE(s.peak_allocations, kThreads * kLive) << "device " << d;
    total_allocations += s.total_allocations;
  }
  EXPECT_EQ(total_allocations, int64_t{kThreads} * kBlocks);
}

TEST_F(RuntimeTest, ConcurrentCrossThreadFreesBalanceExactly) {
  // Producers allocate, the main thread frees: deallocate from any thread is allowed.
  constexpr int kThreads = 4;
  constexpr int kBlocks = 5000;
  std::vector<std::vector<void*>> blocks(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kBlocks; ++i) blocks[t].push_back(rt().allocate(t % kDevices, 32));
    });
  }
  for (auto& thread : threads) thread.join();
  int64_t live = 0;
  for (int d = 0; d < kDevices; ++d) live += rt().memory_stats(d).allocations;
  EXPECT_EQ(live, kThreads * kBlocks);
  for (auto& v : blocks) {
    for (void* ptr : v) rt().deallocate(ptr);
  }
  for (int d = 0; d < kDevices; ++d) {
    EXPECT_EQ(rt().memory_stats(d).allocated_bytes, 0);
    EXPECT_EQ(rt().memory_stats(d).allocations, 0);
  }
}

TEST_F(RuntimeTest, ConcurrentAdoptionBalancesExactly) {
  constexpr int kThreads = 8;
  constexpr int kIterations = 10000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIterations; ++i) {
        const size_t nbytes = static_cast<size_t>(1 + (i * 31 + t) % 1000);
        rt().record_adopted(0, nbytes);
        rt().release_adopted(0, nbytes);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  const MemoryStats s = rt().memory_stats(0);
  EXPECT_EQ(s.adopted_bytes, 0);
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.allocations, 0);
  EXPECT_EQ(s.total_allocations, int64_t{kThreads} * kIterations);
  EXPECT_EQ(s.total_frees, int64_t{kThreads} * kIterations);
  EXPECT_EQ(s.allocated_bytes_total, s.freed_bytes_total);
}

// ---------------------------------------------------------------------------------------------
// BRICK_HOST_DEVICES

class HostDevicesEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* value = std::getenv(kVariable)) saved_ = value;
  }
  void TearDown() override {
    if (saved_) {
      setenv(kVariable, saved_->c_str(), 1);
    } else {
      unsetenv(kVariable);
    }
  }
  static constexpr const char* kVariable = "BRICK_HOST_DEVICES";
  std::optional<std::string> saved_;
};

TEST_F(HostDevicesEnvTest, DefaultsToTwo) {
  unsetenv(kVariable);
  EXPECT_EQ(host_device_count_from_env(), 2);
  setenv(kVariable, "", 1);
  EXPECT_EQ(host_device_count_from_env(), 2);
}

TEST_F(HostDevicesEnvTest, ParsesValidCounts) {
  setenv(kVariable, "3", 1);
  EXPECT_EQ(host_device_count_from_env(), 3);
  setenv(kVariable, "1", 1);
  EXPECT_EQ(host_device_count_from_env(), 1);
  setenv(kVariable, "64", 1);
  EXPECT_EQ(host_device_count_from_env(), kMaxDevices);
}

TEST_F(HostDevicesEnvTest, RejectsInvalidCounts) {
  for (const char* bad : {"0", "abc", "65", "-1", "3x", "2.5", "99999999999999999999999"}) {
    setenv(kVariable, bad, 1);
    const std::string message = error_message([] { host_device_count_from_env(); });
    EXPECT_CONTAINS(message, (std::string("BRICK_HOST_DEVICES='") + bad + "'")) << bad;
    EXPECT_CONTAINS(message, ("1 to " + std::to_string(kMaxDevices))) << bad;
  }
}

// ---------------------------------------------------------------------------------------------
// Runtime selection (BRICK_RUNTIME, the CUDA backing check). make_runtime_from_env() is what get()
// runs once; these tests hold on either kind of machine.

// CUDA backing checks standing in for a CPU-only PyTorch above the runtime.
std::optional<std::string> refuse_cuda_backing() {
  return "this PyTorch build cannot run CUDA kernels";
}
std::optional<std::string> refuse_cuda_backing_without_reason() { return ""; }

class SelectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (size_t i = 0; i < kVariables.size(); ++i) {
      if (const char* value = std::getenv(kVariables[i])) saved_[i] = value;
    }
    gpu_usable_ = cuda_runtime_usable(&gpu_reason_);
    unsetenv("BRICK_HOST_DEVICES");
  }
  void TearDown() override {
    set_cuda_backing_check(nullptr);
    for (size_t i = 0; i < kVariables.size(); ++i) {
      if (saved_[i]) {
        setenv(kVariables[i], saved_[i]->c_str(), 1);
      } else {
        unsetenv(kVariables[i]);
      }
    }
  }

  static constexpr std::array<const char*, 2> kVariables = {"BRICK_RUNTIME", "BRICK_HOST_DEVICES"};
  std::array<std::optional<std::string>, 2> saved_;
  bool gpu_usable_ = false;
  std::string gpu_reason_;
};

TEST_F(SelectionTest, InvalidValueListsTheValidOnes) {
  for (const char* bad : {"gpu", "CUDA", "host ", "none"}) {
    setenv("BRICK_RUNTIME", bad, 1);
    const std::string message = error_message([] { make_runtime_from_env(); });
    EXPECT_CONTAINS(message, (std::string("BRICK_RUNTIME='") + bad + "' is not valid")) << bad;
    EXPECT_CONTAINS(message, ("'auto'"));
    EXPECT_CONTAINS(message, ("'host'"));
    EXPECT_CONTAINS(message, ("'cuda'"));
  }
}

TEST_F(SelectionTest, HostIsAlwaysTheHostRuntime) {
  setenv("BRICK_RUNTIME", "host", 1);
  setenv("BRICK_HOST_DEVICES", "3", 1);
  const RuntimeChoice choice = make_runtime_from_env();
  EXPECT_EQ(choice.runtime->backing_kind(), BackingKind::Host);
  EXPECT_EQ(choice.runtime->device_count(), 3);
  EXPECT_CONTAINS(choice.note, ("BRICK_RUNTIME=host"));
}

TEST_F(SelectionTest, AutoIsTheDefaultAndFallsBackToHostWithTheReason) {
  for (const char* value : {static_cast<const char*>(nullptr), "", "auto"}) {
    if (value == nullptr) {
      unsetenv("BRICK_RUNTIME");
    } else {
      setenv("BRICK_RUNTIME", value, 1);
    }
    const RuntimeChoice choice = make_runtime_from_env();
    if (gpu_usable_) {
      EXPECT_EQ(choice.runtime->backing_kind(), BackingKind::Cuda);
      EXPECT_CONTAINS(choice.note, ("chose the cuda runtime"));
    } else {
      EXPECT_EQ(choice.runtime->backing_kind(), BackingKind::Host);
      EXPECT_EQ(choice.runtime->device_count(), 2) << "BRICK_HOST_DEVICES' default";
      EXPECT_CONTAINS(choice.note, ("BRICK_RUNTIME=auto chose the host runtime because"));
      EXPECT_CONTAINS(choice.note, (gpu_reason_));
    }
  }
}

TEST_F(SelectionTest, AutoRespectsADisallowedCudaBacking) {
  setenv("BRICK_RUNTIME", "auto", 1);
  set_cuda_backing_check(&refuse_cuda_backing);
  const RuntimeChoice choice = make_runtime_from_env();
  EXPECT_EQ(choice.runtime->backing_kind(), BackingKind::Host);
  EXPECT_CONTAINS(choice.note, ("because this PyTorch build cannot run CUDA kernels"));
}

TEST_F(SelectionTest, CudaWithoutAGpuThrowsTheReason) {
  setenv("BRICK_RUNTIME", "cuda", 1);
  if (gpu_usable_) {
    EXPECT_EQ(make_runtime_from_env().runtime->backing_kind(), BackingKind::Cuda);
    return;
  }
  const std::string message = error_message([] { make_runtime_from_env(); });
  EXPECT_CONTAINS(message, ("brick: BRICK_RUNTIME=cuda was asked for but "));
  EXPECT_CONTAINS(message, (gpu_reason_));
  EXPECT_CONTAINS(message, ("; unset it or use BRICK_RUNTIME=host"));
}

TEST_F(SelectionTest, CudaWhenCudaBackingIsDisallowedThrowsThatReason) {
  setenv("BRICK_RUNTIME", "cuda", 1);
  set_cuda_backing_check(&refuse_cuda_backing);
  EXPECT_CONTAINS(error_message([] { make_runtime_from_env(); }),
                  ("BRICK_RUNTIME=cuda was asked for but this PyTorch build cannot run CUDA "
                   "kernels; unset it or use BRICK_RUNTIME=host"));
  set_cuda_backing_check(&refuse_cuda_backing_without_reason);  // no reason given: still a sentence
  EXPECT_CONTAINS(error_message([] { make_runtime_from_env(); }), ("disallowed"));
}

TEST(CudaAvailability, UnusableCudaExplainsItselfConsistently) {
  std::string why;
  if (cuda_runtime_usable(&why)) GTEST_SKIP() << "a GPU is usable here";
  EXPECT_FALSE(why.empty());
  EXPECT_FALSE(cuda_runtime_usable(nullptr));
#if BRICK_WITH_CUDA
  EXPECT_CONTAINS(why, ("cudaGetDeviceCount"));
#else
  EXPECT_EQ(why,
            "this build of torch_brickdev has no CUDA runtime (built without the CUDA toolkit)");
#endif
  const std::string message = error_message([] { make_cuda_runtime(); });
  EXPECT_CONTAINS(message, ("brick: cannot create the CUDA runtime"));
}

// ---- deferred completion (BRICK_HOST_COMPLETION=deferred) ------------------------------------

class DeferredHostTest : public ::testing::Test {
 protected:
  std::unique_ptr<Runtime> rt = make_host_runtime(2, HostCompletion::Deferred);
  Event* start = rt->create_event(0, /*enable_timing=*/true);
  Event* end = rt->create_event(0, /*enable_timing=*/true);
  void TearDown() override {
    rt->destroy_event(start);
    rt->destroy_event(end);
  }
};

TEST_F(DeferredHostTest, IsAsynchronousUnlikeTheDefault) {
  EXPECT_TRUE(rt->asynchronous());
  EXPECT_FALSE(make_host_runtime(1)->asynchronous());
}

TEST_F(DeferredHostTest, EventsCompleteAfterTheirRecordAndSynchronizeWaits) {
  EXPECT_TRUE(rt->query_event(start));  // never recorded: nothing to wait for, as on CUDA
  rt->record_event(start, 0, kDefaultStream);
  rt->record_event(end, 0, kDefaultStream);
  EXPECT_FALSE(rt->query_event(end));
  EXPECT_EQ(rt->event_host_time_ns(end), -1);
  EXPECT_FALSE(rt->query_stream(0, kDefaultStream));
  EXPECT_CONTAINS(brick::test::thrown_message<Error>([&] { rt->elapsed_ms(start, end); }, "Error"),
                  "to have completed");
  rt->synchronize_event(end);
  EXPECT_TRUE(rt->query_event(end));
  EXPECT_GE(rt->event_host_time_ns(end), 0);
  EXPECT_GE(rt->elapsed_ms(start, end), 0.0);
  EXPECT_TRUE(rt->query_stream(0, kDefaultStream));
}

TEST_F(DeferredHostTest, SynchronizeDeviceWaitsForItsLastEvent) {
  rt->record_event(end, 0, kDefaultStream);
  rt->synchronize_device(0);
  EXPECT_TRUE(rt->query_event(end));
}

TEST(HostCompletion, ComesFromTheEnvironmentAndRejectsNonsense) {
  ASSERT_EQ(unsetenv("BRICK_HOST_COMPLETION"), 0);
  EXPECT_EQ(host_completion_from_env(), HostCompletion::Immediate);
  ASSERT_EQ(setenv("BRICK_HOST_COMPLETION", "deferred", 1), 0);
  EXPECT_EQ(host_completion_from_env(), HostCompletion::Deferred);
  ASSERT_EQ(setenv("BRICK_HOST_COMPLETION", "later", 1), 0);
  EXPECT_CONTAINS(brick::test::thrown_message<Error>([] { host_completion_from_env(); }, "Error"),
                  "BRICK_HOST_COMPLETION='later' is not valid");
  ASSERT_EQ(unsetenv("BRICK_HOST_COMPLETION"), 0);
}

}  // namespace
}  // namespace brick::runtime
