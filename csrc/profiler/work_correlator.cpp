#include "profiler/work_correlator.h"

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <unordered_set>

namespace brick::profiler {

void WorkCorrelator::attribute(const runtime::TracedWork& work, uint64_t interval) {
  Sum& sum = own_[interval];
  sum.ns += std::max<int64_t>(0, work.end_ns - work.start_ns);
  ++sum.work;
}

void WorkCorrelator::add(runtime::TracedRecords& records) {
  dropped_ += records.dropped;
  for (const runtime::TracedCall& call : records.calls) {
    interval_of_call_[call.call] = call.interval;
  }
  // Work whose call was named only now (its call record came in a later delivery).
  if (!records.calls.empty() && !unbound_.empty()) {
    auto still_unbound = unbound_.begin();
    for (const runtime::TracedWork& work : unbound_) {
      const auto found = interval_of_call_.find(work.call);
      if (found != interval_of_call_.end()) {
        attribute(work, found->second);
      } else {
        *still_unbound++ = work;
      }
    }
    unbound_.erase(still_unbound, unbound_.end());
  }
  for (const runtime::TracedWork& work : records.work) {
    const auto found = interval_of_call_.find(work.call);
    if (found != interval_of_call_.end()) {
      attribute(work, found->second);
    } else {
      unbound_.push_back(work);
    }
  }
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
  std::unordered_set<uint64_t> resolved;
  resolved.reserve(closed.size());
  for (const ClosedInterval& interval : closed) {
    Sum total;
    if (const auto own = own_.find(interval.id); own != own_.end()) {
      total = own->second;
      own_.erase(own);
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
    resolved.insert(interval.id);
  }
  closed.clear();
  // The calls of resolved intervals have delivered all their work: forget them.
  if (!resolved.empty()) {
    for (auto it = interval_of_call_.begin(); it != interval_of_call_.end();) {
      it = resolved.count(it->second) != 0 ? interval_of_call_.erase(it) : std::next(it);
    }
  }
  if (all_delivered) {
    unattributed_ += unbound_.size();
    unbound_.clear();
  }
}

void WorkCorrelator::reset() {
  own_.clear();
  children_.clear();
  interval_of_call_.clear();
  unbound_.clear();
  unattributed_ = 0;
  dropped_ = 0;
}

}  // namespace brick::profiler
