#include "profiler/work_marks.h"

#include <atomic>
#include <cstdint>

#include "runtime/launch_observer.h"

namespace brick::profiler {

namespace {

std::atomic<uint32_t> g_next_thread{1};

// The calling thread's marks: 32 bytes of static TLS, initial-exec (a direct %fs access even
// inside a dlopen()ed module).
struct ThreadMarks {
  uint64_t segment = 0;       // the current one (valid while pushed)
  uint64_t work_at_mark = 0;  // runtime::device_work_seen() when the segment began
  uint32_t thread = 0;        // this thread's number (0: none yet)
  bool pushed = false;
  // The segment began inside a launch: the rest of that launch's work is in it (a brick kernel's
  // backing op, split by the bricks nested in it, goes on queueing work after the split).
  bool began_in_launch = false;
};
[[gnu::tls_model("initial-exec")]] constinit thread_local ThreadMarks tls_marks{};

}  // namespace

WorkMark mark_work(runtime::WorkTracer& tracer) noexcept {
  ThreadMarks& mine = tls_marks;
  const uint64_t work = runtime::device_work_seen();
  const bool in_launch = runtime::traced_launch_in_flight();
  // The segment may hold work: a new one begins. (It holds none only if no launch was queued,
  // nor went on, since it began.)
  if (!mine.pushed || work != mine.work_at_mark || in_launch || mine.began_in_launch) {
    if (mine.thread == 0) [[unlikely]]
      mine.thread = g_next_thread.fetch_add(1, std::memory_order_relaxed);
    ++mine.segment;
    if (mine.pushed) {
      tracer.replace(segment_interval(mine.thread, mine.segment));
    } else {
      tracer.push(segment_interval(mine.thread, mine.segment));
    }
    mine.pushed = true;
    mine.work_at_mark = work;
    mine.began_in_launch = in_launch;
  }
  return {mine.thread, mine.segment};
}

WorkMark end_work_marks(runtime::WorkTracer& tracer) noexcept {
  ThreadMarks& mine = tls_marks;
  if (!mine.pushed) return {mine.thread, mine.segment + 1};
  tracer.pop();
  mine.pushed = false;
  // The work before it is in this segment and below; the next mark pushes the one above.
  return {mine.thread, mine.segment + 1};
}

}  // namespace brick::profiler
