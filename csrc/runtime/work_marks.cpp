#include "runtime/work_marks.h"

#include <atomic>
#include <cstdint>

#include "runtime/launch_observer.h"

namespace brick::runtime {

namespace {

std::atomic<uint32_t> g_next_thread{1};

// The calling thread's marks: 40 bytes of static TLS, initial-exec (a direct %fs access even
// inside a dlopen()ed module).
struct ThreadMarks {
  WorkTracer* tracer = nullptr;  // of its last mark
  uint64_t segment = 0;          // the current one
  uint64_t work_at_mark = 0;     // device_work_seen() at the last mark
  uint32_t thread = 0;           // this thread's number (0: none yet, or none to be had)
  bool pushed = false;           // the current segment is pushed on `tracer`
  bool unnumbered = false;       // beyond kMaxMarkedThread: never marked
  bool holds_work = false;       // the current segment was pushed since it began
};
[[gnu::tls_model("initial-exec")]] constinit thread_local ThreadMarks tls_marks{};

void push_current(ThreadMarks& mine) noexcept {
  mine.tracer->push(segment_interval(mine.thread, mine.segment));
  mine.pushed = true;
  mine.holds_work = true;
}

}  // namespace

WorkMark mark_work(WorkTracer& tracer) noexcept {
  ThreadMarks& mine = tls_marks;
  if (mine.thread == 0) [[unlikely]] {
    if (mine.unnumbered) return {};
    const uint32_t number = g_next_thread.fetch_add(1, std::memory_order_relaxed);
    if (number > kMaxMarkedThread) {  // beyond what an id carries: no mark, ever
      mine.unnumbered = true;
      return {};
    }
    mine.thread = number;
  }
  const uint64_t work = device_work_seen();
  const bool in_launch = traced_launch_in_flight();
  // The segment may hold work (it was pushed, or work was counted since the last mark): the
  // mark starts the next one.
  if (mine.holds_work || work != mine.work_at_mark || in_launch) {
    ++mine.segment;
    mine.holds_work = false;
  }
  if (mine.pushed && mine.tracer != &tracer) {  // (one tracer per process: said, not assumed)
    mine.tracer->pop();
    mine.pushed = false;
  }
  mine.tracer = &tracer;
  mine.work_at_mark = work;
  if (in_launch || in_compiled_code()) {
    // Work may be queued before the next launch is announced (the launch in flight goes on;
    // compiled code's kernels are never announced): pushed now.
    if (mine.pushed) {
      tracer.replace(segment_interval(mine.thread, mine.segment));
      mine.holds_work = true;
    } else {
      push_current(mine);
    }
  } else if (mine.pushed) {
    tracer.pop();
    mine.pushed = false;
  }
  return {mine.thread, mine.segment};
}

void push_segment_for_launch() noexcept {
  ThreadMarks& mine = tls_marks;
  if (mine.pushed || mine.tracer == nullptr) return;
  push_current(mine);
}

void segment_launch_done() noexcept {
  ThreadMarks& mine = tls_marks;
  if (!mine.pushed || traced_launch_in_flight() || in_compiled_code()) return;
  mine.tracer->pop();
  mine.pushed = false;  // (its segment still holds the work: the next mark starts another)
}

}  // namespace brick::runtime
