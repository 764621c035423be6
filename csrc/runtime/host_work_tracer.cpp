// The host runtime's work tracer: each launch brick makes is work stamped on the steady clock
// from its queueing to its end on the launching thread, one call per piece naming the thread's
// innermost pushed interval. Records stay with their thread until drained (an uncontended lock
// per piece); a thread's records outlive it.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "common/chunked_log.h"
#include "runtime/launch_observer.h"
#include "runtime/work_tracer.h"

namespace brick::runtime {
namespace {

int64_t steady_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A thread's records until drained (common/chunked_log.h: outside the malloc heap, never
// copied as they grow).
struct ThreadRecords {
  std::mutex mutex;
  ChunkedLog<TracedWork> work;
  ChunkedLog<TracedCall> calls;
  uint64_t dropped = 0;
};

struct Tracing {
  std::atomic<bool> on{false};
  std::atomic<uint32_t> next_call{1};
  std::atomic<uint64_t> launches{0};  // since start()
  std::mutex threads_mutex;
  std::vector<std::shared_ptr<ThreadRecords>> threads;  // every thread that recorded
};
Tracing& tracing() {
  static Tracing* const kept = new Tracing();  // launches on other threads may outlive exit
  return *kept;
}

struct ThreadTrace {
  std::vector<uint64_t> intervals;  // pushed, innermost last
  uint32_t unpushed = 0;            // pushes that could not be kept (out of memory)
  std::shared_ptr<ThreadRecords> records;
  int64_t queued_ns = -1;  // the piece in flight started then (-1: no launch in flight)
  uint32_t launch_depth = 0;
};

// The calling thread's trace: a direct %fs access (initial-exec, 8 bytes of static TLS) to the
// state its owner keeps on the heap until the thread exits.
[[gnu::tls_model("initial-exec")]] constinit thread_local ThreadTrace* tls_trace = nullptr;

// Owns the calling thread's trace until the thread exits; the pointer goes first, so nothing
// later in the thread's teardown reaches a freed trace.
struct ThreadTraceOwner {
  std::unique_ptr<ThreadTrace> owned;
  ~ThreadTraceOwner() { tls_trace = nullptr; }
};

[[gnu::noinline]] ThreadTrace* create_thread_trace() noexcept {
  try {
    thread_local ThreadTraceOwner owner;
    auto trace = std::make_unique<ThreadTrace>();
    trace->records = std::make_shared<ThreadRecords>();
    {
      std::lock_guard<std::mutex> lock(tracing().threads_mutex);
      tracing().threads.push_back(trace->records);
    }
    owner.owned = std::move(trace);
    tls_trace = owner.owned.get();
  } catch (...) {  // out of memory: this thread's launches and pushes go untraced
    return nullptr;
  }
  return tls_trace;
}

ThreadTrace* thread_trace() noexcept {
  ThreadTrace* trace = tls_trace;
  return trace != nullptr ? trace : create_thread_trace();
}

// Records the piece of the thread's launch in flight from its start until now, for the innermost
// interval pushed (none: a piece outside every interval), and starts the next piece now.
void record_piece(ThreadTrace& trace) noexcept {
  const int64_t now = steady_ns();
  const int64_t start_ns = trace.queued_ns;
  trace.queued_ns = now;
  ThreadRecords& mine = *trace.records;
  const uint32_t call = tracing().next_call.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mine.mutex);
  try {
    mine.work.push_back({call, start_ns, now});
    if (!trace.intervals.empty()) mine.calls.push_back({call, trace.intervals.back()});
  } catch (...) {  // out of memory: the piece is lost, and counted
    ++mine.dropped;
  }
}

// A launch inside a launch (a brick kernel whose backing op launches another) continues the
// same stretch of work: pieces are cut at each boundary, and the work ends with the outermost.
void on_queued() noexcept {
  if (!tracing().on.load(std::memory_order_relaxed)) return;
  ThreadTrace* trace = thread_trace();
  if (trace == nullptr) return;
  if (trace->launch_depth++ > 0) {
    record_piece(*trace);
  } else {
    tracing().launches.fetch_add(1, std::memory_order_relaxed);
    trace->queued_ns = steady_ns();
  }
}

void on_done() noexcept {
  ThreadTrace* trace = tls_trace;
  if (trace == nullptr || trace->launch_depth == 0) return;  // queued while tracing was off
  record_piece(*trace);
  if (--trace->launch_depth == 0) trace->queued_ns = -1;
}

constexpr LaunchTrace kLaunchTrace{&on_queued, &on_done};

class HostWorkTracer final : public WorkTracer {
 public:
  const char* name() const noexcept override { return "host"; }

  void start() override {
    tracing().launches.store(0, std::memory_order_relaxed);
    tracing().on.store(true, std::memory_order_relaxed);
    set_launch_trace(&kLaunchTrace);
  }

  uint64_t launches() const noexcept override {
    return tracing().launches.load(std::memory_order_relaxed);
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
    ThreadTrace* trace = thread_trace();
    if (trace == nullptr) return;  // (its pop finds no trace either)
    if (trace->queued_ns >= 0) record_piece(*trace);
    try {
      trace->intervals.push_back(interval);
    } catch (...) {  // out of memory: this interval's calls go to the one around it
      ++trace->unpushed;
    }
  }

  // (A push that could not be kept is undone by the pop that ends it: counted pushes are the
  // innermost, so the `unpushed` ones are popped first.)
  void pop() noexcept override {
    ThreadTrace* trace = tls_trace;
    if (trace == nullptr) return;
    if (trace->queued_ns >= 0) record_piece(*trace);
    if (trace->unpushed > 0) {
      --trace->unpushed;
    } else if (!trace->intervals.empty()) {
      trace->intervals.pop_back();
    }
  }

  void replace(uint64_t interval) noexcept override {
    ThreadTrace* trace = tls_trace;
    if (trace == nullptr || trace->unpushed > 0 || trace->intervals.empty()) {
      pop();
      push(interval);
      return;
    }
    if (trace->queued_ns >= 0) record_piece(*trace);
    trace->intervals.back() = interval;
  }

  void drain(TracedRecords* into) override {
    std::lock_guard<std::mutex> lock(tracing().threads_mutex);
    auto& threads = tracing().threads;
    for (const auto& thread : threads) {
      std::lock_guard<std::mutex> thread_lock(thread->mutex);
      thread->work.append_to(into->work);
      thread->calls.append_to(into->calls);
      into->dropped += thread->dropped;
      thread->work.clear();
      thread->calls.clear();
      thread->dropped = 0;
    }
    // Threads that have exited, now drained, are forgotten.
    std::erase_if(threads, [](const std::shared_ptr<ThreadRecords>& thread) {
      return thread.use_count() == 1;
    });
  }
};

}  // namespace

std::unique_ptr<WorkTracer> make_host_work_tracer() { return std::make_unique<HostWorkTracer>(); }

void host_work_tracer_after_fork_in_child() noexcept {
  Tracing& shared = tracing();
  new (&shared.threads_mutex) std::mutex();
  // The other threads' records are the parent's (and their locks may be held): left behind.
  (void)new std::vector<std::shared_ptr<ThreadRecords>>(std::move(shared.threads));
  shared.threads.clear();  // (moved from: empty; said, not assumed)
  ThreadTrace* trace = tls_trace;
  if (trace == nullptr) return;
  trace->queued_ns = -1;
  trace->launch_depth = 0;
  try {
    trace->records = std::make_shared<ThreadRecords>();
    shared.threads.push_back(trace->records);
  } catch (...) {  // out of memory: this thread goes untraced in the child
    tls_trace = nullptr;
  }
}

}  // namespace brick::runtime
