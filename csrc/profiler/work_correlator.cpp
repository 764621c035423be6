#include "profiler/work_correlator.h"

#include <algorithm>
#include <cstddef>
#include <iterator>

namespace brick::profiler {

namespace {

bool by_call(const runtime::TracedCall& a, const runtime::TracedCall& b) noexcept {
  return a.call < b.call;
}

}  // namespace

void WorkCorrelator::bind_unbound() {
  if (unbound_.empty() || calls_.empty()) return;
  auto still_unbound = unbound_.begin();
  for (const runtime::TracedWork& work : unbound_) {
    const auto found =
        std::lower_bound(calls_.begin(), calls_.end(), runtime::TracedCall{work.call, 0}, by_call);
    if (found != calls_.end() && found->call == work.call) {
      attributed_.push_back({found->interval, std::max<int64_t>(0, work.end_ns - work.start_ns)});
    } else {
      *still_unbound++ = work;
    }
  }
  unbound_.erase(still_unbound, unbound_.end());
}

void WorkCorrelator::add(runtime::TracedRecords& records) {
  dropped_ += records.dropped;
  if (!records.calls.empty()) {
    // Calls come mostly in order (a tracer numbers them as they are made): sorting is then a
    // check, and a late delivery a merge.
    const size_t old_size = calls_.size();
    calls_.insert(calls_.end(), records.calls.begin(), records.calls.end());
    const auto middle = calls_.begin() + static_cast<std::ptrdiff_t>(old_size);
    if (!std::is_sorted(middle, calls_.end(), by_call)) std::sort(middle, calls_.end(), by_call);
    if (old_size > 0 && by_call(*middle, *(middle - 1))) {
      std::inplace_merge(calls_.begin(), middle, calls_.end(), by_call);
    }
  }
  for (const runtime::TracedWork& work : records.work) {
    traced_ns_ += std::max<int64_t>(0, work.end_ns - work.start_ns);
  }
  unbound_.insert(unbound_.end(), records.work.begin(), records.work.end());
  bind_unbound();
  // Work outside every interval (CUDA work of the process that no brick queued) waits here for a
  // call that never comes, until the next resolve that has everything: bounded meanwhile.
  if (unbound_.size() > kMaxUnbound) {
    const size_t excess = unbound_.size() - kMaxUnbound / 2;
    unattributed_ += excess;
    unbound_.erase(unbound_.begin(), unbound_.begin() + static_cast<std::ptrdiff_t>(excess));
  }
  records.work.clear();
  records.calls.clear();
  records.dropped = 0;
}

void WorkCorrelator::resolve(std::vector<ClosedInterval>& closed, bool all_delivered,
                             std::vector<ResolvedInterval>* out) {
  // Children (larger ids) first, so each is in its parent's sum before the parent is taken.
  std::sort(closed.begin(), closed.end(),
            [](const ClosedInterval& a, const ClosedInterval& b) { return a.id > b.id; });
  // The attributed work in descending intervals too: one merge gives each closed interval its
  // own work; work of intervals still open stays for a later resolve.
  std::sort(attributed_.begin(), attributed_.end(),
            [](const Attributed& a, const Attributed& b) { return a.interval > b.interval; });
  auto work = attributed_.begin();
  auto kept = attributed_.begin();
  const auto is_closed = [&closed](uint64_t interval) {
    return std::binary_search(
        closed.begin(), closed.end(), ClosedInterval{interval, 0, 0},
        [](const ClosedInterval& a, const ClosedInterval& b) { return a.id > b.id; });
  };
  // The work not merged yet (from `work` on) is kept whatever happens below: an allocation
  // that fails midway leaves no record both consumed and kept.
  const auto keep_the_rest = [&] {
    kept = std::move(work, attributed_.end(), kept);
    attributed_.erase(kept, attributed_.end());
  };
  try {
    for (const ClosedInterval& interval : closed) {
      Sum total;
      for (; work != attributed_.end() && work->interval >= interval.id; ++work) {
        if (work->interval == interval.id) {
          total.ns += work->ns;
          ++total.work;
        } else {
          *kept++ = *work;  // an interval still open
        }
      }
      if (const auto nested = children_.find(interval.id); nested != children_.end()) {
        total.ns += nested->second.ns;
        total.work += nested->second.work;
        children_.erase(nested);
      }
      if (interval.parent != 0 && total.work > 0) {
        Sum& parent = children_[interval.parent];
        parent.ns += total.ns;
        parent.work += total.work;
      }
      out->push_back({interval.tag, total.ns, total.work});
    }
  } catch (...) {
    keep_the_rest();
    throw;
  }
  keep_the_rest();
  if (all_delivered) {
    // Nothing more will come for any call made so far: calls that queued no work (most API
    // calls inside a long brick) are not kept for later.
    calls_.clear();
  } else if (!closed.empty()) {
    // The calls of resolved intervals have delivered all their work: forget them.
    std::erase_if(calls_,
                  [&](const runtime::TracedCall& call) { return is_closed(call.interval); });
  }
  closed.clear();
  if (all_delivered) {
    unattributed_ += unbound_.size();
    unbound_.clear();
  }
}

void WorkCorrelator::reset() {
  calls_.clear();
  unbound_.clear();
  attributed_.clear();
  children_.clear();
  unattributed_ = 0;
  dropped_ = 0;
  traced_ns_ = 0;
}

}  // namespace brick::profiler
