// Device activity: what brick queued on its devices while an activity profiler recorded, with
// when each launch ran on the host and when its work ran on the device. The recorder is the
// launch observer (runtime/launch_observer.h) that torch.profiler's brick plugin installs; plain
// C++ (the runtime and the standard library), so GoogleTest checks it alone.
//
// Clocks: every time handed out is Unix-epoch nanoseconds (std::chrono::system_clock, which is
// what c10::getTime() and PyTorch's profiler timestamps read on Linux). Device times come from
// runtime events, stamped in steady_clock nanoseconds, converted with an offset measured when
// the activities are collected. On a synchronous runtime (the host's: work runs on the
// launching thread) no event is needed: the clock read around the work is its device time.
#pragma once

#include <cstdint>
#include <vector>

#include "profiler/host_clock.h"
#include "runtime/launch_observer.h"
#include "runtime/runtime.h"

namespace brick::profiler {

struct DeviceActivity {
  const char* name;  // the op that launched the work, e.g. "aten::mm"
  runtime::LaunchKind kind;
  int device;
  int64_t stream;
  int64_t thread_id;        // the launching thread (Linux thread id)
  uint64_t correlation;     // the launching CPU op's profiler correlation id; 0 if none
  int64_t launch_begin_ns;  // on the host: brick starts preparing the launch
  int64_t launch_end_ns;    // on the host: the kernel is queued
  int64_t start_ns;         // on the device
  int64_t end_ns;
  uint64_t bytes = 0;      // collectives: the bytes this rank contributed
  int32_t group_size = 0;  // collectives: the group's size
};

struct CollectedActivities {
  // In launch order per thread, threads one after another; a collective on the thread that saw
  // it complete, in completion order.
  std::vector<DeviceActivity> activities;
  uint64_t capture_skipped = 0;  // launches on a stream being captured into a CUDA graph
  uint64_t failed = 0;           // launches whose events could not be recorded or read
};

class ActivityRecorder final : public runtime::LaunchObserver {
 public:
  static ActivityRecorder& instance();

  // Starts recording: forgets what an earlier recording left uncollected and installs this
  // recorder as the launch observer.
  void start();
  // Stops recording (uninstalls the observer). Launches already under way still complete.
  void stop();
  bool recording() const noexcept;
  // Everything recorded since start(), device times resolved (waiting for device work that has
  // not completed) and converted to Unix-epoch ns; the events go back to the pools.
  CollectedActivities collect();

  // The calling thread's innermost profiled CPU op, as the activity profiler pushes and pops
  // them (torch.profiler does it on the op's own thread).
  static void push_correlation(uint64_t id);
  static void pop_correlation() noexcept;
  static uint64_t current_correlation() noexcept;

  void begin(runtime::Launch& launch) noexcept override;
  void queue(runtime::Launch& launch) noexcept override;
  void end(runtime::Launch& launch) noexcept override;
  void collective_done(const runtime::Launch& launch, int64_t device_ns = -1) noexcept override;

 private:
  ActivityRecorder() = default;
};

}  // namespace brick::profiler
