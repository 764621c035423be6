// The observer's traced timing (DeviceTiming::Traced): each brick marks its thread's work where
// it opens and closes (runtime/work_marks.h); closed, it waits with its parent's id until a
// resolution (a snapshot, or the bound on closed bricks) has waited for the devices and drained
// the tracer, and the correlator (work_correlator.h) gives it the work its thread queued between
// its marks, plus what other threads' bricks nested in it queued.
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "profiler/device_timer.h"
#include "profiler/observer_state.h"
#include "profiler/traced_work.h"
#include "runtime/runtime.h"
#include "runtime/work_marks.h"

namespace brick::profiler::detail {

namespace {

// Closed bricks held beyond this (on one thread) are resolved at once, waiting for the devices:
// a profile that never takes a snapshot stays bounded.
constexpr size_t kMaxClosedIntervals = 1 << 16;
// On a synchronous runtime (the host's) a closed brick's work has all been traced when it
// closes, so resolving waits for nothing: done every this many, the records stay few and their
// memory warm (fresh pages cost ~10 us each on a VM).
constexpr size_t kResolveSynchronousEvery = 1 << 12;

uint64_t tag_of(NodeId node, uint32_t shape) noexcept { return uint64_t{node} << 32 | shape; }
NodeId node_of(uint64_t tag) noexcept { return static_cast<NodeId>(tag >> 32); }
uint32_t shape_of(uint64_t tag) noexcept { return static_cast<uint32_t>(tag); }

runtime::WorkTracer& tracer() noexcept {
  return *g_observer.tracer.load(std::memory_order_relaxed);
}

}  // namespace

// Opens `frame`'s interval (its device and node set), inside `parent_interval` (0: none). A
// brick on a stream being captured into a CUDA graph is skipped, as in Event mode: its work
// runs only at replay.
void start_traced_timing(runtime::Runtime& rt, ThreadState& state, Frame& frame,
                         uint64_t parent_interval, bool parent_elsewhere) {
  if (skip_in_capture(rt, frame.device, rt.current_stream(frame.device), TimingClient::Registry))
      [[unlikely]] {
    frame.node = kSkippedInCapture;
    return;
  }
  TracedWork::instance().note_device(frame.device);
  frame.start_ns = registry::Registry::now_ns();  // its host time, if it queues no work
  frame.interval = g_observer.next_interval.fetch_add(1, std::memory_order_relaxed);
  frame.parent_interval = parent_interval;
  frame.parent_elsewhere = parent_elsewhere;
  frame.open_mark = runtime::mark_work(tracer());
  if (frame.open_mark.thread == 0) [[unlikely]]
    throw runtime::Error("brick: this thread is beyond the threads traced timing can mark");
  if (!state.marking) {  // its outermost brick: nothing of this thread's from now is below it
    state.marking = true;
    state.traced_floor.store(segment_interval(frame.open_mark.thread, frame.open_mark.segment),
                             std::memory_order_release);
  }
}

WorkMark close_traced_mark(ThreadState& state) noexcept {
  const WorkMark mark = runtime::mark_work(tracer());
  if (state.stack.empty()) state.marking = false;  // no later mark of its is below this one
  return mark;
}

void publish_traced_floor(ThreadState& state, const WorkMark& mark) noexcept {
  if (mark.thread == 0) return;
  state.traced_floor.store(segment_interval(mark.thread, mark.segment), std::memory_order_release);
}

// Queues `frame`'s closed interval for resolution.
void finish_traced_timing(ThreadState& state, const Frame& frame, uint64_t close_segment) {
  size_t held = 0;
  {
    std::lock_guard<std::mutex> lock(state.pending.mutex);
    state.pending.closed.push_back({frame.interval, frame.parent_interval,
                                    tag_of(frame.node, frame.shape), frame.open_mark, close_segment,
                                    frame.parent_elsewhere});
    held = state.pending.closed.size();
    state.pending.closed_size.store(held, std::memory_order_relaxed);
  }
  const size_t bound = g_observer.async.load(std::memory_order_relaxed) ? kMaxClosedIntervals
                                                                        : kResolveSynchronousEvery;
  if (held >= bound) [[unlikely]]
    resolve_traced(TracedResolution::Bound);
}

namespace {

// Where a resolution may fold each thread's segments (the correlator forgets what no mark will
// ask about again): the live threads' floors, and the threads that exited.
struct Floors {
  std::unordered_map<uint32_t, uint64_t> live;
  std::vector<uint32_t> exited;
};

// Every closed brick of every thread (and of threads that exited), taken at one instant: all
// threads' pending locks are held together, so a brick whose close is taken has every brick
// that closed before it taken too (the autograd engine's children before the owner's parent).
// The floors are read under the same locks: a thread publishes a floor only after queueing the
// bricks closed below it, so a brick not taken now has its marks above its thread's floor.
std::vector<ClosedInterval> take_closed(Floors* floors) {
  std::vector<ClosedInterval> closed;
  std::lock_guard<std::mutex> states(g_observer.states_mutex);
  std::vector<std::unique_lock<std::mutex>> locks;
  locks.reserve(g_observer.states.size());
  for (ThreadState* state : g_observer.states) locks.emplace_back(state->pending.mutex);
  for (const ThreadState* state : g_observer.states) {
    const uint64_t floor = state->traced_floor.load(std::memory_order_acquire);
    if (floor != 0) {
      floors->live[static_cast<uint32_t>(floor >> kSegmentBits)] = floor & kSegmentMask;
    }
  }
  floors->exited.swap(g_observer.exited_traced_threads);
  closed.swap(g_observer.exited_closed);
  for (ThreadState* state : g_observer.states) {
    state->pending.closed.append_to(closed);
    state->pending.closed.clear();
    state->pending.closed_size.store(0, std::memory_order_relaxed);
  }
  return closed;
}

}  // namespace

void resolve_traced(TracedResolution why) {
  TracedWork& traced = TracedWork::instance();
  std::lock_guard<std::mutex> resolving(traced.lock());
  if (g_observer.tracer.load(std::memory_order_relaxed) == nullptr) return;  // never traced
  // On an asynchronous device, work queued by threads still running may be in flight when the
  // tracer is flushed, and its records would come incomplete (lost): while the traced profile
  // runs, its bricks resolve only when too many are held; a snapshot resolves them once the
  // profile has ended. (The host's work is traced by the time its brick closes.)
  const bool running = g_observer.enabled.load(std::memory_order_acquire);
  const bool asynchronous = g_observer.async.load(std::memory_order_relaxed);
  if (asynchronous && running && why == TracedResolution::Snapshot) return;
  std::vector<ClosedInterval> closed;
  std::vector<ResolvedInterval> resolved;
  Floors floors;
  WorkCorrelator& correlator = traced.correlator();
  bool drained = false;
  try {
    closed = take_closed(&floors);
    if (!closed.empty()) {
      drained = true;
      if (traced.settle(runtime::get())) {
        correlator.resolve(closed, &resolved);
      } else {
        // Brick launched work and the tracer delivered none: another client took its records.
        g_observer.traced_bricks_lost += closed.size();
        closed.clear();
      }
    }
  } catch (...) {  // the devices or the tracer failed, or memory ran out: these go untimed
    g_observer.timing_failures.fetch_add(closed.size(), std::memory_order_relaxed);
    return;
  }
  try {
    for (const uint32_t thread : floors.exited) correlator.fold(thread, kNoFloor);
    for (const auto& [thread, floor] : floors.live) correlator.fold(thread, floor);
    // The calls of what was folded have delivered their work, if the devices were waited for
    // since. (On the host no work is in flight when its records are drained; on a device, none
    // is once no profile traces.)
    if (drained) correlator.settle(/*all_delivered=*/!asynchronous || !traced.any_client());
  } catch (...) {  // out of memory: what it would have forgotten stays (nothing is lost)
  }
  // Once the profile has ended, this resolution took every brick it closed: its correlator is
  // handed no more.
  if (!running) traced.detach(&correlator);
  registry::Registry& registry = brick_registry();
  const int64_t now = registry::Registry::now_ns();
  for (const ResolvedInterval& interval : resolved) {
    record_brick(registry, node_of(interval.tag), shape_of(interval.tag), interval.device_ns, now);
  }
}

void discard_traced() {
  std::lock_guard<std::mutex> resolving(TracedWork::instance().lock());
  Floors unused;
  (void)take_closed(&unused);
}

}  // namespace brick::profiler::detail
