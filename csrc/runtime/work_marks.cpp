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
  uint32_t thread = 0;           // this thread's number (0: none yet)
  bool pushed = false;           // the current segment is pushed on `tracer`
  // The current segment began inside a launch: the rest of that launch's work is in it.
  bool began_in_launch = false;
};
[[gnu::tls_model("initial-exec")]] constinit thread_local ThreadMarks tls_marks{};

}  // namespace

WorkMark mark_work(WorkTracer& tracer) noexcept {
  ThreadMarks& mine = tls_marks;
  if (mine.thread == 0) [[unlikely]]
    mine.thread = g_next_thread.fetch_add(1, std::memory_order_relaxed);
  const uint64_t work = device_work_seen();
  const bool in_launch = traced_launch_in_flight();
  // The segment may hold work (it was pushed, a launch went on in it, or work was counted since
  // the last mark): the mark starts the next one.
  if (mine.pushed || mine.began_in_launch || in_launch || work != mine.work_at_mark) {
    ++mine.segment;
  }
  const uint64_t interval = segment_interval(mine.thread, mine.segment);
  if (in_launch || in_compiled_code()) {
    // Work may be queued before the next launch is announced (the launch in flight goes on;
    // compiled code's kernels are never announced): pushed now.
    if (mine.pushed && mine.tracer == &tracer) {
      tracer.replace(interval);
    } else {
      if (mine.pushed) mine.tracer->pop();
      tracer.push(interval);
    }
    mine.pushed = true;
  } else if (mine.pushed) {
    mine.tracer->pop();
    mine.pushed = false;
  }
  mine.tracer = &tracer;
  mine.work_at_mark = work;
  mine.began_in_launch = in_launch;
  return {mine.thread, mine.segment};
}

void push_segment_for_launch() noexcept {
  ThreadMarks& mine = tls_marks;
  if (mine.pushed || mine.tracer == nullptr) return;
  mine.tracer->push(segment_interval(mine.thread, mine.segment));
  mine.pushed = true;
}

}  // namespace brick::runtime
