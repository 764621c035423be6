// Marks in the calling thread's stream of device work, for traced timing: a profiler marks where
// a brick, range or op opens and closes, and the work the thread queued between two of its marks
// is what ran in between (profiler/work_correlator.h sums it from the tracer's records).
//
// A thread's work is cut into segments, each an interval id of the work tracer
// (runtime/work_tracer.h): the thread's number above kSegmentBits, the segment's below. A mark
// starts a new segment only where the one before may hold work (a launch was queued in it, or
// one was in flight); the segment is pushed on the tracer only when the thread queues a launch
// in it (the launch path calls push_segment_for_launch()), and popped at the next mark. So marks
// around views and CPU ops cost the tracer nothing, and no id of brick's stays pushed on a
// thread after its last mark (where another profiler's CUPTI session would meet it). Inside a
// launch (a backing op that runs bricks of its own) and in compiled brick code (whose kernels
// bypass the launch path), a new segment is pushed at the mark itself.
#pragma once

#include <cstdint>

#include "runtime/work_tracer.h"

namespace brick::runtime {

inline constexpr int kSegmentBits = 40;
inline constexpr uint64_t kSegmentMask = (uint64_t{1} << kSegmentBits) - 1;

constexpr uint64_t segment_interval(uint32_t thread, uint64_t segment) noexcept {
  return uint64_t{thread} << kSegmentBits | (segment & kSegmentMask);
}

// A point in one thread's stream of work: the work queued before it is in the segments below
// `segment`; the work after it in `segment` and above. thread 0: no mark.
struct WorkMark {
  uint32_t thread = 0;
  uint64_t segment = 0;
};

// Marks the calling thread's work now, on `tracer` (started).
WorkMark mark_work(WorkTracer& tracer) noexcept;

// The launch path, right before it queues a launch while a work tracer traces (its LaunchTrace
// hook installed): pushes the thread's current segment on its tracer, unless it is pushed.
void push_segment_for_launch() noexcept;

}  // namespace brick::runtime
