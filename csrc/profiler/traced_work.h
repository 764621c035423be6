// The one traced device timer (DeviceTiming::Traced) under the profilers that read it: the
// registry's observer and the legacy profiler's stubs. It owns what they share: the process's
// work tracer (runtime/work_tracer.h), started while any of them traces and stopped with the
// last; waiting for the devices traced work ran on before draining; handing what the tracer
// delivered to every correlator that reads it (profiler/work_correlator.h: the registry's, and
// one per legacy profile, which outlives the profile while PyTorch holds its events); and telling
// work that another client of CUPTI took from work that was never queued. Each profiler marks
// its threads' work (runtime/work_marks.h) and asks its correlator for the work between marks.
//
// Plain C++ over the runtime; one lock (lock()) guards the correlators and the clients.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

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

  // Under lock(): `client` starts tracing on `rt`. The first client starts the tracer (what an
  // earlier tracing left undrained goes to the correlators first). Throws runtime::Error saying
  // why there is no tracer.
  void acquire(TracedClient client, runtime::Runtime& rt);
  // Under lock(): `client` traces no more. The last one stops the tracer, unless `keep_kinds`
  // (another profiler now uses CUPTI's activity kinds). What it traced stays to drain.
  void release(TracedClient client, bool keep_kinds) noexcept;
  bool holds(TracedClient client) const noexcept;
  bool any_client() const noexcept { return clients_ != 0; }

  // Under lock(): `correlator` is handed what the tracer delivers from now on, until detached
  // (the registry's from its profile's start to the resolution after its end).
  void attach(WorkCorrelator* correlator);
  void detach(WorkCorrelator* correlator) noexcept;

  // Traced work ran on `device`: settle() waits for it. Any thread, no lock.
  void note_device(int device) noexcept {
    const uint64_t bit = uint64_t{1} << device;
    if ((devices_.load(std::memory_order_relaxed) & bit) == 0) [[unlikely]]
      devices_.fetch_or(bit, std::memory_order_relaxed);
  }

  // Under lock(): waits for the devices traced work ran on, then hands what the tracer
  // delivered to every attached correlator. Returns false where brick launched work since the
  // tracer started and the tracer has delivered none: another client of CUPTI took its records, and
  // the work asked about is lost, not 0. Throws what the runtime throws.
  bool settle(runtime::Runtime& rt);

  // Under lock(): the registry's correlator.
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
  std::vector<WorkCorrelator*> attached_;
  // Drains the tracer into every correlator.
  void drain_into_correlators();
};

}  // namespace brick::profiler
