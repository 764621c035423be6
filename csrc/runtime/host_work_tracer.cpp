// The host runtime's work tracer: each launch brick makes is work stamped on the steady clock
// from its queueing to its end on the launching thread, one call per piece naming the thread's
// innermost pushed interval. Records stay with their thread until drained (an
// uncontended lock per launch); a thread's records outlive it.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/launch_observer.h"
#include "runtime/work_tracer.h"

namespace brick::runtime {
namespace {

int64_t steady_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct ThreadRecords {
  std::mutex mutex;
  TracedRecords records;
};

struct Tracing {
  std::atomic<bool> on{false};
  std::atomic<uint32_t> next_call{1};
  std::mutex threads_mutex;
  std::vector<std::shared_ptr<ThreadRecords>> threads;  // every thread that recorded
};
Tracing& tracing() {
  static Tracing* const kept = new Tracing();  // launches on other threads may outlive exit
  return *kept;
}

struct ThreadTrace {
  std::vector<uint64_t> intervals;  // pushed, innermost last
  std::shared_ptr<ThreadRecords> records;
  int64_t queued_ns = -1;  // the piece in flight started then (-1: no launch in flight)
  uint32_t launch_depth = 0;
};
thread_local ThreadTrace tls_trace;

ThreadRecords& thread_records() {
  if (tls_trace.records == nullptr) {
    auto records = std::make_shared<ThreadRecords>();
    std::lock_guard<std::mutex> lock(tracing().threads_mutex);
    tracing().threads.push_back(records);
    tls_trace.records = std::move(records);
  }
  return *tls_trace.records;
}

// Records the piece of the thread's launch in flight from its start until now, for the innermost
// interval pushed (none: a piece outside every interval), and starts the next piece now.
void record_piece() noexcept {
  const int64_t now = steady_ns();
  const int64_t start_ns = tls_trace.queued_ns;
  tls_trace.queued_ns = now;
  try {
    ThreadRecords& mine = thread_records();
    const uint32_t call = tracing().next_call.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mine.mutex);
    mine.records.work.push_back({call, start_ns, now});
    if (!tls_trace.intervals.empty()) {
      mine.records.calls.push_back({call, tls_trace.intervals.back()});
    }
  } catch (...) {  // out of memory: the piece is lost, and counted
    if (tls_trace.records != nullptr) {
      std::lock_guard<std::mutex> lock(tls_trace.records->mutex);
      ++tls_trace.records->records.dropped;
    }
  }
}

// A launch inside a launch (a brick kernel whose backing op launches another) continues the
// same stretch of work: pieces are cut at each boundary, and the work ends with the outermost.
void on_queued() noexcept {
  if (!tracing().on.load(std::memory_order_relaxed)) return;
  if (tls_trace.launch_depth++ > 0) {
    record_piece();
  } else {
    tls_trace.queued_ns = steady_ns();
  }
}

void on_done() noexcept {
  if (tls_trace.launch_depth == 0) return;  // queued while tracing was off
  record_piece();
  if (--tls_trace.launch_depth == 0) tls_trace.queued_ns = -1;
}

constexpr LaunchTrace kLaunchTrace{&on_queued, &on_done};

class HostWorkTracer final : public WorkTracer {
 public:
  const char* name() const noexcept override { return "host"; }

  void start() override {
    tracing().on.store(true, std::memory_order_relaxed);
    set_launch_trace(&kLaunchTrace);
  }

  void stop() noexcept override {
    set_launch_trace(nullptr);
    tracing().on.store(false, std::memory_order_relaxed);
  }

  // A brick that opens or closes while a launch runs (the backing device's own ops inside a
  // brick kernel: aten::clamp_min inside aten::relu) splits the launch's work at that point: each
  // piece belongs to the innermost brick open while it ran, as a GPU kernel belongs to the op
  // that launched it.
  void push(uint64_t interval) noexcept override {
    if (tls_trace.queued_ns >= 0) record_piece();
    try {
      tls_trace.intervals.push_back(interval);
    } catch (...) {  // out of memory: this interval's calls go to the one around it
      ++unpushed_depth();
    }
  }

  void pop() noexcept override {
    if (tls_trace.queued_ns >= 0) record_piece();
    if (unpushed_depth() > 0) {
      --unpushed_depth();
    } else if (!tls_trace.intervals.empty()) {
      tls_trace.intervals.pop_back();
    }
  }

  void drain(TracedRecords* into) override {
    std::lock_guard<std::mutex> lock(tracing().threads_mutex);
    auto& threads = tracing().threads;
    for (const auto& thread : threads) {
      std::lock_guard<std::mutex> thread_lock(thread->mutex);
      TracedRecords& held = thread->records;
      into->work.insert(into->work.end(), held.work.begin(), held.work.end());
      into->calls.insert(into->calls.end(), held.calls.begin(), held.calls.end());
      into->dropped += held.dropped;
      held.work.clear();
      held.calls.clear();
      held.dropped = 0;
    }
    // Threads that have exited, now drained, are forgotten.
    std::erase_if(threads, [](const std::shared_ptr<ThreadRecords>& thread) {
      return thread.use_count() == 1;
    });
  }

 private:
  static uint32_t& unpushed_depth() noexcept {
    thread_local uint32_t depth = 0;
    return depth;
  }
};

}  // namespace

std::unique_ptr<WorkTracer> make_host_work_tracer() { return std::make_unique<HostWorkTracer>(); }

}  // namespace brick::runtime
