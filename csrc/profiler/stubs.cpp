// Brick's ProfilerStubs for PyTorch's legacy autograd profiler, and the device timeline.
//
// With torch.autograd.profiler.profile(use_device="brick"), PyTorch calls record() at the start
// and end of every op and range it observes and elapsed() on each pair when it builds its
// events. record() puts a pooled timing event on the current brick stream and logs the call, so
// a trace can place every op's device interval on a per-stream track. No exception may escape
// record(): PyTorch does not catch one there, and it would break the user's op.
#include <ATen/record_function.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/ApproximateClock.h>
#include <pthread.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "profiler/event_pool.h"
#include "profiler/fork.h"
#include "profiler/profiler.h"
#include "runtime/runtime.h"

namespace brick::profiler {

namespace {

constexpr size_t kMaxRecords = 8u << 20;  // 8M records (~320 MB): beyond, records are counted

// Events handed to PyTorch; returned here by the stub's deleter (possibly on another thread).
// PyTorch holds every event of a profile until it post-processes it, so during a profile the
// pool drains: a background thread tops it up, so record() does not create events inline.
class SharedEventPool {
 public:
  runtime::Event* acquire(int device) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!warmed_up_) [[unlikely]] {
        // The first record() (PyTorch makes one per device as a profile starts): fill every
        // device's pool in the background from now on.
        warmed_up_ = true;
        for (int d = 0; d < runtime::get().device_count(); ++d) request_refill(d);
      }
      if (device < static_cast<int>(free_.size()) && !free_[device].empty()) {
        runtime::Event* event = free_[device].back();
        free_[device].pop_back();
        if (free_[device].size() < kLowWater) request_refill(device);
        return event;
      }
      request_refill(device);
    }
    return create_timing_event(device);
  }

  void release(int device, runtime::Event* event) {
    std::lock_guard<std::mutex> lock(mutex_);
    ensure_device(device);
    free_[device].push_back(event);
  }

  void lock_for_fork() { mutex_.lock(); }
  void unlock_after_fork(bool in_child) {
    if (in_child) {
      // The refill thread does not exist in the child; the next request starts one. A waiter
      // that vanished in the fork may linger in the condition variable: start afresh.
      worker_started_ = false;
      std::fill(refill_wanted_.begin(), refill_wanted_.end(), false);
      new (&wake_) std::condition_variable();
    }
    mutex_.unlock();
  }

 private:
  static constexpr size_t kLowWater = 256;
  static constexpr size_t kRefill = 1024;

  void ensure_device(int device) {
    if (device >= static_cast<int>(free_.size())) {
      free_.resize(device + 1);
      refill_wanted_.resize(device + 1, false);
    }
  }

  // Called with mutex_ held.
  void request_refill(int device) {
    ensure_device(device);
    if (refill_wanted_[device]) return;
    refill_wanted_[device] = true;
    if (!worker_started_) {
      worker_started_ = true;
      std::thread([this] { refill_loop(); }).detach();  // the pool lives for the process
    }
    wake_.notify_one();
  }

  void refill_loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] {
        return std::find(refill_wanted_.begin(), refill_wanted_.end(), true) !=
               refill_wanted_.end();
      });
      const int device = static_cast<int>(
          std::find(refill_wanted_.begin(), refill_wanted_.end(), true) - refill_wanted_.begin());
      lock.unlock();
      std::vector<runtime::Event*> fresh;
      fresh.reserve(kRefill);
      try {
        for (size_t i = 0; i < kRefill; ++i) {
          fresh.push_back(create_timing_event(device));
        }
      } catch (...) {
        // The device cannot make more events now; record() creates them inline instead.
      }
      lock.lock();
      refill_wanted_[device] = false;
      free_[device].insert(free_[device].end(), fresh.begin(), fresh.end());
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::vector<runtime::Event*>> free_;
  std::vector<bool> refill_wanted_;
  bool worker_started_ = false;
  bool warmed_up_ = false;
};

struct StubEvent {
  runtime::Event* event;
  int device;
  uint64_t record_index;  // in the timeline, when its device time was not known at record()
};

constexpr uint64_t kNoRecord = UINT64_MAX;

// The log of record() calls. PyTorch reads the op's CPU start time right after record()
// returns, so appending must never stall (a vector's reallocation, a page's first touch):
// records go into fixed chunks, and a background thread prepares the next chunk, already
// touched, before it is needed.
class Timeline {
 public:
  // Logs `record`. On an asynchronous device its event may not have completed yet (device_ns
  // -1): pass it as `unresolved` and the returned index, and the device time is read from the
  // event before it is reused (resolve()) or when the log is read, whichever comes first.
  uint64_t add(const StubRecord& record, runtime::Event* unresolved) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (total_ >= kMaxRecords) {
      ++dropped_;
      return kNoRecord;
    }
    if (chunks_.empty() || used_ == kChunkRecords) {
      if (spare_) {
        chunks_.push_back(std::move(spare_));
      } else {
        chunks_.push_back(make_chunk());  // the prefetcher fell behind: rare
      }
      used_ = 0;
      request_spare();
    }
    chunks_.back()[used_++] = record;
    const uint64_t index = total_++;
    if (unresolved != nullptr) {
      unresolved_.emplace_back(index, unresolved);
      ++live_unresolved_;
    }
    return index;
  }

  // Reads the device time of record `index` from `event`, which is about to be reused.
  void resolve(uint64_t index, runtime::Event* event) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = std::lower_bound(unresolved_.begin(), unresolved_.end(),
                               std::make_pair(index, static_cast<runtime::Event*>(nullptr)));
    if (it != unresolved_.end() && it->first == index && it->second == event) resolve_entry(*it);
  }

  void lock_for_fork() { mutex_.lock(); }
  void unlock_after_fork(bool in_child) {
    if (in_child) {
      // The child's timeline is its own; its prefetch thread starts on the next request.
      chunks_.clear();
      unresolved_.clear();
      live_unresolved_ = 0;
      used_ = 0;
      total_ = 0;
      annotations_.clear();
      dropped_ = 0;
      want_spare_ = false;
      prefetcher_started_ = false;
      new (&wake_) std::condition_variable();
    }
    mutex_.unlock();
  }

  // Starts the prefetch thread and prepares the first chunk (at registration).
  void warm_up() {
    std::lock_guard<std::mutex> lock(mutex_);
    request_spare();
  }

  void annotate(Annotation annotation) {
    std::lock_guard<std::mutex> lock(mutex_);
    annotations_.push_back(std::move(annotation));
  }

  TimelineSnapshot snapshot() {
    TimelineSnapshot out;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& entry : unresolved_) {
        if (entry.second != nullptr) resolve_entry(entry);
      }
      out.records.reserve(total_);
      for (size_t c = 0; c < chunks_.size(); ++c) {
        const size_t n = c + 1 == chunks_.size() ? used_ : kChunkRecords;
        out.records.insert(out.records.end(), chunks_[c].get(), chunks_[c].get() + n);
      }
      out.annotations = annotations_;
      out.dropped_records = dropped_;
    }
    out.steady_to_cpu_offset_ns = steady_to_cpu_offset_ns();
    return out;
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    unresolved_.clear();
    live_unresolved_ = 0;
    chunks_.clear();
    used_ = 0;
    total_ = 0;
    annotations_.clear();
    dropped_ = 0;
  }

 private:
  static constexpr size_t kChunkRecords = 16384;
  using Chunk = std::unique_ptr<StubRecord[]>;

  // Called with mutex_ held.
  void resolve_entry(std::pair<uint64_t, runtime::Event*>& entry) {
    auto& rt = runtime::get();
    int64_t device_ns = -1;
    try {
      rt.synchronize_event(entry.second);
      device_ns = rt.event_host_time_ns(entry.second);
    } catch (...) {
      // Left unknown (-1): the trace shows the op without a device interval.
    }
    chunks_[entry.first / kChunkRecords][entry.first % kChunkRecords].device_ns = device_ns;
    entry.second = nullptr;
    if (--live_unresolved_ == 0) unresolved_.clear();
  }

  static Chunk make_chunk() {
    Chunk chunk(new StubRecord[kChunkRecords]);
    std::memset(static_cast<void*>(chunk.get()), 0, kChunkRecords * sizeof(StubRecord));
    return chunk;
  }

  // Called with mutex_ held.
  void request_spare() {
    want_spare_ = true;
    if (!prefetcher_started_) {
      prefetcher_started_ = true;
      std::thread([this] { prefetch(); }).detach();  // the timeline lives for the process
    }
    wake_.notify_one();
  }

  void prefetch() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return want_spare_; });
      want_spare_ = false;
      lock.unlock();
      Chunk chunk = make_chunk();
      lock.lock();
      if (!spare_) spare_ = std::move(chunk);
    }
  }

  static int64_t steady_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // The tightest of a few bracketed samples of (c10::getTime() - steady_clock).
  static int64_t steady_to_cpu_offset_ns() {
    int64_t best_width = INT64_MAX;
    int64_t offset = 0;
    for (int i = 0; i < 16; ++i) {
      const int64_t before = steady_ns();
      const int64_t cpu = c10::getTime();
      const int64_t after = steady_ns();
      if (after - before < best_width) {
        best_width = after - before;
        offset = cpu - (before + (after - before) / 2);
      }
    }
    return offset;
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Chunk> chunks_;
  size_t used_ = 0;
  size_t total_ = 0;
  Chunk spare_;
  bool want_spare_ = false;
  bool prefetcher_started_ = false;
  std::vector<Annotation> annotations_;
  uint64_t dropped_ = 0;
  // (record index, event) of records whose device time is not known yet, in index order.
  std::vector<std::pair<uint64_t, runtime::Event*>> unresolved_;
  size_t live_unresolved_ = 0;
};

SharedEventPool& event_pool() {
  static auto* pool = new SharedEventPool();  // stub events may be released at exit
  return *pool;
}

Timeline& the_timeline() {
  static auto* timeline = new Timeline();
  return *timeline;
}

std::atomic<uint64_t> g_record_failures{0};

thread_local std::vector<std::pair<std::string, int64_t>> tls_ranges;

class BrickProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
 public:
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    try {
      // The stamp is taken as early as possible: PyTorch reads the op's CPU end time right
      // before an end record, and its start time right after a start record.
      auto& rt = runtime::get();
      const int index = rt.current_device();
      const runtime::StreamId stream = rt.current_stream(index);
      if (async_runtime() && rt.is_capturing(index, stream)) [[unlikely]] {
        // Nothing may be recorded on a capturing stream: the op gets no device time.
        g_capture_skipped.fetch_add(1, std::memory_order_relaxed);
        if (device != nullptr) *device = static_cast<c10::DeviceIndex>(index);
        if (event != nullptr) event->reset();
        if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
        return;
      }
      runtime::Event* raw = event_pool().acquire(index);
      try {
        rt.record_event(raw, index, stream);
      } catch (...) {
        event_pool().release(index, raw);
        throw;
      }
      const int64_t now = c10::getTime();
      if (device != nullptr) *device = static_cast<c10::DeviceIndex>(index);
      if (cpu_ns != nullptr) *cpu_ns = now;
      // Known at once on the host runtime; on an asynchronous device, once the event completes.
      const int64_t device_ns = rt.event_host_time_ns(raw);
      const uint64_t record_index = the_timeline().add(
          StubRecord{at::RecordFunction::currentThreadId(), now, device_ns, index, stream},
          device_ns < 0 ? raw : nullptr);
      auto* stub = new StubEvent{raw, index, device_ns < 0 ? record_index : kNoRecord};
      *event = torch::profiler::impl::ProfilerVoidEventStub(stub, [](void* p) {
        auto* s = static_cast<StubEvent*>(p);
        if (s->record_index != kNoRecord) the_timeline().resolve(s->record_index, s->event);
        event_pool().release(s->device, s->event);
        delete s;
      });
    } catch (...) {
      g_record_failures.fetch_add(1, std::memory_order_relaxed);
      if (event != nullptr) event->reset();
      if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
    }
  }

  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* start,
                const torch::profiler::impl::ProfilerVoidEventStub* end) const override {
    if (start == nullptr || end == nullptr || !*start || !*end) return 0.0f;
    auto* a = static_cast<StubEvent*>(start->get());
    auto* b = static_cast<StubEvent*>(end->get());
    auto& rt = runtime::get();
    rt.synchronize_event(a->event);
    rt.synchronize_event(b->event);
    return static_cast<float>(rt.elapsed_ms(a->event, b->event) * 1000.0);  // microseconds
  }

  void mark(const char* name) const override { brick::profiler::mark(name); }
  void rangePush(const char* name) const override { brick::profiler::range_push(name); }
  void rangePop() const override {
    if (!tls_ranges.empty()) brick::profiler::range_pop();
  }

  bool enabled() const override { return true; }

  void onEachDevice(std::function<void(int)> op) const override {
    const int count = runtime::get().device_count();
    for (int index = 0; index < count; ++index) {
      c10::DeviceGuard guard(
          c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index)));
      op(index);
    }
  }

  void synchronize() const override {
    auto& rt = runtime::get();
    for (int index = 0; index < rt.device_count(); ++index) rt.synchronize_device(index);
  }
};

// Every lock the profiler's threads take, held across fork() so none is copied locked.
void prepare_fork() {
  prepare_observer_for_fork();
  event_pool().lock_for_fork();
  the_timeline().lock_for_fork();
}

void after_fork_in_parent() {
  the_timeline().unlock_after_fork(/*in_child=*/false);
  event_pool().unlock_after_fork(/*in_child=*/false);
  observer_after_fork_in_parent();
}

void after_fork_in_child() {
  the_timeline().unlock_after_fork(/*in_child=*/true);
  event_pool().unlock_after_fork(/*in_child=*/true);
  g_record_failures.store(0, std::memory_order_relaxed);
  observer_after_fork_in_child();
}

}  // namespace

void register_profiler_stubs() {
  static BrickProfilerStubs* stubs = [] {
    pthread_atfork(&prepare_fork, &after_fork_in_parent, &after_fork_in_child);
    // The event pool fills itself when first used (the first record(), at the start of a
    // profile): touching the runtime here would create it at import.
    auto* instance = new BrickProfilerStubs();  // PyTorch keeps the raw pointer for the process
    torch::profiler::impl::registerPrivateUse1Methods(instance);
    the_timeline().warm_up();
    return instance;
  }();
  (void)stubs;
}

TimelineSnapshot timeline() { return the_timeline().snapshot(); }

void clear_timeline() { the_timeline().clear(); }

void mark(const char* name) {
  TORCH_CHECK(name != nullptr && *name != '\0', "brick profiler: mark() needs a non-empty name");
  const int64_t now = c10::getTime();
  the_timeline().annotate(
      Annotation{name, at::RecordFunction::currentThreadId(), now, now, /*is_range=*/false});
}

void range_push(const char* name) {
  TORCH_CHECK(name != nullptr && *name != '\0',
              "brick profiler: range_push() needs a non-empty name");
  tls_ranges.emplace_back(name, c10::getTime());
}

void range_pop() {
  TORCH_CHECK(!tls_ranges.empty(),
              "brick profiler: range_pop() without a matching range_push() on this thread");
  auto [name, start] = std::move(tls_ranges.back());
  tls_ranges.pop_back();
  the_timeline().annotate(Annotation{std::move(name), at::RecordFunction::currentThreadId(), start,
                                     c10::getTime(), /*is_range=*/true});
}

}  // namespace brick::profiler
