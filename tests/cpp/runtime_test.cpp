// The runtime contract (csrc/runtime/runtime.h), run against every runtime of this build: the
// host runtime always, the CUDA runtime where it is built, each of its tests skipping with the
// reason where no GPU is usable. What only one runtime does is tested in host_runtime_test.cpp
// and cuda_runtime_test.cpp; choosing a runtime in runtime_selection_test.cpp.
//
// Every test builds its own runtime, so memory statistics and streams start from nothing and no
// test depends on another's leftovers. Streams and memory the runtime does not make itself come
// from the runtime kind (runtime_test_util.h), the way the backend gets them.
#include "runtime/runtime.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/steady_clock.h"
#include "runtime_test_util.h"
#include "test_util.h"

namespace brick::test {
namespace {

template <typename Kind>
class RuntimeContractTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!Kind::usable(&why)) {
      GTEST_SKIP() << "the " << Kind::kName << " runtime is not usable here: " << why;
    }
    rt_ = Kind::make();
  }

  void TearDown() override { tear_down_runtime(rt_, kind_); }

  Runtime& rt() { return *rt_; }
  Kind& kind() { return kind_; }
  StreamId new_stream(DeviceIndex device, int priority = 0) {
    return kind_.new_stream(*rt_, device, priority);
  }
  EventPtr event(DeviceIndex device, bool timing) { return make_event(*rt_, device, timing); }

  Kind kind_;
  std::unique_ptr<Runtime> rt_;
};

#if BRICK_WITH_CUDA
using RuntimeKinds = ::testing::Types<HostRuntimeKind, CudaRuntimeKind>;
#else
using RuntimeKinds = ::testing::Types<HostRuntimeKind>;
#endif
// Named by type (CTest: RuntimeContractTest.<test><brick::test::HostRuntimeKind>).
TYPED_TEST_SUITE(RuntimeContractTest, RuntimeKinds);

// Skips the rest of a test that needs `n` brick devices where the runtime has fewer.
#define SKIP_UNLESS_DEVICES(rt, n)                                                                 \
  do {                                                                                             \
    if ((rt).device_count() < (n)) {                                                               \
      GTEST_SKIP() << "needs " << (n) << " brick devices; this " << (rt).name() << " runtime has " \
                   << (rt).device_count();                                                         \
    }                                                                                              \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Identity and devices

TYPED_TEST(RuntimeContractTest, IdentifiesItself) {
  Runtime& rt = this->rt();
  EXPECT_EQ(rt.backing_kind(), TypeParam::kKind);
  EXPECT_STREQ(rt.name(), TypeParam::kName);
  EXPECT_EQ(rt.asynchronous(), TypeParam::kAsynchronous);
  EXPECT_EQ(rt.device_count(), TypeParam::expected_device_count());
  for (int d = 0; d < rt.device_count(); ++d) {
    EXPECT_EQ(rt.backing_device_index(d), TypeParam::expected_backing_index(d)) << "device " << d;
  }
}

TYPED_TEST(RuntimeContractTest, CheckDeviceAcceptsEveryValidIndex) {
  Runtime& rt = this->rt();
  for (int d = 0; d < rt.device_count(); ++d) EXPECT_NO_THROW(rt.check_device(d)) << "device " << d;
}

TYPED_TEST(RuntimeContractTest, CheckDeviceRejectsOutOfRangeIndices) {
  Runtime& rt = this->rt();
  const int n = rt.device_count();
  for (const int bad : {n, n + 1, -1, -7, kMaxDevices, 1000}) {
    const std::string message = error_message([&] { rt.check_device(bad); });
    EXPECT_CONTAINS(message, ("device index " + std::to_string(bad) + " is out of range"))
        << "index " << bad;
    EXPECT_CONTAINS(message, ("0.." + std::to_string(n - 1))) << message;
    EXPECT_CONTAINS(message, (std::to_string(n) + " brick device(s)")) << message;
  }
}

TYPED_TEST(RuntimeContractTest, EveryDeviceTakingCallValidatesTheIndex) {
  Runtime& rt = this->rt();
  const int n = rt.device_count();
  EXPECT_THROW(rt.set_current_device(n), Error);
  EXPECT_THROW(rt.memory_stats(n), Error);
  EXPECT_THROW(rt.reset_peak_memory_stats(-1), Error);
  EXPECT_THROW(rt.reset_accumulated_memory_stats(n), Error);
  EXPECT_THROW(rt.current_stream(n), Error);
  EXPECT_THROW(rt.synchronize_device(n), Error);
  EXPECT_THROW(rt.is_capturing(n, kDefaultStream), Error);
  EXPECT_THROW(rt.create_event(n, false), Error);
  EXPECT_THROW(rt.create_event(-1, false), Error);
  // A failed set_current_device leaves the current device alone.
  EXPECT_EQ(rt.current_device(), 0);
}

// ---------------------------------------------------------------------------------------------
// Current device (per thread, per runtime)

TYPED_TEST(RuntimeContractTest, CurrentDeviceDefaultsToZeroAndCanBeSet) {
  Runtime& rt = this->rt();
  EXPECT_EQ(rt.current_device(), 0);
  for (int d = rt.device_count() - 1; d >= 0; --d) {
    rt.set_current_device(d);
    EXPECT_EQ(rt.current_device(), d);
  }
}

TYPED_TEST(RuntimeContractTest, CurrentDeviceIsPerThread) {
  Runtime& rt = this->rt();
  const int mine = rt.device_count() - 1;
  const int theirs = rt.device_count() > 1 ? 1 : 0;
  rt.set_current_device(mine);
  int seen_default = -1;
  int seen_after_set = -1;
  on_other_thread([&] {
    seen_default = rt.current_device();
    rt.set_current_device(theirs);
    seen_after_set = rt.current_device();
  });
  EXPECT_EQ(seen_default, 0) << "a new thread starts on device 0";
  EXPECT_EQ(seen_after_set, theirs);
  EXPECT_EQ(rt.current_device(), mine) << "the other thread's setting leaked into this one";
}

TYPED_TEST(RuntimeContractTest, ManyThreadsKeepTheirOwnCurrentDevice) {
  Runtime& rt = this->rt();
  constexpr int kThreads = 6;
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int mine = t % rt.device_count();
      rt.set_current_device(mine);
      for (int i = 0; i < 2000; ++i) {
        if (rt.current_device() != mine) ++mismatches[t];
        std::this_thread::yield();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

// Each runtime instance is documented as isolated, so the calling thread's current device and
// streams must belong to the instance, not to whichever instance the thread touched last.
TYPED_TEST(RuntimeContractTest, InterleavedRuntimesKeepTheirOwnCurrentDevice) {
  SKIP_UNLESS_DEVICES(this->rt(), 2);
  auto a = TypeParam::make();
  auto b = TypeParam::make();
  a->set_current_device(1);
  EXPECT_EQ(b->current_device(), 0);
  EXPECT_EQ(a->current_device(), 1);
  a->set_current_device(0);
}

TYPED_TEST(RuntimeContractTest, FreshRuntimeDoesNotInheritADeadRuntimesState) {
  // Thread state is keyed by a unique runtime id: a runtime allocated where a destroyed one
  // lived must not inherit its current device or streams.
  const int last = this->rt().device_count() - 1;
  for (int attempt = 0; attempt < 16; ++attempt) {
    auto first = TypeParam::make();
    const void* address = first.get();
    first->set_current_device(last);
    first->set_current_stream(last, this->kind().new_stream(*first, last));
    first.reset();
    auto second = TypeParam::make();
    EXPECT_EQ(second->current_device(), 0);
    EXPECT_EQ(second->current_stream(last), kDefaultStream);
    second->set_current_device(0);
    second->set_current_stream(last, kDefaultStream);
    if (second.get() == address) return;  // the address was reused: the case this checks
  }
}

// ---------------------------------------------------------------------------------------------
// Memory statistics (adopted bytes: what the backend counts on every runtime)

TYPED_TEST(RuntimeContractTest, FreshRuntimeHasZeroStats) {
  Runtime& rt = this->rt();
  for (int d = 0; d < rt.device_count(); ++d) {
    const runtime::MemoryStats s = rt.memory_stats(d);
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

TYPED_TEST(RuntimeContractTest, AdoptedBytesTrackPeaksAndTotalsPerDevice) {
  Runtime& rt = this->rt();
  const int last = rt.device_count() - 1;
  rt.record_adopted(last, 100);
  rt.record_adopted(last, 300);
  runtime::MemoryStats s = rt.memory_stats(last);
  EXPECT_EQ(s.adopted_bytes, 400);
  EXPECT_EQ(s.allocated_bytes, 400);
  EXPECT_EQ(s.allocations, 2);
  EXPECT_EQ(s.peak_allocated_bytes, 400);
  for (int d = 0; d < last; ++d) EXPECT_EQ(rt.memory_stats(d).allocated_bytes, 0) << d;

  rt.release_adopted(last, 300);
  s = rt.memory_stats(last);
  EXPECT_EQ(s.allocated_bytes, 100);
  EXPECT_EQ(s.peak_allocated_bytes, 400) << "peak survives a release";
  EXPECT_EQ(s.total_frees, 1);
  EXPECT_EQ(s.freed_bytes_total, 300);

  rt.reset_peak_memory_stats(last);
  s = rt.memory_stats(last);
  EXPECT_EQ(s.peak_allocated_bytes, 100) << "reset_peak lowers the peak to the current value";
  EXPECT_EQ(s.peak_allocations, 1);
  EXPECT_EQ(s.total_allocations, 2) << "reset_peak leaves the monotonic totals alone";

  rt.release_adopted(last, 100);
  s = rt.memory_stats(last);
  EXPECT_EQ(s.adopted_bytes, 0);
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.allocations, 0);
  EXPECT_EQ(s.total_allocations, 2);
  EXPECT_EQ(s.allocated_bytes_total, 400);
  EXPECT_EQ(s.freed_bytes_total, 400);

  rt.record_adopted(last, 64);
  rt.reset_accumulated_memory_stats(last);
  s = rt.memory_stats(last);
  EXPECT_EQ(s.total_allocations, 0) << "reset_accumulated zeroes the monotonic totals";
  EXPECT_EQ(s.total_frees, 0);
  EXPECT_EQ(s.allocated_bytes_total, 0);
  EXPECT_EQ(s.freed_bytes_total, 0);
  EXPECT_EQ(s.allocated_bytes, 64) << "and leaves live memory counted";
  EXPECT_EQ(s.allocations, 1);
  EXPECT_EQ(s.peak_allocated_bytes, 100) << "and the peak alone";
  rt.release_adopted(last, 64);
}

TYPED_TEST(RuntimeContractTest, ConcurrentAdoptionBalancesExactly) {
  Runtime& rt = this->rt();
  constexpr int kThreads = 8;
  constexpr int kIterations = 10000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIterations; ++i) {
        const size_t nbytes = static_cast<size_t>(1 + (i * 31 + t) % 1000);
        rt.record_adopted(0, nbytes);
        rt.release_adopted(0, nbytes);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  const runtime::MemoryStats s = rt.memory_stats(0);
  EXPECT_EQ(s.adopted_bytes, 0);
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.allocations, 0);
  EXPECT_EQ(s.total_allocations, int64_t{kThreads} * kIterations);
  EXPECT_EQ(s.total_frees, int64_t{kThreads} * kIterations);
  EXPECT_EQ(s.allocated_bytes_total, s.freed_bytes_total);
}

// ---------------------------------------------------------------------------------------------
// Copy (into brick memory of one device, from that device or from host memory)

std::vector<unsigned char> pattern(size_t nbytes, unsigned seed) {
  std::vector<unsigned char> bytes(nbytes);
  for (size_t i = 0; i < nbytes; ++i) bytes[i] = static_cast<unsigned char>(i * 31 + seed);
  return bytes;
}

TYPED_TEST(RuntimeContractTest, CopyFromHostAndWithinADevice) {
  Runtime& rt = this->rt();
  constexpr size_t kBytes = (1 << 20) + 3;
  const auto host = pattern(kBytes, 7);
  for (int d = 0; d < rt.device_count(); ++d) {
    void* a = this->kind().device_memory(rt, d, kBytes);
    void* b = this->kind().device_memory(rt, d, kBytes);
    rt.copy(a, d, host.data(), -1, kBytes);  // host -> brick:d
    EXPECT_EQ(this->kind().read(rt, d, a, kBytes), host) << "device " << d;
    rt.copy(b, d, a, d, kBytes);  // brick:d -> brick:d
    EXPECT_EQ(this->kind().read(rt, d, b, kBytes), host) << "device " << d;
  }
}

TYPED_TEST(RuntimeContractTest, CopyFromHostMemoryHasReadItWhenItReturns) {
  Runtime& rt = this->rt();
  constexpr size_t kBytes = 8 << 20;
  auto host = pattern(kBytes, 1);
  const auto original = host;
  void* ptr = this->kind().device_memory(rt, 0, kBytes);
  rt.copy(ptr, 0, host.data(), -1, kBytes);
  std::fill(host.begin(), host.end(), 0);  // the caller owns the buffer again
  EXPECT_EQ(this->kind().read(rt, 0, ptr, kBytes), original);
}

TYPED_TEST(RuntimeContractTest, CopyOnANonDefaultCurrentStream) {
  Runtime& rt = this->rt();
  rt.set_current_stream(0, this->new_stream(0));
  constexpr size_t kBytes = 4096;
  const auto host = pattern(kBytes, 3);
  void* a = this->kind().device_memory(rt, 0, kBytes);
  void* b = this->kind().device_memory(rt, 0, kBytes);
  rt.copy(a, 0, host.data(), -1, kBytes);
  rt.copy(b, 0, a, 0, kBytes);
  EXPECT_EQ(this->kind().read(rt, 0, b, kBytes), host);
}

TYPED_TEST(RuntimeContractTest, CopyRefusesOverlappingRangesAndCopiesZeroBytes) {
  Runtime& rt = this->rt();
  constexpr size_t kBytes = 1 << 16;
  constexpr size_t kShift = 1000;
  const auto host = pattern(kBytes, 11);
  auto* buf = static_cast<unsigned char*>(this->kind().device_memory(rt, 0, kBytes));
  rt.copy(buf, 0, host.data(), -1, kBytes);
  const size_t n = kBytes - kShift;
  EXPECT_CONTAINS(error_message([&] { rt.copy(buf + kShift, 0, buf, 0, n); }),
                  ("ranges overlap"));  // forward
  EXPECT_CONTAINS(error_message([&] { rt.copy(buf, 0, buf + kShift, 0, n); }),
                  ("ranges overlap"));  // backward
  EXPECT_CONTAINS(error_message([&] { rt.copy(buf, 0, buf, 0, kBytes); }), ("ranges overlap"));
  EXPECT_EQ(this->kind().read(rt, 0, buf, kBytes), host) << "a refused copy changed the bytes";
  // Adjacent ranges do not overlap.
  rt.copy(buf + kShift, 0, buf, 0, kShift);
  std::vector<unsigned char> expected = host;
  std::copy(host.begin(), host.begin() + kShift, expected.begin() + kShift);
  EXPECT_EQ(this->kind().read(rt, 0, buf, kBytes), expected);
  EXPECT_NO_THROW(rt.copy(nullptr, 0, nullptr, 0, 0));
  EXPECT_NO_THROW(rt.copy(nullptr, 0, nullptr, -1, 0));
}

TYPED_TEST(RuntimeContractTest, CopyValidatesDevices) {
  Runtime& rt = this->rt();
  const int n = rt.device_count();
  unsigned char a[8] = {};
  unsigned char b[8] = {};
  EXPECT_CONTAINS(error_message([&] { rt.copy(a, n, b, -1, 8); }),
                  ("device index " + std::to_string(n)));
  EXPECT_CONTAINS(error_message([&] { rt.copy(a, -1, b, 9 + n, 8); }),
                  ("device index " + std::to_string(9 + n)));
  EXPECT_CONTAINS(error_message([&] { rt.copy(a, -1, b, -1, 8); }),
                  ("the destination must be brick memory"));
  SKIP_UNLESS_DEVICES(rt, 2);
  EXPECT_CONTAINS(error_message([&] { rt.copy(a, 1, b, 0, 8); }),
                  ("copy from brick:0 to brick:1: the runtime copies within one brick device"));
}

// ---------------------------------------------------------------------------------------------
// Streams

TYPED_TEST(RuntimeContractTest, DefaultStreamIsZeroOnEveryDevice) {
  Runtime& rt = this->rt();
  EXPECT_EQ(kDefaultStream, 0);
  for (int d = 0; d < rt.device_count(); ++d) EXPECT_EQ(rt.current_stream(d), kDefaultStream);
}

TYPED_TEST(RuntimeContractTest, NewStreamsGetDistinctIds) {
  std::vector<StreamId> ids;
  for (int i = 0; i < 10; ++i) ids.push_back(this->new_stream(0, i % 2 == 0 ? 0 : -1));
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_NE(ids[i], kDefaultStream);
    for (size_t j = i + 1; j < ids.size(); ++j) EXPECT_NE(ids[i], ids[j]);
  }
}

TYPED_TEST(RuntimeContractTest, NewStreamIdsAreDistinctAcrossThreads) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = TypeParam::kStreamsPerThread;
  const int last = this->rt().device_count() - 1;
  std::vector<std::vector<StreamId>> ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) ids[t].push_back(this->new_stream(last));
    });
  }
  for (auto& thread : threads) thread.join();
  std::vector<StreamId> all;
  for (const auto& v : ids) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end()) << "duplicate stream id";
  EXPECT_EQ(all.size(), static_cast<size_t>(kThreads * kPerThread));
}

TYPED_TEST(RuntimeContractTest, SetCurrentStreamIsPerDevice) {
  Runtime& rt = this->rt();
  const int last = rt.device_count() - 1;
  const StreamId s = this->new_stream(last);
  rt.set_current_stream(last, s);
  EXPECT_EQ(rt.current_stream(last), s);
  for (int d = 0; d < last; ++d) EXPECT_EQ(rt.current_stream(d), kDefaultStream) << d;
  rt.set_current_stream(last, kDefaultStream);
  EXPECT_EQ(rt.current_stream(last), kDefaultStream);
}

TYPED_TEST(RuntimeContractTest, CurrentStreamIsPerThread) {
  Runtime& rt = this->rt();
  const StreamId mine = this->new_stream(0);
  const StreamId theirs = this->new_stream(0);
  rt.set_current_stream(0, mine);
  StreamId seen_default = -1;
  StreamId seen_after_set = -1;
  on_other_thread([&] {
    seen_default = rt.current_stream(0);
    rt.set_current_stream(0, theirs);
    seen_after_set = rt.current_stream(0);
  });
  EXPECT_EQ(seen_default, kDefaultStream) << "a new thread starts on the default stream";
  EXPECT_EQ(seen_after_set, theirs);
  EXPECT_EQ(rt.current_stream(0), mine);
}

TYPED_TEST(RuntimeContractTest, InvalidStreamIdsAreRejected) {
  Runtime& rt = this->rt();
  const StreamId created = this->new_stream(0);
  const StreamId missing = created + 1;
  const std::string message = error_message([&] { rt.set_current_stream(0, missing); });
  EXPECT_CONTAINS(message, ("stream " + std::to_string(missing) + " does not exist"));
  EXPECT_CONTAINS(message, ("brick:0"));
  EXPECT_THROW(rt.set_current_stream(0, -1), Error);
  EXPECT_THROW(rt.query_stream(0, missing), Error);
  EXPECT_THROW(rt.synchronize_stream(0, missing), Error);
  EXPECT_THROW(rt.is_capturing(0, missing), Error);
  EXPECT_THROW(rt.record_stream(nullptr, 0, missing), Error);
  EXPECT_THROW(rt.set_current_stream(rt.device_count(), kDefaultStream), Error);
  EXPECT_EQ(rt.current_stream(0), kDefaultStream) << "a failed set changed the stream";
  // Stream ids are per device: brick:0's stream does not exist on another device.
  SKIP_UNLESS_DEVICES(rt, 2);
  const int last = rt.device_count() - 1;
  EXPECT_CONTAINS(error_message([&] { rt.set_current_stream(last, created); }),
                  ("brick:" + std::to_string(last)));
}

TYPED_TEST(RuntimeContractTest, IdleStreamsQueryAndSynchronize) {
  Runtime& rt = this->rt();
  const int last = rt.device_count() - 1;
  const StreamId s = this->new_stream(last);
  EXPECT_TRUE(rt.query_stream(last, kDefaultStream));
  EXPECT_TRUE(rt.query_stream(last, s));
  EXPECT_NO_THROW(rt.synchronize_stream(last, s));
  EXPECT_NO_THROW(rt.synchronize_device(last));
}

TYPED_TEST(RuntimeContractTest, StreamsAreNotCapturingOutsideACapture) {
  Runtime& rt = this->rt();
  const int last = rt.device_count() - 1;
  const StreamId s = this->new_stream(last, -1);
  for (const StreamId stream : {kDefaultStream, s}) EXPECT_FALSE(rt.is_capturing(last, stream));
  EXPECT_THROW(rt.is_capturing(last, s + 1), Error);
}

// ---------------------------------------------------------------------------------------------
// Events

constexpr int kWorkMs = 20;

TYPED_TEST(RuntimeContractTest, ElapsedTimeMeasuresTheWorkBetweenTheEvents) {
  Runtime& rt = this->rt();
  const int last = rt.device_count() - 1;
  auto start = this->event(last, true);
  auto end = this->event(last, true);
  // The interval lies inside the host's wall time around it, however long a busy machine kept
  // this thread from running (a bound of work + slack failed there).
  const int64_t before = steady_ns();
  rt.record_event(start.get(), last, kDefaultStream);
  this->kind().run_work(rt, last, kDefaultStream, kWorkMs);
  rt.record_event(end.get(), last, kDefaultStream);
  rt.synchronize_event(end.get());
  const double wall_ms = static_cast<double>(steady_ns() - before) / 1e6;
  const double ms = rt.elapsed_ms(start.get(), end.get());
  EXPECT_GE(ms, kWorkMs - 0.5);
  EXPECT_LE(ms, wall_ms + TypeParam::kElapsedOverWallMs);
  // Reversed order gives the negative interval (the CUDA event host times rely on this).
  EXPECT_NEAR(rt.elapsed_ms(end.get(), start.get()), -ms, TypeParam::kReversedElapsedToleranceMs);
}

TYPED_TEST(RuntimeContractTest, RecordingOnANonDefaultStream) {
  Runtime& rt = this->rt();
  const StreamId s = this->new_stream(0);
  auto start = this->event(0, true);
  auto end = this->event(0, true);
  rt.record_event(start.get(), 0, s);
  rt.record_event(end.get(), 0, s);
  rt.synchronize_event(end.get());
  EXPECT_GE(rt.elapsed_ms(start.get(), end.get()), 0.0);
}

TYPED_TEST(RuntimeContractTest, ReRecordingRestampsTheEvent) {
  Runtime& rt = this->rt();
  auto start = this->event(0, true);
  auto end = this->event(0, true);
  rt.record_event(start.get(), 0, kDefaultStream);
  this->kind().run_work(rt, 0, kDefaultStream, kWorkMs);
  rt.record_event(start.get(), 0, kDefaultStream);  // restamp: the work is no longer inside
  rt.record_event(end.get(), 0, kDefaultStream);
  rt.synchronize_event(end.get());
  EXPECT_LT(rt.elapsed_ms(start.get(), end.get()), kWorkMs - 0.5);
}

TYPED_TEST(RuntimeContractTest, ElapsedTimeNeedsTimingEvents) {
  Runtime& rt = this->rt();
  auto timed = this->event(0, true);
  auto untimed = this->event(0, false);
  rt.record_event(timed.get(), 0, kDefaultStream);
  rt.record_event(untimed.get(), 0, kDefaultStream);
  rt.synchronize_device(0);
  EXPECT_CONTAINS(error_message([&] { rt.elapsed_ms(timed.get(), untimed.get()); }),
                  ("enable_timing"));
  EXPECT_CONTAINS(error_message([&] { rt.elapsed_ms(untimed.get(), timed.get()); }),
                  ("enable_timing"));
}

TYPED_TEST(RuntimeContractTest, ElapsedTimeNeedsBothEventsRecorded) {
  Runtime& rt = this->rt();
  auto start = this->event(0, true);
  auto end = this->event(0, true);
  EXPECT_CONTAINS(error_message([&] { rt.elapsed_ms(start.get(), end.get()); }), ("recorded"));
  rt.record_event(start.get(), 0, kDefaultStream);
  EXPECT_CONTAINS(error_message([&] { rt.elapsed_ms(start.get(), end.get()); }), ("recorded"));
  EXPECT_CONTAINS(error_message([&] { rt.elapsed_ms(end.get(), start.get()); }), ("recorded"));
}

TYPED_TEST(RuntimeContractTest, ElapsedTimeNeedsBothEventsOnOneDevice) {
  Runtime& rt = this->rt();
  SKIP_UNLESS_DEVICES(rt, 2);
  auto start = this->event(0, true);
  auto end = this->event(1, true);
  rt.record_event(start.get(), 0, kDefaultStream);
  rt.record_event(end.get(), 1, kDefaultStream);
  rt.synchronize_event(start.get());
  rt.synchronize_event(end.get());
  EXPECT_CONTAINS(error_message([&] { rt.elapsed_ms(start.get(), end.get()); }),
                  ("both events on the same device, got brick:0 and brick:1"));
}

TYPED_TEST(RuntimeContractTest, QueryAndSynchronize) {
  Runtime& rt = this->rt();
  auto event = this->event(0, false);
  EXPECT_TRUE(rt.query_event(event.get())) << "an unrecorded event counts as complete";
  EXPECT_NO_THROW(rt.synchronize_event(event.get()));
  rt.record_event(event.get(), 0, kDefaultStream);
  if constexpr (!TypeParam::kAsynchronous) {
    EXPECT_TRUE(rt.query_event(event.get())) << "work completes before the call returns";
  }
  EXPECT_NO_THROW(rt.synchronize_event(event.get()));
  EXPECT_TRUE(rt.query_event(event.get()));
  const StreamId s = this->new_stream(0);
  EXPECT_NO_THROW(rt.stream_wait_event(0, s, event.get()));
  EXPECT_THROW(rt.stream_wait_event(0, s + 1, event.get()), Error);
  rt.synchronize_stream(0, s);
}

TYPED_TEST(RuntimeContractTest, WaitingForAnUnrecordedEventIsANoOp) {
  Runtime& rt = this->rt();
  const StreamId s = this->new_stream(0);
  auto never = this->event(0, false);
  EXPECT_NO_THROW(rt.stream_wait_event(0, s, never.get()));
  rt.synchronize_stream(0, s);
  EXPECT_TRUE(rt.query_stream(0, s));
}

TYPED_TEST(RuntimeContractTest, RecordingOnAnotherDevicesStreamThrows) {
  Runtime& rt = this->rt();
  SKIP_UNLESS_DEVICES(rt, 2);
  auto event = this->event(0, true);
  const std::string message =
      error_message([&] { rt.record_event(event.get(), 1, kDefaultStream); });
  EXPECT_CONTAINS(message, ("brick:0"));
  EXPECT_CONTAINS(message, ("brick:1"));
  // The failed record left the event unrecorded.
  auto end = this->event(0, true);
  rt.record_event(end.get(), 0, kDefaultStream);
  rt.synchronize_event(end.get());
  EXPECT_THROW(rt.elapsed_ms(event.get(), end.get()), Error);
}

TYPED_TEST(RuntimeContractTest, RecordingOnAnInvalidStreamThrows) {
  Runtime& rt = this->rt();
  auto event = this->event(0, false);
  EXPECT_CONTAINS(error_message([&] { rt.record_event(event.get(), 0, 4242); }),
                  ("stream 4242 does not exist"));
  EXPECT_THROW(rt.record_event(event.get(), rt.device_count(), kDefaultStream), Error);
}

TYPED_TEST(RuntimeContractTest, DestroyNullEventIsANoOp) {
  EXPECT_NO_FATAL_FAILURE(this->rt().destroy_event(nullptr));
}

// What a child forked after a CUDA runtime was created gets (installed by a fork handler for the
// CUDA runtime only): the parent's devices, and every device call refused with the reason and
// the way out, never a failure deep inside CUDA.
TEST(ForkedChildRuntime, KeepsTheDevicesAndRefusesEveryDeviceCallSayingWhy) {
  const auto parent = runtime::make_host_runtime(2);
  const auto child = runtime::make_forked_child_runtime(*parent);
  EXPECT_EQ(child->device_count(), 2);
  EXPECT_EQ(child->backing_kind(), parent->backing_kind());
  EXPECT_STREQ(child->name(), parent->name());
  const std::string message = error_message([&] { (void)child->current_stream(0); });
  EXPECT_CONTAINS(message, "forked after brick used its host runtime");
  EXPECT_CONTAINS(message, "'spawn'");
  EXPECT_CONTAINS(error_message([&] { (void)child->allocate(0, 16); }), "allocating memory");
  EXPECT_CONTAINS(error_message([&] { (void)child->create_event(0, true); }), "creating an event");
  EXPECT_CONTAINS(error_message([&] { child->synchronize_device(1); }), "synchronizing a device");
  EXPECT_CONTAINS(error_message([&] { child->set_current_device(1); }), "current device");
  // What the child inherited is never freed there, and freeing it does not fail.
  EXPECT_EQ(child->deallocate(reinterpret_cast<void*>(0x1000)).device, -1);
  EXPECT_NO_FATAL_FAILURE(child->destroy_event(nullptr));
}

}  // namespace
}  // namespace brick::test
