// The observer's asynchronous timing (CUDA; the host runtime with deferred completion): an op's
// device interval between events on its stream, started at its first queued work (the queue
// hook), shared between nested ops that start or end at one point of the stream, queued as a
// pending pair and read once the device has passed it.
#include <mutex>

#include "profiler/device_timer.h"
#include "profiler/observer_state.h"
#include "runtime/runtime.h"

namespace brick::profiler::detail {

// Resolves pairs from the front of `state`'s queue: every one when `wait_all`, else those
// complete (and the oldest beyond kMaxPending). Called with state.pending.mutex held; a pair
// that cannot be timed is dropped and counted, never retried forever.
void resolve_locked(ThreadState& state, bool by_owner, bool wait_all) {
  PendingQueue& queue = state.pending;
  if (queue.pairs.empty()) return;
  auto& rt = runtime::get();
  // A stream completes its work in order: once the newest pair's end has completed, so has every
  // older pair's on that stream, which is then read without a query of its own.
  const PendingPair& newest = queue.pairs.back();
  bool newest_done = false;
  try {
    newest_done = !wait_all && rt.query_event(newest.end);
  } catch (...) {  // left to that pair's own read below
  }
  const int done_device = newest.device;
  const runtime::StreamId done_stream = newest.stream;
  while (!queue.pairs.empty()) {
    const PendingPair pair = queue.pairs.front();
    try {
      const bool known_done =
          newest_done && pair.device == done_device && pair.stream == done_stream;
      const bool must_wait = wait_all || known_done || queue.pairs.size() > kMaxOutstanding;
      DeviceInterval interval;
      if (!read_interval(rt, pair.start, pair.end, must_wait, /*place=*/false, &interval,
                         /*known_done=*/known_done)) {
        break;
      }
      record_brick(brick_registry(), pair.node, pair.shape, interval.duration_ns,
                   registry::Registry::now_ns());
    } catch (...) {
      g_observer.timing_failures.fetch_add(1, std::memory_order_relaxed);
    }
    queue.pairs.pop_front();
    if (by_owner) {
      state.events.release(pair.device, pair.start);
      state.events.release(pair.device, pair.end);
    } else {
      queue.returned.emplace_back(pair.device, pair.start);
      queue.returned.emplace_back(pair.device, pair.end);
      queue.has_returned.store(true, std::memory_order_relaxed);
    }
  }
  queue.size.store(queue.pairs.size(), std::memory_order_relaxed);
}

// An event from the calling (owning) thread's pool, taking back first the events that a
// snapshot on another thread freed.
runtime::Event* acquire_event(ThreadState& state, int device) {
  if (state.pending.has_returned.load(std::memory_order_relaxed) && !state.events.has_free(device))
      [[unlikely]] {
    std::lock_guard<std::mutex> lock(state.pending.mutex);
    for (auto [owner_device, event] : state.pending.returned) {
      state.events.release(owner_device, event);
    }
    state.pending.returned.clear();
    state.pending.has_returned.store(false, std::memory_order_relaxed);
  }
  return state.events.acquire(device);
}

// Starts an asynchronous runtime's timing of `frame` (its device and node set): a device event
// on the current stream (Event), a clock read after the device drained (Immediate) or at once
// (Deferred). A brick on a stream being captured into a CUDA graph is skipped. In Event mode an
// op's start waits for its first work (start_awaiting_bricks): its device time is its work's,
// from the stream's point where that was queued, not the host's preparation before it; a range
// times the stream from its enter to its exit, whatever was queued in it.
void start_async_timing(ThreadState& state, runtime::Runtime& rt, Frame& frame, bool is_op) {
  const SyncMode mode = g_observer.mode.load(std::memory_order_relaxed);
  if (mode == SyncMode::Event && is_op) {
    frame.awaiting_work = true;
    frame.start_ns = registry::Registry::now_ns();  // its host time, if it queues no work
    return;
  }
  const runtime::StreamId stream = rt.current_stream(frame.device);
  if (skip_in_capture(rt, frame.device, stream, TimingClient::Registry)) [[unlikely]] {
    frame.node = kSkippedInCapture;
    return;
  }
  switch (mode) {
    case SyncMode::Immediate:
      rt.synchronize_device(frame.device);
      frame.start_ns = registry::Registry::now_ns();
      break;
    case SyncMode::Deferred:
      frame.start_ns = registry::Registry::now_ns();
      break;
    case SyncMode::Event:
      frame.start_event = acquire_event(state, frame.device);
      try {
        rt.record_event(frame.start_event, frame.device, stream);
      } catch (...) {
        state.events.release(frame.device, frame.start_event);
        frame.start_event = nullptr;
        throw;
      }
      break;
  }
}

// Ends an asynchronous runtime's timing of `frame`; an event pair is queued, to be resolved
// once the device has reached its end.
void finish_async_timing(ThreadState& state, runtime::Runtime& rt, const Frame& frame) {
  if (frame.awaiting_work) {  // an op that queued no device work (it allocated): none timed
    record_brick(*g_observer.registry.load(std::memory_order_relaxed), frame.node, frame.shape, 0,
                 registry::Registry::now_ns());
    return;
  }
  switch (g_observer.mode.load(std::memory_order_relaxed)) {
    case SyncMode::Immediate: {
      rt.synchronize_device(frame.device);
      const int64_t end = registry::Registry::now_ns();
      record_brick(*g_observer.registry.load(std::memory_order_relaxed), frame.node, frame.shape,
                   end - frame.start_ns, end);
      return;
    }
    case SyncMode::Deferred: {
      const int64_t end = registry::Registry::now_ns();
      record_brick(*g_observer.registry.load(std::memory_order_relaxed), frame.node, frame.shape,
                   end - frame.start_ns, end);
      return;
    }
    case SyncMode::Event:
      break;
  }
  const runtime::StreamId stream = rt.current_stream(frame.device);
  auto& last = state.last_op_end;
  runtime::Event* end = nullptr;
  if (frame.is_op && last.event != nullptr && last.device == frame.device &&
      last.stream == stream) {
    // Nothing was queued since the op nested in this one ended: this one ends there too.
    end = last.event;
    state.events.share(end);
  } else {
    end = acquire_event(state, frame.device);
    try {
      rt.record_event(end, frame.device, stream);
    } catch (...) {
      state.events.release(frame.device, end);
      state.events.release(frame.device, frame.start_event);
      throw;
    }
    if (frame.is_op) {
      forget_last_op_end(state);
      state.events.share(end);
      last = {end, frame.device, stream};
    }
  }
  std::lock_guard<std::mutex> lock(state.pending.mutex);
  state.pending.pairs.push_back(
      {frame.node, frame.device, stream, frame.start_event, end, frame.shape});
  state.pending.size.store(state.pending.pairs.size(), std::memory_order_relaxed);
  if (state.pending.pairs.size() % kResolveEvery == 0 ||
      state.pending.pairs.size() > kMaxOutstanding) {
    resolve_locked(state, /*by_owner=*/true, /*wait_all=*/false);
  }
}

// The queue hook (runtime/launch_observer.h), installed in Event mode on an asynchronous runtime:
// work is about to be queued on `device`'s current stream, so every open op of this thread still
// waiting for its first work starts now, at one event recorded there and shared by all of them
// (skipped, and counted, when that stream is being captured into a CUDA graph); and the end of
// the op that ended last can no longer be shared.
void start_awaiting_bricks(runtime::DeviceIndex device) noexcept {
  ThreadState* state = tls_state;
  if (state == nullptr) return;
  // Work follows: an op that ends from now on ends after it.
  if (state->last_op_end.event != nullptr) forget_last_op_end(*state);
  if (state->awaiting == 0) [[likely]]
    return;
  try {
    runtime::Runtime& rt = *g_observer.runtime.load(std::memory_order_relaxed);
    const runtime::StreamId stream = rt.current_stream(device);
    const bool capturing = rt.is_capturing(device, stream);
    runtime::Event* shared_start = nullptr;
    for (auto it = state->stack.rbegin(); it != state->stack.rend() && state->awaiting > 0; ++it) {
      Frame& frame = *it;
      if (!frame.awaiting_work) continue;
      frame.awaiting_work = false;
      --state->awaiting;
      frame.device = device;
      if (capturing) [[unlikely]] {
        g_capture_skipped[static_cast<size_t>(TimingClient::Registry)].fetch_add(
            1, std::memory_order_relaxed);
        frame.node = kSkippedInCapture;
        continue;
      }
      if (shared_start != nullptr) {
        state->events.share(shared_start);
        frame.start_event = shared_start;
        continue;
      }
      runtime::Event* event = acquire_event(*state, device);
      try {
        rt.record_event(event, device, stream);
        frame.start_event = event;
        shared_start = event;
      } catch (...) {
        state->events.release(device, event);
        frame.node = kIgnored;
        g_observer.timing_failures.fetch_add(1, std::memory_order_relaxed);
      }
    }
  } catch (...) {
    g_observer.timing_failures.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace brick::profiler::detail
