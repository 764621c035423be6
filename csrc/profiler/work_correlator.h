// A brick's device time from the device's own records of its work (runtime/work_tracer.h): the
// sum of the durations of every kernel, copy and memset queued while the brick was open, its
// nested bricks' included. The tracer names each piece of work's host call, and each call the
// innermost interval pushed on its thread; the profiler says which interval each one was opened
// in. Records arrive late, out of order and across deliveries (a call's work before the call, a
// child's interval after its parent's), so nothing here assumes an order.
//
// Interval ids come from one process-wide counter at each open: a nested interval opens after
// the one around it, so it has the larger id, and resolving in descending ids adds every child
// into its parent before the parent is summed.
//
// Plain C++ and single-threaded: the observer calls it under its own lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "runtime/work_tracer.h"

namespace brick::profiler {

// An interval the profiler closed: `parent` is the interval it was opened in (0: none), `tag`
// the caller's (the brick and its signature).
struct ClosedInterval {
  uint64_t id;
  uint64_t parent;
  uint64_t tag;
};

struct ResolvedInterval {
  uint64_t tag;
  int64_t device_ns;  // the work's summed durations, its nested intervals' included
  uint32_t work;      // how many pieces of work that is
};

class WorkCorrelator {
 public:
  // Takes the tracer's records (`records` is left empty).
  void add(runtime::TracedRecords& records);

  // Resolves `closed`, intervals whose work the caller knows has all been added (it waited for
  // the device, then drained the tracer), in any order; appends one result per interval to
  // `out`. An interval's total goes into its parent, resolved now or later.
  // `all_delivered`: everything the device ran until now has been added (a snapshot after
  // waiting for the devices): work still without its call then never gets one, and is dropped
  // and counted (unattributed()).
  void resolve(std::vector<ClosedInterval>& closed, bool all_delivered,
               std::vector<ResolvedInterval>* out);

  // Work whose call was never named by the tracer, or named no interval: dropped.
  uint64_t unattributed() const noexcept { return unattributed_; }
  // The durations of every piece of work added since the reset, given to an interval or not.
  int64_t traced_ns() const noexcept { return traced_ns_; }
  uint64_t dropped_by_tracer() const noexcept { return dropped_; }
  // What is held for intervals and calls not yet resolved (bounded by what is outstanding).
  size_t held() const noexcept {
    return calls_.size() + unbound_.size() + attributed_.size() + children_.size();
  }
  // Forgets everything (a new profile).
  void reset();

  // Work held without its call beyond this is the oldest dropped (counted unattributed).
  static constexpr size_t kMaxUnbound = size_t{1} << 16;

 private:
  struct Sum {
    int64_t ns = 0;
    uint32_t work = 0;
  };
  // A piece of work whose interval is known: flat records, sorted when resolved (no node per
  // record: a resolution costs tens of ns per interval, not hundreds).
  struct Attributed {
    uint64_t interval;
    int64_t ns;
  };
  // Gives `unbound_` its calls where `calls_` (sorted by call) names them.
  void bind_unbound();

  std::vector<runtime::TracedCall> calls_;    // sorted by call once bound; of unresolved intervals
  std::vector<runtime::TracedWork> unbound_;  // work whose call has not been named yet
  std::vector<Attributed> attributed_;        // work of intervals not resolved yet
  // Interval -> its resolved children's totals, for parents not resolved yet (few: the ranges
  // open across a resolution).
  std::unordered_map<uint64_t, Sum> children_;
  uint64_t unattributed_ = 0;
  uint64_t dropped_ = 0;
  int64_t traced_ns_ = 0;
};

}  // namespace brick::profiler
