// The work brick queues on its devices, for activity profilers (torch.profiler's brick device
// track): the backend announces every kernel and copy it launches through these hooks, and a
// profiler installs an observer while it records. Plain C++, like the rest of the runtime layer,
// so the backend (which launches) and the profiler (which observes) meet here without depending
// on each other.
#pragma once

#include <atomic>
#include <cstdint>

#include "runtime/runtime.h"

namespace brick::runtime {

// Collective: a collective of brick's c10d backend on brick memory, run by its engine (gloo's
// threads, NCCL's stream) and timed from its enqueue to its completion.
enum class LaunchKind : uint8_t { Kernel, Memcpy, Collective };

// The track collectives are drawn on, beside a device's streams (NCCL runs on its own stream;
// gloo on its own threads): one id no runtime gives a stream.
inline constexpr StreamId kCollectiveStream = 1 << 20;

// One launch, from the launching thread's point of view. The backend fills `name`, `kind` and
// (before queue()) `device`; the rest belongs to the observer, between its calls.
struct Launch {
  const char* name = nullptr;  // the op, e.g. "aten::mm"; must outlive the process's profiles
  LaunchKind kind = LaunchKind::Kernel;
  DeviceIndex device = -1;
  // Collectives: the bytes this rank contributed, and the group's size.
  uint64_t bytes = 0;
  int32_t group_size = 0;
  // Observer state.
  bool recorded = false;
  uint64_t correlation = 0;
  int64_t begin_ns = 0;
  int64_t queued_ns = 0;
  int64_t thread_id = 0;  // the launching thread
  StreamId stream = 0;
  Event* start_event = nullptr;
};

// Called on the launching thread: begin() before brick prepares the arguments, queue() right
// before the backing device's kernel is queued, end() once it is (on the host runtime: has run),
// also when the kernel threw. A collective gets begin() and queue() on the enqueuing thread
// (around the engine's call), then collective_done() on whichever thread sees its engine
// complete it, in place of end(). None may throw.
class LaunchObserver {
 public:
  virtual void begin(Launch& launch) noexcept = 0;
  virtual void queue(Launch& launch) noexcept = 0;
  virtual void end(Launch& launch) noexcept = 0;
  // `device_ns`: the collective's time on the device from its enqueue, where the device
  // measured it (CUDA events); -1: it completes now (gloo, seen complete on its thread).
  virtual void collective_done(const Launch& launch, int64_t device_ns = -1) noexcept = 0;

 protected:
  ~LaunchObserver() = default;
};

// Brick's registry timing ops at their kernels (`profile(ops="kernels")`): called on the
// launching thread around every kernel and copy brick launches (not collectives, which the
// distributed layer times), outside the launch observer's begin() and end(), also when the
// kernel threw; `name` as Launch::name. Neither may throw. Installed only while the registry
// records.
struct KernelTimer {
  void (*begin)(const char* name) noexcept;
  void (*end)() noexcept;
};

// Called on the launching thread right before the backend queues work on `device`'s current
// stream (a kernel, a copy, a collective), whether or not a launch observer is installed. The
// registry installs one while it times bricks by device events, so that an op's device interval
// starts at its first work: an op that queues none (a view) records no event. Must not throw.
using QueueHook = void (*)(DeviceIndex device) noexcept;

// A work tracer that sees brick's launches (the host's, runtime/work_tracer.h; CUPTI sees the
// device's work itself): called on the launching thread right before a kernel or copy is queued,
// and once it is (on the host runtime: has run), also when it threw. Neither may throw.
struct LaunchTrace {
  void (*queued)() noexcept;
  void (*done)() noexcept;
};

// Everything a launch calls out to, read with one acquire load per launch (a plain load on
// x86); nullptr where none is installed (the common case). A table is immutable once published:
// installing or removing a hook publishes another. What a table names must stay callable for
// the process once installed: a launch that read the table may still be calling it.
struct LaunchHooks {
  LaunchObserver* observer = nullptr;
  const KernelTimer* kernel_timer = nullptr;
  QueueHook queue_hook = nullptr;
  const LaunchTrace* trace = nullptr;
  bool operator==(const LaunchHooks&) const = default;
};

namespace detail {
inline constexpr LaunchHooks kNoLaunchHooks{};
inline std::atomic<const LaunchHooks*> g_launch_hooks{&kNoLaunchHooks};
}  // namespace detail

// The installed hooks: the table a launch reads once, at its start, and uses to its end.
inline const LaunchHooks& launch_hooks() noexcept {
  return *detail::g_launch_hooks.load(std::memory_order_acquire);
}

// Whether `hooks` calls out to anything. Tables are interned and the empty one is a single
// object, so a launch with no hook installed pays one compare.
inline bool any_hook(const LaunchHooks& hooks) noexcept {
  return &hooks != &detail::kNoLaunchHooks;
}

// One hook, for code that calls no other (a launch reads launch_hooks() instead).
inline LaunchObserver* launch_observer() noexcept { return launch_hooks().observer; }
inline const KernelTimer* kernel_timer() noexcept { return launch_hooks().kernel_timer; }

// Each publishes a table with that one hook replaced (nullptr: removed), the others as they are.
// Safe from any thread; a launch already under way keeps the table it read.
void set_launch_observer(LaunchObserver* observer) noexcept;
void set_kernel_timer(const KernelTimer* timer) noexcept;
void set_queue_hook(QueueHook hook) noexcept;
void set_launch_trace(const LaunchTrace* trace) noexcept;

// The brick work the calling thread has started: every kernel, copy and collective it queued on
// a brick device and every brick allocation it made. Profilers read it around an op: an op
// during which it did not move ran no brick work (a CPU op, or one that only reads or aliases
// brick tensors), so it has no device time. Always counted: one thread-local increment per
// launch or allocation.
namespace detail {
[[gnu::tls_model("initial-exec")]] inline constinit thread_local uint64_t tls_device_work = 0;
}  // namespace detail

inline void count_device_work() noexcept { ++detail::tls_device_work; }
inline uint64_t device_work_count() noexcept { return detail::tls_device_work; }

// Code torch.compile generated for brick (Inductor's kernels) computes on brick memory without
// brick's launch path, so the count above cannot see its work: while a thread runs a compiled
// brick graph (the depth below is above 0), what it records is brick work.
namespace detail {
[[gnu::tls_model("initial-exec")]] inline constinit thread_local int tls_compiled_depth = 0;
}  // namespace detail

inline void enter_compiled_code() noexcept { ++detail::tls_compiled_depth; }
inline void exit_compiled_code() noexcept {
  if (detail::tls_compiled_depth > 0) --detail::tls_compiled_depth;
}
inline bool in_compiled_code() noexcept { return detail::tls_compiled_depth > 0; }

// The brick work count as a profiler reads it at an op's open and close: inside compiled brick
// code, whose work the count cannot see, every reading counts as work, so that the op between
// two readings keeps its device time.
inline uint64_t device_work_seen() noexcept {
  if (in_compiled_code()) [[unlikely]]
    count_device_work();
  return device_work_count();
}

// The launches of the calling thread that a work tracer (LaunchTrace) has been told are queued
// and not yet done: while one is, work marks (runtime/work_marks.h) cannot know whether more of
// its work is coming, so each starts a new segment.
namespace detail {
[[gnu::tls_model("initial-exec")]] inline constinit thread_local uint32_t tls_traced_launches = 0;
}  // namespace detail

inline bool traced_launch_in_flight() noexcept { return detail::tls_traced_launches != 0; }

// What the backend calls right before it queues work on `device`: the count, then the hook of
// the table its launch read.
inline void announce_queue(const LaunchHooks& hooks, DeviceIndex device) noexcept {
  count_device_work();
  if (any_hook(hooks) && hooks.queue_hook != nullptr) [[unlikely]]
    hooks.queue_hook(device);
}

}  // namespace brick::runtime
