// GoogleTest suite for the device timeline's per-thread logs (TimelineLog), without torch.
//
// Events come from the process-wide runtime (the host runtime on a machine without a GPU).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <new>
#include <thread>
#include <vector>

#include "profiler/timeline_log.h"

namespace {

// Allocations made by the calling thread while counting is on: appends must make none but
// their chunks.
thread_local bool t_counting = false;
thread_local size_t t_allocations = 0;

}  // namespace

[[gnu::noinline]] void* operator new(size_t size) {
  if (t_counting) ++t_allocations;
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t size) { return ::operator new(size); }
void* operator new(size_t size, const std::nothrow_t&) noexcept {
  try {
    return ::operator new(size);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](size_t size, const std::nothrow_t& tag) noexcept {
  return ::operator new(size, tag);
}
// (Not inlined: a caller would see free() on memory from operator new, and warn.)
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, size_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace {

using brick::profiler::Annotation;
using brick::profiler::StubRecord;
using brick::profiler::TimelineLog;
using brick::profiler::TimelineSnapshot;
namespace runtime = brick::runtime;

StubRecord make_record(uint64_t thread, int64_t i) {
  return StubRecord{thread, /*cpu_ns=*/i, /*device_ns=*/i * 10, /*device=*/0, /*stream=*/0};
}

// Each thread's cpu_ns values, in snapshot order.
std::map<uint64_t, std::vector<int64_t>> by_thread(const TimelineSnapshot& snap) {
  std::map<uint64_t, std::vector<int64_t>> out;
  for (const StubRecord& r : snap.records) out[r.thread].push_back(r.cpu_ns);
  return out;
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = i;
  return out;
}

TEST(TimelineLog, KeepsOneThreadsRecordsInCallOrderAcrossChunks) {
  TimelineLog log(1u << 20);
  const int64_t n = 3 * TimelineLog::kMaxChunk + 17;  // every chunk size, and a partial one
  for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(log.append(make_record(7, i), nullptr));
  const TimelineSnapshot snap = log.snapshot();
  ASSERT_EQ(snap.records.size(), static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(snap.records[i].thread, 7u);
    EXPECT_EQ(snap.records[i].cpu_ns, i);
    EXPECT_EQ(snap.records[i].device_ns, i * 10);
  }
  EXPECT_EQ(snap.dropped_records, 0u);
  EXPECT_EQ(log.thread_logs(), 1u);
}

TEST(TimelineLog, AppendsAllocateNothingButTheirChunks) {
  TimelineLog log(1u << 20);
  ASSERT_TRUE(log.append(make_record(1, 0), nullptr));  // this thread's log is created
  const size_t n = 4 * TimelineLog::kMaxChunk;
  t_allocations = 0;
  t_counting = true;
  for (size_t i = 1; i < n; ++i) log.append(make_record(1, static_cast<int64_t>(i)), nullptr);
  t_counting = false;
  // Chunks of 256, 512, ... 16384, then 16384 each: two allocations each (chunk, entries).
  size_t chunks = 0;
  for (size_t held = TimelineLog::kFirstChunk, size = TimelineLog::kFirstChunk; held < n;
       ++chunks) {
    size = std::min(size * 2, TimelineLog::kMaxChunk);
    held += size;
  }
  EXPECT_EQ(t_allocations, 2 * chunks);
  EXPECT_EQ(log.snapshot().records.size(), n);
}

TEST(TimelineLog, ThreadsAppendConcurrentlyAndSnapshotsSeeEachThreadsPrefix) {
  TimelineLog log(1u << 22);
  constexpr int kThreads = 4;
  constexpr int64_t kEach = 60000;
  std::atomic<int> started{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      log.append(make_record(100 + t, 0), nullptr);
      started.fetch_add(1);
      while (started.load() < kThreads) std::this_thread::yield();  // all alive at once
      for (int64_t i = 1; i < kEach; ++i) log.append(make_record(100 + t, i), nullptr);
    });
  }
  // Snapshots while the threads append: each thread's records are a prefix of its calls.
  for (int s = 0; s < 20; ++s) {
    for (const auto& [thread, seen] : by_thread(log.snapshot())) {
      ASSERT_EQ(seen, iota(static_cast<int64_t>(seen.size()))) << "thread " << thread;
    }
  }
  for (auto& t : threads) t.join();
  const auto seen = by_thread(log.snapshot());
  ASSERT_EQ(seen.size(), static_cast<size_t>(kThreads));
  for (const auto& [thread, values] : seen) EXPECT_EQ(values, iota(kEach)) << "thread " << thread;
  // The threads exited: their logs stay readable, and are reused by later threads.
  EXPECT_EQ(log.thread_logs(), static_cast<size_t>(kThreads));
}

TEST(TimelineLog, CapsRecordsPerProcessAndCountsTheRestAsDropped) {
  constexpr size_t kCap = 3 * TimelineLog::kReserveBlock + 100;
  TimelineLog log(kCap);
  for (size_t i = 0; i < kCap + 500; ++i) log.append(make_record(1, static_cast<int64_t>(i)), {});
  TimelineSnapshot snap = log.snapshot();
  EXPECT_EQ(snap.records.size(), kCap);
  EXPECT_EQ(snap.dropped_records, 500u);
  EXPECT_EQ(snap.records.back().cpu_ns, static_cast<int64_t>(kCap - 1));  // the first ones kept

  // Across threads: never more than the cap (nor less than a block per thread short of it),
  // every append kept or counted.
  constexpr size_t kThreadsCap = 10 * TimelineLog::kReserveBlock + 100;
  constexpr int64_t kEach = 5 * TimelineLog::kReserveBlock;
  TimelineLog shared(kThreadsCap);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&shared, t] {
      for (int64_t i = 0; i < kEach; ++i) shared.append(make_record(t, i), nullptr);
    });
  }
  for (auto& t : threads) t.join();
  snap = shared.snapshot();
  EXPECT_LE(snap.records.size(), kThreadsCap);
  EXPECT_GE(snap.records.size(), kThreadsCap - 4 * TimelineLog::kReserveBlock);
  EXPECT_EQ(snap.records.size() + snap.dropped_records, 4u * kEach);
  for (const auto& [thread, values] : by_thread(snap)) {
    EXPECT_EQ(values, iota(static_cast<int64_t>(values.size()))) << "thread " << thread;
  }
}

TEST(TimelineLog, ClearEmptiesEveryLogAndRestoresTheCap) {
  constexpr size_t kCap = 1000;
  TimelineLog log(kCap);
  for (int64_t i = 0; i < 1200; ++i) log.append(make_record(1, i), nullptr);
  log.annotate(Annotation{"mark", 1, 5, 5, false});
  std::thread([&log] {
    for (int64_t i = 0; i < 10; ++i) log.append(make_record(2, i), nullptr);
  }).join();
  log.clear();
  TimelineSnapshot snap = log.snapshot();
  EXPECT_TRUE(snap.records.empty());
  EXPECT_TRUE(snap.annotations.empty());
  EXPECT_EQ(snap.dropped_records, 0u);
  for (int64_t i = 0; i < static_cast<int64_t>(kCap); ++i) {
    ASSERT_TRUE(log.append(make_record(1, i), nullptr)) << i;
  }
  snap = log.snapshot();
  EXPECT_EQ(snap.records.size(), kCap);
  EXPECT_EQ(snap.dropped_records, 0u);
  EXPECT_EQ(by_thread(snap)[1], iota(kCap));
}

TEST(TimelineLog, ExitedThreadsLogsStayReadableUntilClearedAndAreReused) {
  TimelineLog log(1u << 20);
  for (int t = 0; t < 8; ++t) {
    std::thread([&log, t] {
      for (int64_t i = 0; i < 300; ++i) log.append(make_record(t, i), nullptr);
      log.annotate(Annotation{"done", static_cast<uint64_t>(t), 1, 2, true});
    }).join();
  }
  EXPECT_EQ(log.thread_logs(), 1u);  // one thread at a time: one log, taken over in turn
  TimelineSnapshot snap = log.snapshot();
  const auto seen = by_thread(snap);
  ASSERT_EQ(seen.size(), 8u);
  for (const auto& [thread, values] : seen) EXPECT_EQ(values, iota(300)) << "thread " << thread;
  EXPECT_EQ(snap.annotations.size(), 8u);
  log.clear();
  snap = log.snapshot();
  EXPECT_TRUE(snap.records.empty());
  EXPECT_TRUE(snap.annotations.empty());
}

TEST(TimelineLog, AnnotationsComeFromEveryThread) {
  TimelineLog log(1000);
  log.annotate(Annotation{"main", 1, 10, 10, false});
  std::thread([&log] { log.annotate(Annotation{"worker", 2, 20, 30, true}); }).join();
  const TimelineSnapshot snap = log.snapshot();
  ASSERT_EQ(snap.annotations.size(), 2u);
  std::vector<std::string> names;
  for (const auto& a : snap.annotations) names.push_back(a.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"main", "worker"}));
  EXPECT_TRUE(snap.records.empty());
}

class TimelineEvents : public ::testing::Test {
 protected:
  void SetUp() override {
    rt_ = &runtime::get();
    event_ = rt_->create_event(0, /*enable_timing=*/true);
  }
  void TearDown() override { rt_->destroy_event(event_); }

  // Records event_ now and returns its device time.
  int64_t record_now() {
    rt_->record_event(event_, 0, runtime::kDefaultStream);
    rt_->synchronize_event(event_);
    return rt_->event_host_time_ns(event_);
  }

  runtime::Runtime* rt_ = nullptr;
  runtime::Event* event_ = nullptr;
};

TEST_F(TimelineEvents, ResolveFillsInTheDeviceTime) {
  TimelineLog log(1000);
  const int64_t device_ns = record_now();
  StubRecord record = make_record(1, 0);
  record.device_ns = -1;
  const TimelineLog::Handle handle = log.append(record, event_);
  ASSERT_TRUE(handle);
  log.resolve(handle, event_);
  record_now();  // reused: the record keeps the time it had
  const TimelineSnapshot snap = log.snapshot();
  ASSERT_EQ(snap.records.size(), 1u);
  EXPECT_EQ(snap.records[0].device_ns, device_ns);
}

TEST_F(TimelineEvents, ASnapshotResolvesFirstAndALaterResolveChangesNothing) {
  TimelineLog log(1000);
  const int64_t device_ns = record_now();
  StubRecord record = make_record(1, 0);
  record.device_ns = -1;
  const TimelineLog::Handle handle = log.append(record, event_);
  EXPECT_EQ(log.snapshot().records.at(0).device_ns, device_ns);
  record_now();
  log.resolve(handle, event_);
  EXPECT_EQ(log.snapshot().records.at(0).device_ns, device_ns);
}

TEST_F(TimelineEvents, AResolveAfterAClearLeavesTheNewRecordsAlone) {
  TimelineLog log(1000);
  record_now();
  StubRecord record = make_record(1, 0);
  record.device_ns = -1;
  const TimelineLog::Handle stale = log.append(record, event_);
  log.clear();
  for (int64_t i = 0; i < 3; ++i) log.append(make_record(1, i), nullptr);  // the same memory
  record.device_ns = -1;
  log.append(record, event_);
  record_now();
  log.resolve(stale, event_);  // the cleared record's: ignored
  const TimelineSnapshot snap = log.snapshot();
  ASSERT_EQ(snap.records.size(), 4u);
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(snap.records[i].device_ns, i * 10);
  EXPECT_EQ(snap.records[3].device_ns, rt_->event_host_time_ns(event_));  // resolved at read
}

TEST_F(TimelineEvents, ResolvesFromAnotherThreadWhileTheOwnerAppends) {
  TimelineLog log(1u << 20);
  constexpr int kPending = 2000;
  const int64_t device_ns = record_now();
  std::vector<TimelineLog::Handle> handles;
  for (int i = 0; i < kPending; ++i) {
    StubRecord record = make_record(1, i);
    record.device_ns = -1;
    handles.push_back(log.append(record, event_));
  }
  std::thread resolver([&] {
    for (const auto& handle : handles) log.resolve(handle, event_);
  });
  for (int64_t i = kPending; i < 50000; ++i) log.append(make_record(1, i), nullptr);
  resolver.join();
  const TimelineSnapshot snap = log.snapshot();
  ASSERT_EQ(snap.records.size(), 50000u);
  for (int i = 0; i < kPending; ++i) EXPECT_EQ(snap.records[i].device_ns, device_ns);
  EXPECT_EQ(by_thread(snap)[1], iota(50000));
}

TEST(TimelineLog, AForkedChildStartsEmptyAndTheParentKeepsItsRecords) {
  TimelineLog log(1u << 20);
  for (int64_t i = 0; i < 100; ++i) log.append(make_record(1, i), nullptr);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> appended{0};
  std::thread other([&] {  // appends (and holds its log) across the fork
    for (int64_t i = 0; !stop.load(); ++i) {
      log.append(make_record(2, i), nullptr);
      appended.store(i + 1);
    }
  });
  while (appended.load() < 1000) std::this_thread::yield();
  log.lock_for_fork();
  const pid_t pid = fork();
  if (pid == 0) {
    log.unlock_after_fork(/*in_child=*/true);
    int failures = 0;
    TimelineSnapshot snap = log.snapshot();
    failures += !snap.records.empty();
    for (int64_t i = 0; i < 10; ++i) log.append(make_record(3, i), nullptr);
    size_t expected = 10;
#ifndef __SANITIZE_THREAD__  // (ThreadSanitizer cannot start threads in a forked child)
    // The other thread's log is free in the child: a new thread takes it over.
    std::thread([&log] { log.append(make_record(4, 0), nullptr); }).join();
    expected = 11;
#endif
    snap = log.snapshot();
    failures += snap.records.size() != expected;
    failures += log.thread_logs() != 2;
    _exit(failures);
  }
  log.unlock_after_fork(/*in_child=*/false);
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  stop = true;
  other.join();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  const auto seen = by_thread(log.snapshot());
  EXPECT_EQ(seen.at(1), iota(100));
  EXPECT_EQ(seen.at(2), iota(appended.load()));
  EXPECT_EQ(seen.count(3), 0u);
}

TEST(TimelineLog, RefusesAnUnusableCap) {
  EXPECT_THROW(TimelineLog(0), std::invalid_argument);
  EXPECT_THROW(TimelineLog(size_t{1} << 32), std::invalid_argument);
}

}  // namespace
