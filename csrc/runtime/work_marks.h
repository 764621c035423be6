// Marks in the calling thread's stream of device work, for traced timing: a profiler marks where
// a brick, range or op opens and closes, and the work the thread queued between two of its marks
// is what ran in between (profiler/work_correlator.h sums it from the tracer's records).
//
// A thread's work is cut into segments, each an interval id of the work tracer
// (runtime/work_tracer.h): the thread's number above kSegmentBits, the segment's below. A mark
// starts a new segment only where the one before may hold work (a launch was queued in it, or
// one was in flight). The segment is pushed on the tracer only while a launch of the thread's
// runs (the launch path calls push_segment_for_launch() and segment_launch_done() around it):
// marks around views and CPU ops cost the tracer nothing, and no id of brick's stays pushed on a
// thread outside its launches (where another profiler's CUPTI session would meet it). Inside a
// launch (a backing op that runs bricks of its own) a mark replaces the pushed segment with the
// next at once; in compiled brick code (whose kernels bypass the launch path) each mark pushes
// its segment, popped at the next mark outside it.
#pragma once

#include <cstdint>

#include "runtime/work_tracer.h"

namespace brick::runtime {

inline constexpr int kSegmentBits = 40;
inline constexpr uint64_t kSegmentMask = (uint64_t{1} << kSegmentBits) - 1;
// Threads numbered beyond this get no marks (thread 0): what an id and a legacy-profiler event
// (which keeps its top bit) carry.
inline constexpr uint32_t kMaxMarkedThread = (uint32_t{1} << (63 - kSegmentBits)) - 1;

constexpr uint64_t segment_interval(uint32_t thread, uint64_t segment) noexcept {
  return uint64_t{thread} << kSegmentBits | (segment & kSegmentMask);
}

// A point in one thread's stream of work: the work queued before it is in the segments below
// `segment`; the work after it in `segment` and above. thread 0: no mark (nothing traced).
struct WorkMark {
  uint32_t thread = 0;
  uint64_t segment = 0;
};

// Marks the calling thread's work now, on `tracer` (started).
WorkMark mark_work(WorkTracer& tracer) noexcept;

// The launch path, right before it queues a launch while a work tracer traces (its LaunchTrace
// hook installed): pushes the thread's current segment on its tracer, unless it is pushed.
void push_segment_for_launch() noexcept;
// The launch path, once that launch is done (traced_launch_in_flight() updated): the outermost
// launch's end pops the segment.
void segment_launch_done() noexcept;

}  // namespace brick::runtime
