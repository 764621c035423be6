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

namespace detail {
inline std::atomic<LaunchObserver*> g_launch_observer{nullptr};
}  // namespace detail

// The installed observer, or nullptr (the common case: one acquire load per launch, a plain load
// on x86). An observer must stay alive for the process once installed: a launch that read it may
// still be calling it.
inline LaunchObserver* launch_observer() noexcept {
  return detail::g_launch_observer.load(std::memory_order_acquire);
}

inline void set_launch_observer(LaunchObserver* observer) noexcept {
  detail::g_launch_observer.store(observer, std::memory_order_release);
}

// Brick's registry timing ops at their kernels (`profile(ops="kernels")`): called on the
// launching thread around every kernel and copy brick launches (not collectives, which the
// distributed layer times), outside the launch observer's begin() and end(), also when the
// kernel threw; `name` as Launch::name. Neither may throw. Installed only while the registry
// records, so a launch pays one atomic load for it otherwise.
struct KernelTimer {
  void (*begin)(const char* name) noexcept;
  void (*end)() noexcept;
};

namespace detail {
inline std::atomic<const KernelTimer*> g_kernel_timer{nullptr};
}  // namespace detail

// The installed timer, or nullptr. A timer must stay alive for the process once installed.
inline const KernelTimer* kernel_timer() noexcept {
  return detail::g_kernel_timer.load(std::memory_order_acquire);
}

inline void set_kernel_timer(const KernelTimer* timer) noexcept {
  detail::g_kernel_timer.store(timer, std::memory_order_release);
}

// Called on the launching thread right before the backend queues work on `device`'s current
// stream (a kernel, a copy, a collective), whether or not a launch observer is installed. The
// registry installs one while it times bricks by device events, so that an op's device interval
// starts at its first work: an op that queues none (a view) records no event. Must not throw, and
// stays callable once installed (a launch that read it may still be calling it).
using QueueHook = void (*)(DeviceIndex device) noexcept;

namespace detail {
inline std::atomic<QueueHook> g_queue_hook{nullptr};
}  // namespace detail

inline QueueHook queue_hook() noexcept {
  return detail::g_queue_hook.load(std::memory_order_acquire);
}

inline void set_queue_hook(QueueHook hook) noexcept {
  detail::g_queue_hook.store(hook, std::memory_order_release);
}

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

// What the backend calls right before it queues work on `device`: the count, then the hook.
inline void announce_queue(DeviceIndex device) noexcept {
  count_device_work();
  if (QueueHook hook = queue_hook(); hook != nullptr) [[unlikely]]
    hook(device);
}

}  // namespace brick::runtime
