// One device-interval timer under the three profilers: the registry's observer (Event mode),
// the legacy profiler's stubs and torch.profiler's device activity. Each records timing events on
// the current stream of a device and reads them once the device has passed them; what that takes
// is written once, here:
//  - the capture guard: nothing is timed on a stream being captured into a CUDA graph (an event
//    recorded there can be neither queried nor timed); what is skipped is counted, per profiler;
//  - events: created and destroyed only here, counted per device (health's live events), pooled
//    per thread (EventPool) so the op path never creates one;
//  - reading an interval: its duration is the device's own measure (elapsed_ms) and its start is
//    placed on the host clock only where a timeline needs it, so two placements against
//    different clock references can never skew or invert it;
//  - the bound: queued intervals are read every kResolveEvery, and beyond kMaxOutstanding the
//    oldest is waited for, however long a profile runs.
// The three are thin adapters over it. (The stubs hand single events to PyTorch, which pairs
// them itself and may drop them on any thread: their events come from a process-wide depot,
// stub_event_pool, made through create_timing_event.)
#pragma once

#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <vector>

#include "runtime/runtime.h"

namespace brick::profiler {

// Device events the profiler holds, in every pool and in use, per device: reported by health()
// so a long run can show the figure stays bounded, and that a profile makes events (on CUDA,
// contexts) only on the devices it records on.
inline std::array<std::atomic<int64_t>, runtime::kMaxDevices> g_live_events{};

// Whether the runtime runs work asynchronously (CUDA; the host runtime with deferred
// completion): timing events may complete after the call that recorded them, and streams may be
// captured into CUDA graphs. Decided once, when first asked (after the runtime exists).
inline bool async_runtime() {
  static const bool is_async = runtime::get().asynchronous();
  return is_async;
}

// Who timed on a stream being captured, for the skip counts.
enum class TimingClient : uint8_t { Registry, LegacyStubs, DeviceActivity };

// Work not timed because its stream was being captured into a CUDA graph, per profiler, since
// the process started (a profile reports what it added: the count now minus the one at its
// start).
inline std::array<std::atomic<uint64_t>, 3> g_capture_skipped{};

inline uint64_t capture_skipped(TimingClient client) noexcept {
  return g_capture_skipped[static_cast<size_t>(client)].load(std::memory_order_relaxed);
}

// The capture guard: true, and counted for `client`, when `stream` of `device` is being captured
// into a CUDA graph, so that nothing must be timed there now.
inline bool skip_in_capture(runtime::Runtime& rt, int device, runtime::StreamId stream,
                            TimingClient client) {
  if (!rt.is_capturing(device, stream)) [[likely]]
    return false;
  g_capture_skipped[static_cast<size_t>(client)].fetch_add(1, std::memory_order_relaxed);
  return true;
}

// Queued intervals are read every kResolveEvery queued ones (a query per interval is not free);
// beyond kMaxOutstanding the oldest is waited for.
inline constexpr size_t kResolveEvery = 32;
inline constexpr size_t kMaxOutstanding = 4096;

// An interval between two timing events of one device: the device's own duration and, when it
// was asked to be placed, its start on the host's steady clock (-1 otherwise).
struct DeviceInterval {
  int64_t start_ns = -1;
  int64_t duration_ns = 0;
};

// Reads the interval from `start` to `end` (recorded on one device, in that order) once `end` has
// completed: waits for it when `wait`, else returns false while it has not. `place`: the start is
// placed on the host's steady clock too. `known_done`: the caller knows `end` has completed (a
// later event of its stream has), and nothing is asked of the device before reading it. Throws
// what the runtime throws.
inline bool read_interval(runtime::Runtime& rt, runtime::Event* start, runtime::Event* end,
                          bool wait, bool place, DeviceInterval* out, bool known_done = false) {
  if (!known_done && !rt.query_event(end)) {
    if (!wait) return false;
    rt.synchronize_event(end);
  }
  out->duration_ns = std::llround(rt.elapsed_ms(start, end) * 1e6);
  if (place) {
    out->start_ns = rt.event_host_time_ns(start);
    if (out->start_ns < 0) throw runtime::Error("brick: a completed event has no host time");
  }
  return true;
}

inline runtime::Event* create_timing_event(int device) {
  runtime::Event* event = runtime::get().create_event(device, /*enable_timing=*/true);
  g_live_events[device].fetch_add(1, std::memory_order_relaxed);
  return event;
}

inline void destroy_timing_event(int device, runtime::Event* event) noexcept {
  runtime::get().destroy_event(event);
  g_live_events[device].fetch_sub(1, std::memory_order_relaxed);
}

// A thread's pool of timing events, per device. An event in use may mark the same point of a
// stream for several intervals (nested ops that start at one first kernel, or end with nothing
// queued between their ends): share() takes another reference (counted in the event itself, so
// both calls are O(1)), and release() returns the event to the pool when its last one goes.
class EventPool {
 public:
  EventPool() = default;
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  ~EventPool() {
    for (size_t device = 0; device < free_.size(); ++device) {
      for (runtime::Event* event : free_[device]) {
        destroy_timing_event(static_cast<int>(device), event);
      }
    }
  }

  runtime::Event* acquire(int device) {
    if (device >= static_cast<int>(free_.size())) free_.resize(device + 1);
    auto& events = free_[device];
    if (events.empty()) {
      ++created_;
      return create_timing_event(device);
    }
    runtime::Event* event = events.back();
    events.pop_back();
    return event;
  }

  // One more reference to `event`, which is in use (acquired, not yet released).
  static void share(runtime::Event* event) noexcept { ++event->extra_refs; }

  // Drops one reference to `event`; the last one returns it to the pool.
  void release(int device, runtime::Event* event) {
    if (event->extra_refs > 0) [[unlikely]] {
      --event->extra_refs;
      return;
    }
    if (device >= static_cast<int>(free_.size())) free_.resize(device + 1);
    free_[device].push_back(event);
  }

  bool has_free(int device) const noexcept {
    return device < static_cast<int>(free_.size()) && !free_[device].empty();
  }

  size_t created() const noexcept { return created_; }

 private:
  std::vector<std::vector<runtime::Event*>> free_;
  size_t created_ = 0;
};

}  // namespace brick::profiler
