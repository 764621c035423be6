#include "profiler/work_correlator.h"

#include <algorithm>
#include <cstddef>
#include <iterator>

namespace brick::profiler {

namespace {

void add_to(WorkSum& into, const WorkSum& sum) noexcept {
  into.ns += sum.ns;
  into.work += sum.work;
}

}  // namespace

void WorkCorrelator::attribute(uint64_t interval, int64_t ns) {
  const auto thread = static_cast<uint32_t>(interval >> kSegmentBits);
  if (thread == 0) {  // not a segment of brick's
    ++unattributed_;
    return;
  }
  const uint64_t segment = interval & kSegmentMask;
  // Records come in runs of one thread's: its work and floor looked up once per run.
  if (thread != last_.thread) {
    last_ = {thread, floor_of(thread), nullptr};
  }
  // Below the floor: before every mark that will be asked about, so in none of their sums.
  if (segment < last_.floor) return;
  if (last_.work == nullptr) last_.work = &threads_[thread];  // (map nodes never move)
  ThreadWork& mine = *last_.work;
  if (!mine.segments.empty() && mine.segments.back().segment == segment) {
    mine.segments.back().sum.ns += ns;
    ++mine.segments.back().sum.work;
    if (mine.sorted == mine.segments.size()) mine.sorted = mine.segments.size() - 1;
    return;
  }
  mine.segments.push_back({segment, {ns, 1}});
}

void WorkCorrelator::bind_unbound() {
  if (unbound_.empty() || calls_.empty()) return;
  auto still_unbound = unbound_.begin();
  for (const runtime::TracedWork& work : unbound_) {
    const auto found = std::lower_bound(
        calls_.begin(), calls_.end(), work.call,
        [](const runtime::TracedCall& call, uint32_t id) noexcept { return call.call < id; });
    if (found != calls_.end() && found->call == work.call) {
      attribute(found->interval, std::max<int64_t>(0, work.end_ns - work.start_ns));
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
    const auto by_call = [](const runtime::TracedCall& a, const runtime::TracedCall& b) noexcept {
      return a.call < b.call;
    };
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
  // Work outside every segment (CUDA work of the process that brick did not trace) waits here
  // for a call that never comes, until the next settle that has everything: bounded meanwhile.
  if (unbound_.size() > kMaxUnbound) {
    const size_t excess = unbound_.size() - kMaxUnbound / 2;
    unattributed_ += excess;
    unbound_.erase(unbound_.begin(), unbound_.begin() + static_cast<std::ptrdiff_t>(excess));
  }
  records.work.clear();
  records.calls.clear();
  records.dropped = 0;
}

void WorkCorrelator::prepare(ThreadWork& thread) {
  auto& segments = thread.segments;
  if (thread.sorted == segments.size() && thread.running.size() == segments.size() + 1) return;
  const auto by_segment = [](const Segment& a, const Segment& b) noexcept {
    return a.segment < b.segment;
  };
  const auto middle = segments.begin() + static_cast<std::ptrdiff_t>(thread.sorted);
  if (!std::is_sorted(middle, segments.end(), by_segment)) {
    std::sort(middle, segments.end(), by_segment);
  }
  std::inplace_merge(segments.begin(), middle, segments.end(), by_segment);
  // One entry per segment (a segment's work may come in several deliveries).
  size_t kept = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    if (kept > 0 && segments[kept - 1].segment == segments[i].segment) {
      add_to(segments[kept - 1].sum, segments[i].sum);
    } else {
      segments[kept++] = segments[i];
    }
  }
  segments.resize(kept);
  thread.sorted = segments.size();
  thread.running.resize(segments.size() + 1);
  thread.running[0] = thread.folded;
  for (size_t i = 0; i < segments.size(); ++i) {
    thread.running[i + 1] = thread.running[i];
    add_to(thread.running[i + 1], segments[i].sum);
  }
}

WorkSum WorkCorrelator::before(ThreadWork& thread, uint64_t segment) {
  prepare(thread);
  const auto found =
      std::lower_bound(thread.segments.begin(), thread.segments.end(), segment,
                       [](const Segment& s, uint64_t id) noexcept { return s.segment < id; });
  return thread.running[static_cast<size_t>(found - thread.segments.begin())];
}

WorkSum WorkCorrelator::between(WorkMark from, WorkMark to) {
  if (from.thread == 0 || from.thread != to.thread) return {};
  const auto found = threads_.find(from.thread);
  if (found == threads_.end()) return {};
  const WorkSum end = before(found->second, to.segment);
  const WorkSum start = before(found->second, from.segment);
  return {end.ns - start.ns, end.work - start.work};
}

void WorkCorrelator::resolve(std::vector<ClosedInterval>& closed,
                             std::vector<ResolvedInterval>* out) {
  // Children (larger ids) first, so each is carried into its parent before the parent is taken.
  std::sort(closed.begin(), closed.end(),
            [](const ClosedInterval& a, const ClosedInterval& b) { return a.id > b.id; });
  out->reserve(out->size() + closed.size());
  for (const ClosedInterval& brick : closed) {
    WorkSum total = between(brick.open, {brick.open.thread, brick.close_segment});
    WorkSum elsewhere;  // what other threads' bricks nested in it queued
    if (const auto nested = carried_.find(brick.id); nested != carried_.end()) {
      elsewhere = nested->second;
      carried_.erase(nested);
    }
    add_to(total, elsewhere);
    // A parent on this thread has this brick's own work in its own marks: only what came from
    // elsewhere is carried to it. A parent on another thread gets it all.
    const WorkSum& to_parent = brick.parent_elsewhere ? total : elsewhere;
    if (brick.parent != 0 && to_parent.work > 0) add_to(carried_[brick.parent], to_parent);
    out->push_back({brick.tag, total.ns, total.work});
  }
  closed.clear();
}

uint64_t WorkCorrelator::floor_of(uint32_t thread) const noexcept {
  const auto found = floors_.find(thread);
  return found == floors_.end() ? 0 : found->second;
}

void WorkCorrelator::fold(uint32_t thread, uint64_t floor) {
  if (floor <= floor_of(thread)) return;
  last_ = {};
  floors_[thread] = floor;
  const auto found = threads_.find(thread);
  if (found == threads_.end()) return;
  if (floor == kNoFloor) {
    threads_.erase(found);
    return;
  }
  ThreadWork& mine = found->second;
  prepare(mine);
  const auto end =
      std::lower_bound(mine.segments.begin(), mine.segments.end(), floor,
                       [](const Segment& s, uint64_t id) noexcept { return s.segment < id; });
  const auto folded = static_cast<size_t>(end - mine.segments.begin());
  mine.folded = mine.running[folded];
  if (folded == 0) return;
  mine.segments.erase(mine.segments.begin(), end);
  mine.running.erase(mine.running.begin(),
                     mine.running.begin() + static_cast<std::ptrdiff_t>(folded));
  mine.sorted = mine.segments.size();
}

std::vector<uint32_t> WorkCorrelator::threads() const {
  std::vector<uint32_t> out;
  out.reserve(threads_.size());
  for (const auto& [thread, work] : threads_) out.push_back(thread);
  return out;
}

void WorkCorrelator::settle(bool all_delivered) {
  if (all_delivered) {
    calls_.clear();
    unattributed_ += unbound_.size();
    unbound_.clear();
    return;
  }
  std::erase_if(calls_, [this](const runtime::TracedCall& call) {
    return (call.interval & kSegmentMask) <
           floor_of(static_cast<uint32_t>(call.interval >> kSegmentBits));
  });
}

size_t WorkCorrelator::held() const noexcept {
  size_t segments = 0;
  for (const auto& [thread, work] : threads_) segments += work.segments.size();
  return segments + calls_.size() + unbound_.size() + carried_.size();
}

void WorkCorrelator::reset() {
  last_ = {};
  threads_.clear();
  floors_.clear();
  calls_.clear();
  unbound_.clear();
  carried_.clear();
  unattributed_ = 0;
  dropped_ = 0;
  traced_ns_ = 0;
}

}  // namespace brick::profiler
