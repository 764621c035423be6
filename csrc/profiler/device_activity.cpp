// The device-activity recorder. Per launch, on the launching thread: three clock reads, on an
// asynchronous runtime two pooled runtime events as well (no allocation once the pools are
// warm), and one uncontended lock of the thread's own buffer to append the record (every
// kResolveEvery launches the thread also resolves its records whose events completed, so the
// events held stay bounded); collect() is the only other taker of that lock.
#include "profiler/device_activity.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <mutex>

#include "profiler/device_timer.h"

namespace brick::profiler {

namespace {

struct PendingActivity {
  DeviceActivity activity;      // device times filled in once its events have completed
  runtime::Event* start_event;  // null once resolved (or timed on the host clock)
  runtime::Event* end_event;
  bool failed = false;  // its events could not be read: dropped and counted by collect()
};

// One per thread that launched while recording; the registry keeps it (and its records) after
// the thread exits, until collect() has drained it.
struct ThreadBuffer {
  std::mutex mutex;
  std::vector<PendingActivity> records;
  size_t resolved_upto = 0;  // records before this index hold no event
  size_t unresolved = 0;     // records holding events
  std::atomic<bool> thread_exited{false};
};

struct Registry {
  std::mutex mutex;
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
  // Events that collect() released, per device, for any thread to reuse.
  std::vector<std::vector<runtime::Event*>> free_events;
  std::atomic<bool> recording{false};
  std::atomic<uint64_t> capture_skipped_at_start{0};  // the timer's count when recording began
  std::atomic<uint64_t> failed{0};
};

Registry& registry() {
  static Registry* instance = new Registry();  // never destroyed: threads may outlive statics
  return *instance;
}

int64_t linux_thread_id() noexcept { return static_cast<int64_t>(::syscall(SYS_gettid)); }

// The calling thread's buffer, event pool and correlation stack.
struct ThreadState {
  std::shared_ptr<ThreadBuffer> buffer;
  int64_t thread_id = linux_thread_id();
  std::vector<std::vector<runtime::Event*>> free_events;  // per device
  std::vector<uint64_t> correlations;

  ThreadBuffer& ensure_buffer() {
    if (!buffer) {
      buffer = std::make_shared<ThreadBuffer>();
      Registry& r = registry();
      std::lock_guard<std::mutex> lock(r.mutex);
      r.buffers.push_back(buffer);
    }
    return *buffer;
  }

  runtime::Event* acquire_event(int device) {
    if (device >= static_cast<int>(free_events.size())) free_events.resize(device + 1);
    auto& pool = free_events[device];
    if (pool.empty()) {
      Registry& r = registry();
      std::lock_guard<std::mutex> lock(r.mutex);
      if (device < static_cast<int>(r.free_events.size())) pool.swap(r.free_events[device]);
    }
    if (pool.empty()) return create_timing_event(device);
    runtime::Event* event = pool.back();
    pool.pop_back();
    return event;
  }

  ~ThreadState() {
    if (buffer) buffer->thread_exited.store(true, std::memory_order_release);
    // Pooled events go back for other threads.
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    for (size_t device = 0; device < free_events.size(); ++device) {
      if (device >= r.free_events.size()) r.free_events.resize(device + 1);
      auto& shared = r.free_events[device];
      shared.insert(shared.end(), free_events[device].begin(), free_events[device].end());
    }
  }
};

thread_local ThreadState tls_state;

// Resolves `record` (holding events) into device times on the Unix clock (its start placed on
// the host clock, its end the start plus the device's measure of the interval), waiting for its
// end when `wait`; its events go to `released`. False when it has not completed and `wait` is
// false.
bool resolve(runtime::Runtime& rt, PendingActivity& record, bool wait, int64_t unix_offset,
             std::vector<std::pair<int, runtime::Event*>>& released) {
  DeviceInterval interval;
  bool read = false;
  try {
    if (!read_interval(rt, record.start_event, record.end_event, wait, /*place=*/true, &interval)) {
      return false;
    }
    read = true;
  } catch (...) {
  }
  released.emplace_back(record.activity.device, record.start_event);
  released.emplace_back(record.activity.device, record.end_event);
  record.start_event = record.end_event = nullptr;
  if (!read || interval.duration_ns < 0) {
    record.failed = true;
    return true;
  }
  record.activity.start_ns = interval.start_ns + unix_offset;
  record.activity.end_ns = interval.start_ns + interval.duration_ns + unix_offset;
  return true;
}

// On the launching thread, `buffer` locked: resolves the records whose events completed, in
// launch order, waiting for the oldest while more than kMaxOutstanding are unresolved.
void resolve_completed(ThreadBuffer& buffer) {
  runtime::Runtime& rt = runtime::get();
  const int64_t offset = steady_to_unix_offset_ns();
  std::vector<std::pair<int, runtime::Event*>> released;
  auto& records = buffer.records;
  while (buffer.resolved_upto < records.size()) {
    PendingActivity& record = records[buffer.resolved_upto];
    if (record.start_event != nullptr) {
      if (!resolve(rt, record, buffer.unresolved > kMaxOutstanding, offset, released)) break;
      --buffer.unresolved;
    }
    ++buffer.resolved_upto;
  }
  for (const auto& [device, event] : released) {
    if (device >= static_cast<int>(tls_state.free_events.size())) {
      tls_state.free_events.resize(device + 1);
    }
    tls_state.free_events[device].push_back(event);
  }
}

}  // namespace

ActivityRecorder& ActivityRecorder::instance() {
  static ActivityRecorder* recorder = new ActivityRecorder();  // installed as an observer: forever
  return *recorder;
}

void ActivityRecorder::start() {
  (void)collect();  // what an earlier recording left: dropped, its events reused
  Registry& r = registry();
  r.capture_skipped_at_start.store(capture_skipped(TimingClient::DeviceActivity),
                                   std::memory_order_relaxed);
  r.failed.store(0, std::memory_order_relaxed);
  r.recording.store(true, std::memory_order_release);
  runtime::set_launch_observer(this);
}

void ActivityRecorder::stop() {
  runtime::set_launch_observer(nullptr);
  registry().recording.store(false, std::memory_order_release);
}

bool ActivityRecorder::recording() const noexcept {
  return registry().recording.load(std::memory_order_acquire);
}

void ActivityRecorder::push_correlation(uint64_t id) { tls_state.correlations.push_back(id); }

void ActivityRecorder::pop_correlation() noexcept {
  if (!tls_state.correlations.empty()) tls_state.correlations.pop_back();
}

uint64_t ActivityRecorder::current_correlation() noexcept {
  return tls_state.correlations.empty() ? 0 : tls_state.correlations.back();
}

void ActivityRecorder::begin(runtime::Launch& launch) noexcept {
  launch.recorded = false;
  launch.correlation = current_correlation();
  launch.thread_id = tls_state.thread_id;
  launch.begin_ns = unix_time_ns();
}

void ActivityRecorder::queue(runtime::Launch& launch) noexcept {
  if (!recording() || launch.device < 0) return;
  try {
    if (launch.kind == runtime::LaunchKind::Collective) {
      // The engine's own threads or stream run it: timed on the host clock until it completes.
      launch.stream = runtime::kCollectiveStream;
      launch.start_event = nullptr;
      launch.queued_ns = unix_time_ns();
      launch.recorded = true;
      return;
    }
    runtime::Runtime& rt = runtime::get();
    launch.stream = rt.current_stream(launch.device);
    if (rt.asynchronous() &&
        skip_in_capture(rt, launch.device, launch.stream, TimingClient::DeviceActivity)) {
      return;  // counted, not timed
    }
    if (!rt.asynchronous()) {
      // The work runs on this thread before the launch returns: the clock around it is the
      // device time, with no event to record or resolve.
      launch.start_event = nullptr;
      launch.queued_ns = unix_time_ns();
      launch.recorded = true;
      return;
    }
    launch.start_event = tls_state.acquire_event(launch.device);
    launch.queued_ns = unix_time_ns();
    rt.record_event(launch.start_event, launch.device, launch.stream);
    launch.recorded = true;
  } catch (...) {
    registry().failed.fetch_add(1, std::memory_order_relaxed);
  }
}

void ActivityRecorder::end(runtime::Launch& launch) noexcept {
  if (!launch.recorded) return;
  try {
    DeviceActivity activity{launch.name,     launch.kind,         launch.device,
                            launch.stream,   tls_state.thread_id, launch.correlation,
                            launch.begin_ns, launch.queued_ns,    launch.queued_ns,
                            launch.queued_ns};
    runtime::Event* end_event = nullptr;
    if (launch.start_event == nullptr) {
      activity.end_ns = unix_time_ns();
    } else {
      end_event = tls_state.acquire_event(launch.device);
      runtime::get().record_event(end_event, launch.device, launch.stream);
    }
    ThreadBuffer& buffer = tls_state.ensure_buffer();
    std::lock_guard<std::mutex> lock(buffer.mutex);
    buffer.records.push_back(PendingActivity{activity, launch.start_event, end_event});
    if (end_event != nullptr && ++buffer.unresolved % kResolveEvery == 0) {
      resolve_completed(buffer);
    }
  } catch (...) {
    registry().failed.fetch_add(1, std::memory_order_relaxed);
  }
}

void ActivityRecorder::collective_done(const runtime::Launch& launch, int64_t device_ns) noexcept {
  if (!launch.recorded) return;
  try {
    const int64_t end_ns = device_ns >= 0 ? launch.queued_ns + device_ns : unix_time_ns();
    DeviceActivity activity{launch.name,     launch.kind,      launch.device,
                            launch.stream,   launch.thread_id, launch.correlation,
                            launch.begin_ns, launch.queued_ns, launch.queued_ns,
                            end_ns,          launch.bytes,     launch.group_size};
    ThreadBuffer& buffer = tls_state.ensure_buffer();
    std::lock_guard<std::mutex> lock(buffer.mutex);
    buffer.records.push_back(PendingActivity{activity, nullptr, nullptr});
  } catch (...) {
    registry().failed.fetch_add(1, std::memory_order_relaxed);
  }
}

CollectedActivities ActivityRecorder::collect() {
  Registry& r = registry();
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    buffers = r.buffers;
    // Buffers of exited threads are dropped once drained below (they get no new records).
    std::erase_if(r.buffers, [](const std::shared_ptr<ThreadBuffer>& buffer) {
      return buffer->thread_exited.load(std::memory_order_acquire);
    });
  }
  std::vector<PendingActivity> pending;
  for (const auto& buffer : buffers) {
    std::lock_guard<std::mutex> lock(buffer->mutex);
    pending.insert(pending.end(), buffer->records.begin(), buffer->records.end());
    buffer->records.clear();
    buffer->resolved_upto = 0;
    buffer->unresolved = 0;
  }

  CollectedActivities out;
  out.capture_skipped = capture_skipped(TimingClient::DeviceActivity) -
                        r.capture_skipped_at_start.load(std::memory_order_relaxed);
  out.failed = r.failed.load(std::memory_order_relaxed);
  out.activities.reserve(pending.size());
  runtime::Runtime& rt = runtime::get();
  const int64_t offset = steady_to_unix_offset_ns();
  std::vector<std::pair<int, runtime::Event*>> released;
  for (PendingActivity& record : pending) {
    // Timed on the host clock when it ran, or resolved by its thread: times known.
    if (record.start_event != nullptr) (void)resolve(rt, record, /*wait=*/true, offset, released);
    if (record.failed) {
      ++out.failed;
      continue;
    }
    out.activities.push_back(record.activity);
  }
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& [device, event] : released) {
    if (device >= static_cast<int>(r.free_events.size())) r.free_events.resize(device + 1);
    r.free_events[device].push_back(event);
  }
  return out;
}

}  // namespace brick::profiler
