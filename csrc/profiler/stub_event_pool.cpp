// The stub event pool: per-thread caches over a shared depot with a refill thread.
#include "profiler/stub_event_pool.h"

#include <algorithm>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "profiler/device_timer.h"
#include "profiler/fork.h"
#include "runtime/per_thread.h"

namespace brick::profiler {

namespace {

constexpr size_t kBatch = 256;             // slots moved between a cache and the depot at once
constexpr size_t kMaxCached = 2 * kBatch;  // per device in one thread's cache
constexpr size_t kLowWater = 2 * kBatch;   // the depot asks for a refill below this
constexpr size_t kRefill = 1024;           // slots the refill thread adds per request

StubSlot* new_slot(int device) {
  auto slot = std::make_unique<StubSlot>();
  slot->event = create_timing_event(device);
  slot->device = device;
  return slot.release();
}

class Depot {
 public:
  // Moves up to kBatch slots of `device` to `out` (capacity reserved by the caller) and returns
  // how many.
  size_t take(int device, std::vector<StubSlot*>& out) {
    std::lock_guard<std::mutex> lock(mutex_);
    ensure_device(device);
    if (!warmed_up_[device]) [[unlikely]] {
      // The first take for this device (its first record() of the process): a batch now, so
      // that the ops right after it do not each create an event while the refill thread
      // starts, and its supply filled in the background from now on. Only devices a profile
      // records on get events: on CUDA an event on a device needs a context there (~0.5 GB per
      // GPU and rank under torchrun, on GPUs the process never uses).
      warmed_up_[device] = true;
      try {
        while (free_[device].size() < kBatch) free_[device].push_back(new_slot(device));
      } catch (...) {
        // The device cannot make more events now; record() creates them as needed instead.
      }
    }
    auto& free = free_[device];  // (after every resize of free_)
    const size_t n = std::min(kBatch, free.size());
    out.insert(out.end(), free.end() - n, free.end());
    free.resize(free.size() - n);
    if (free.size() < kLowWater) request_refill(device);
    return n;
  }

  // Moves the last `n` slots of `from` (all of one device) here.
  void give(std::vector<StubSlot*>& from, size_t n) {
    if (n == 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    ensure_device(from.back()->device);
    auto& free = free_[from.back()->device];
    free.insert(free.end(), from.end() - n, from.end());
    from.resize(from.size() - n);
  }

  void give_one(StubSlot* slot) {
    std::lock_guard<std::mutex> lock(mutex_);
    ensure_device(slot->device);
    free_[slot->device].push_back(slot);
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
  // Called with mutex_ held.
  void ensure_device(int device) {
    if (device >= static_cast<int>(free_.size())) {
      free_.resize(device + 1);
      refill_wanted_.resize(device + 1, false);
      warmed_up_.resize(device + 1, false);
    }
  }

  // Called with mutex_ held. If the thread cannot be started, slots are created as needed.
  void request_refill(int device) {
    ensure_device(device);
    if (refill_wanted_[device]) return;
    if (!worker_started_) {
      try {
        std::thread([this] { refill_loop(); }).detach();  // the depot lives for the process
        worker_started_ = true;
      } catch (const std::system_error&) {
        return;
      }
    }
    refill_wanted_[device] = true;
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
      std::vector<StubSlot*> fresh;
      try {
        fresh.reserve(kRefill);
        for (size_t i = 0; i < kRefill; ++i) fresh.push_back(new_slot(device));
      } catch (...) {
        // The device cannot make more events now; record() creates them as needed instead.
      }
      lock.lock();
      refill_wanted_[device] = false;
      try {
        free_[device].insert(free_[device].end(), fresh.begin(), fresh.end());
      } catch (const std::bad_alloc&) {
        // Out of memory: these slots are lost (they stay counted in live events).
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::vector<StubSlot*>> free_;  // per device
  std::vector<bool> refill_wanted_;
  std::vector<bool> warmed_up_;  // per device
  bool worker_started_ = false;
};

Depot& depot() {
  static auto* instance = new Depot();  // stub events may be released at exit
  return *instance;
}

// A thread's free slots, per device, each list with room for kMaxCached reserved up front.
struct ThreadCache {
  std::vector<std::vector<StubSlot*>> free;

  ThreadCache() = default;
  ThreadCache(const ThreadCache&) = delete;
  ThreadCache& operator=(const ThreadCache&) = delete;
  ~ThreadCache();

  // The list for `device`, created (with its room) if needed. May throw std::bad_alloc.
  std::vector<StubSlot*>& list(int device) {
    if (device >= static_cast<int>(free.size())) {
      const size_t old = free.size();
      free.resize(device + 1);
      for (size_t d = old; d < free.size(); ++d) free[d].reserve(kMaxCached);
    }
    return free[device];
  }
};

ThreadCache::~ThreadCache() {
  for (auto& slots : free) {
    try {
      depot().give(slots, slots.size());
    } catch (const std::bad_alloc&) {
      // Out of memory: these slots are lost (they stay counted in live events).
    }
  }
}

// The calling thread's cache; none once it was destroyed (thread exit): releases then go to the
// depot.
ThreadCache* this_thread_cache() { return runtime::PerThread<ThreadCache>::get(); }

[[gnu::noinline]] StubSlot* acquire_slow(int device) {
  if (ThreadCache* cache = this_thread_cache()) {
    auto& slots = cache->list(device);
    if (depot().take(device, slots) > 0) {
      StubSlot* slot = slots.back();
      slots.pop_back();
      return slot;
    }
  } else {
    std::vector<StubSlot*> one;
    one.reserve(kBatch);
    if (depot().take(device, one) > 0) {
      StubSlot* slot = one.back();
      one.pop_back();
      depot().give(one, one.size());
      return slot;
    }
  }
  return new_slot(device);  // the refill thread fell behind
}

[[gnu::noinline]] void release_slow(StubSlot* slot) noexcept {
  try {
    if (ThreadCache* cache = this_thread_cache()) {
      auto& slots = cache->list(slot->device);
      if (slots.size() >= kMaxCached) depot().give(slots, kBatch);
      slots.push_back(slot);
    } else {
      depot().give_one(slot);
    }
  } catch (const std::bad_alloc&) {
    // Out of memory: the slot is lost (it stays counted in live events).
  }
}

}  // namespace

StubSlot* acquire_stub_slot(int device) {
  ThreadCache* cache = runtime::PerThread<ThreadCache>::get_if_made();
  if (cache != nullptr && device < static_cast<int>(cache->free.size())) [[likely]] {
    auto& slots = cache->free[device];
    if (!slots.empty()) [[likely]] {
      StubSlot* slot = slots.back();
      slots.pop_back();
      return slot;
    }
  }
  return acquire_slow(device);
}

void release_stub_slot(StubSlot* slot) noexcept {
  ThreadCache* cache = runtime::PerThread<ThreadCache>::get_if_made();
  if (cache != nullptr && slot->device < static_cast<int>(cache->free.size())) [[likely]] {
    auto& slots = cache->free[slot->device];
    if (slots.size() < kMaxCached) [[likely]] {
      slots.push_back(slot);  // within the room reserved: no allocation
      return;
    }
  }
  release_slow(slot);
}

// Other threads' caches do not exist in a forked child: their slots are left there.
void prepare_stub_pool_for_fork() { depot().lock_for_fork(); }
void stub_pool_after_fork(bool in_child) { depot().unlock_after_fork(in_child); }

}  // namespace brick::profiler
