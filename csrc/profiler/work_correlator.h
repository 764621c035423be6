// Device time from the device's own records of its work (runtime/work_tracer.h), for every
// profiler that reads it: the registry's bricks, the legacy profiler's ops (its stubs) and
// torch.profiler's. A profiler marks the calling thread's stream of work where a brick, range or
// op opens and closes (runtime/work_marks.h); the work a thread queued between two of its marks
// is what ran in between: the sum of the durations of every kernel, copy and memset queued
// there, nested bricks' included, never the span across the gaps between them.
//
// How: a thread's work is cut into segments, one tracer interval id each (runtime/work_marks.h).
// The tracer names each piece of work's host call, and each call the segment it was made in; the
// correlator sums the work per segment, and a thread's running sum over its segments answers any
// two of its marks.
// Records arrive late, out of order and across deliveries (a call's work before the call), so
// nothing here assumes an order.
//
// Work a thread queues for a brick of another thread (PyTorch's autograd engine runs a backward
// on its own threads, inside the caller's open range) is carried to that brick by resolve().
//
// Plain C++ and single-threaded: its owner calls it under its own lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <unordered_map>
#include <vector>

#include "runtime/work_marks.h"
#include "runtime/work_tracer.h"

namespace brick::profiler {

using runtime::kSegmentBits;
using runtime::kSegmentMask;
using runtime::segment_interval;
using runtime::WorkMark;
inline constexpr uint64_t kNoFloor = std::numeric_limits<uint64_t>::max();

struct WorkSum {
  int64_t ns = 0;     // the summed durations
  uint32_t work = 0;  // of how many pieces of work
};

// A brick the profiler closed: its marks, `tag` the profiler's (the brick and its signature).
// `id` comes from one process-wide counter at each open: a brick nested in another opened after
// it, so resolving in descending ids meets every child before its parent. `parent`: the id of
// the brick it was opened in (0: none); `parent_elsewhere`: that brick is another thread's.
struct ClosedInterval {
  uint64_t id;
  uint64_t parent;
  uint64_t tag;
  WorkMark open;
  uint64_t close_segment;  // the close's mark, on open.thread
  bool parent_elsewhere = false;
};

struct ResolvedInterval {
  uint64_t tag;
  int64_t device_ns;  // the work's summed durations, its nested bricks' included
  uint32_t work;      // how many pieces of work that is
};

class WorkCorrelator {
 public:
  WorkCorrelator() = default;
  WorkCorrelator(const WorkCorrelator&) = delete;  // (it points into itself)
  WorkCorrelator& operator=(const WorkCorrelator&) = delete;

  // Takes the tracer's records (`records` is left empty).
  void add(runtime::TracedRecords& records);

  // The work `from.thread` queued from `from` to `to` (two marks of one thread, in that order),
  // of the work added so far. A mark below the thread's fold floor reads as the floor.
  WorkSum between(WorkMark from, WorkMark to);

  // Resolves `closed` (whose work the caller knows has all been added: it waited for the
  // devices, then drained the tracer), in any order; appends one result per brick to `out`. A
  // brick's total from other threads' bricks nested in it goes into it, resolved now or later.
  // Marks are read before anything is folded: call fold() after.
  void resolve(std::vector<ClosedInterval>& closed, std::vector<ResolvedInterval>* out);

  // No mark of `thread` below segment `floor` will be asked about again: those segments are
  // summed into one (kNoFloor: the thread is done, everything of it forgotten).
  void fold(uint32_t thread, uint64_t floor);
  // The threads with work held, for a caller that folds them.
  std::vector<uint32_t> threads() const;

  // After a resolution and its folds: forgets the calls of folded segments (made before the
  // floor was read, so before the devices were waited for: their work has all come).
  // `all_delivered`: everything the device ran until now has been added (after waiting for the
  // devices, with no thread queueing more): work still without its call never gets one, and is
  // counted unattributed and dropped, and every call is forgotten.
  void settle(bool all_delivered);

  // Work whose call was never named by the tracer, or named no segment: dropped.
  uint64_t unattributed() const noexcept { return unattributed_; }
  // The durations of every piece of work added since the reset, attributed or not.
  int64_t traced_ns() const noexcept { return traced_ns_; }
  uint64_t dropped_by_tracer() const noexcept { return dropped_; }
  // Records held: segments, calls, unbound work, open bricks' carried sums.
  size_t held() const noexcept;
  // Forgets everything (a new profile).
  void reset();

  // Work held without its call beyond this is the oldest dropped (counted unattributed).
  static constexpr size_t kMaxUnbound = size_t{1} << 16;

 private:
  struct Segment {
    uint64_t segment;
    WorkSum sum;
  };
  // One thread's segments with work above its floor, summed; sorted and prefixed lazily, when
  // asked.
  struct ThreadWork {
    std::vector<Segment> segments;  // [0, sorted) sorted by segment, unique; then as added
    size_t sorted = 0;
    std::vector<WorkSum> running;  // running[i]: `folded` plus segments [0, i)
    WorkSum folded;                // the segments below the thread's floor
  };
  // The thread's floor (0: none; kNoFloor: the thread is done).
  uint64_t floor_of(uint32_t thread) const noexcept;
  void bind_unbound();
  void attribute(uint64_t interval, int64_t ns);
  // Sorts and merges what was added since, and rebuilds the running sums.
  static void prepare(ThreadWork& thread);
  static WorkSum before(ThreadWork& thread, uint64_t segment);

  std::unordered_map<uint32_t, ThreadWork> threads_;
  std::unordered_map<uint32_t, uint64_t> floors_;  // threads folded, and their floors
  // The thread attribute() saw last: its floor and its work (nullptr: none yet).
  struct {
    uint32_t thread = 0;
    uint64_t floor = 0;
    ThreadWork* work = nullptr;
  } last_;
  std::vector<runtime::TracedCall> calls_;    // sorted by call
  std::vector<runtime::TracedWork> unbound_;  // work whose call has not been named yet
  // Brick -> what other threads' bricks nested in it queued, for bricks not resolved yet (few:
  // the ranges open across a resolution).
  std::unordered_map<uint64_t, WorkSum> carried_;
  uint64_t unattributed_ = 0;
  uint64_t dropped_ = 0;
  int64_t traced_ns_ = 0;
};

}  // namespace brick::profiler
