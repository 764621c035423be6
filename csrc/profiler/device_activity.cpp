// The device-activity recorder. Per launch, on the launching thread: three clock reads, on an
// asynchronous runtime two pooled runtime events as well (no allocation once the pools are
// warm), and one uncontended lock of the thread's own buffer to append the record; collect() is
// the only other taker of that lock.
#include "profiler/device_activity.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>

namespace brick::profiler {

namespace {

struct PendingActivity {
  DeviceActivity activity;  // device times filled in by collect()
  runtime::Event* start_event;
  runtime::Event* end_event;
};

// One per thread that launched while recording; the registry keeps it (and its records) after
// the thread exits, until collect() has drained it.
struct ThreadBuffer {
  std::mutex mutex;
  std::vector<PendingActivity> records;
  std::atomic<bool> thread_exited{false};
};

struct Registry {
  std::mutex mutex;
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
  // Events that collect() released, per device, for any thread to reuse.
  std::vector<std::vector<runtime::Event*>> free_events;
  std::atomic<bool> recording{false};
  std::atomic<uint64_t> capture_skipped{0};
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
    if (pool.empty()) return runtime::get().create_event(device, /*enable_timing=*/true);
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

}  // namespace

ActivityRecorder& ActivityRecorder::instance() {
  static ActivityRecorder* recorder = new ActivityRecorder();  // installed as an observer: forever
  return *recorder;
}

void ActivityRecorder::start() {
  (void)collect();  // what an earlier recording left: dropped, its events reused
  Registry& r = registry();
  r.capture_skipped.store(0, std::memory_order_relaxed);
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
    if (rt.asynchronous() && rt.is_capturing(launch.device, launch.stream)) {
      // Recording an event on a capturing stream is illegal: the launch is counted, not timed.
      registry().capture_skipped.fetch_add(1, std::memory_order_relaxed);
      return;
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
  } catch (...) {
    registry().failed.fetch_add(1, std::memory_order_relaxed);
  }
}

void ActivityRecorder::collective_done(const runtime::Launch& launch) noexcept {
  if (!launch.recorded) return;
  try {
    DeviceActivity activity{launch.name,     launch.kind,      launch.device,
                            launch.stream,   launch.thread_id, launch.correlation,
                            launch.begin_ns, launch.queued_ns, launch.queued_ns,
                            unix_time_ns(),  launch.bytes,     launch.group_size};
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
  }

  CollectedActivities out;
  out.capture_skipped = r.capture_skipped.load(std::memory_order_relaxed);
  out.failed = r.failed.load(std::memory_order_relaxed);
  out.activities.reserve(pending.size());
  runtime::Runtime& rt = runtime::get();
  const int64_t offset = steady_to_unix_offset_ns();
  const auto device_time = [&](runtime::Event* event) -> int64_t {
    int64_t steady = rt.event_host_time_ns(event);
    if (steady < 0) {
      rt.synchronize_event(event);
      steady = rt.event_host_time_ns(event);
    }
    return steady < 0 ? -1 : steady + offset;
  };
  std::vector<std::pair<int, runtime::Event*>> released;
  released.reserve(pending.size() * 2);
  for (PendingActivity& record : pending) {
    if (record.start_event == nullptr) {  // timed on the host clock when it ran
      out.activities.push_back(record.activity);
      continue;
    }
    int64_t start = -1;
    int64_t end = -1;
    try {
      start = device_time(record.start_event);
      end = device_time(record.end_event);
    } catch (...) {
    }
    released.emplace_back(record.activity.device, record.start_event);
    released.emplace_back(record.activity.device, record.end_event);
    if (start < 0 || end < start) {
      ++out.failed;
      continue;
    }
    record.activity.start_ns = start;
    record.activity.end_ns = end;
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
