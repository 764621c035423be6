// The one traced device timer (DeviceTiming::Traced) under the profilers that read it: the
// registry's observer and the legacy profiler's stubs. It owns what they share: the process's
// work tracer (runtime/work_tracer.h), started while any of them traces and stopped with the
// last; the correlator its records go to (profiler/work_correlator.h), which both read; waiting
// for the devices traced work ran on before draining; and telling work that another client of
// CUPTI took from work that was never queued. Each profiler marks its threads' work
// (runtime/work_marks.h) and asks the correlator for the work between its marks.
//
// Plain C++ over the runtime; one lock (lock()) guards the correlator and the clients.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "profiler/work_correlator.h"
#include "runtime/runtime.h"
#include "runtime/work_tracer.h"

namespace brick::profiler {

enum class TracedClient : uint8_t { Registry, LegacyStubs };

class TracedWork {
 public:
  static TracedWork& instance();

  // The process's tracer for `rt`'s backing device, made once and kept for the process (CUPTI
  // may call back until exit), or nullptr with the reason in `why`.
  static runtime::WorkTracer* tracer_for(const runtime::Runtime& rt, std::string* why);

  // The tracer while any client traces (nullptr otherwise): what their marks go to.
  runtime::WorkTracer* tracer() const noexcept { return tracer_.load(std::memory_order_acquire); }

  // Under lock(): `client` starts tracing on `rt`. The first client starts the tracer and finds
  // the correlator empty; one that joins a running tracer shares what it holds. Throws
  // runtime::Error saying why there is no tracer.
  void acquire(TracedClient client, runtime::Runtime& rt);
  // Under lock(): `client` is done. The last one stops the tracer, unless `keep_kinds` (another
  // profiler now uses CUPTI's activity kinds). The correlator keeps what it holds until the next
  // first client.
  void release(TracedClient client, bool keep_kinds) noexcept;
  bool holds(TracedClient client) const noexcept;
  bool any_client() const noexcept { return clients_ != 0; }

  // Traced work ran on `device`: settle() waits for it. Any thread, no lock.
  void note_device(int device) noexcept {
    const uint64_t bit = uint64_t{1} << device;
    if ((devices_.load(std::memory_order_relaxed) & bit) == 0) [[unlikely]]
      devices_.fetch_or(bit, std::memory_order_relaxed);
  }

  // Under lock(): waits for the devices traced work ran on, then hands what the tracer
  // delivered to the correlator. Returns false where brick launched work since the tracer
  // started and the tracer has delivered none: another client of CUPTI took its records, and
  // the work asked about is lost, not 0. Throws what the runtime throws.
  bool settle(runtime::Runtime& rt);

  // Under lock().
  WorkCorrelator& correlator() noexcept { return correlator_; }

  std::mutex& lock() noexcept { return mutex_; }

  // In a forked child: the lock renewed and everything held forgotten (the parent's).
  void after_fork_in_child() noexcept;

 private:
  TracedWork() = default;

  std::mutex mutex_;
  std::atomic<runtime::WorkTracer*> tracer_{nullptr};
  runtime::WorkTracer* started_ = nullptr;  // the tracer the clients hold
  uint8_t clients_ = 0;                     // bit per TracedClient
  std::atomic<uint64_t> devices_{0};        // bit d: traced work ran on device d
  bool delivered_ = false;                  // the tracer has delivered work since it started
  WorkCorrelator correlator_;
};

}  // namespace brick::profiler
