// GoogleTest suite for traced device time (profiler/work_correlator.h): the correlation of a
// device tracer's records with threads' work marks (runtime/work_marks.h), on synthetic
// records with the orders, splits and losses a real tracer (CUPTI) delivers, without a GPU.
#include "profiler/work_correlator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

namespace {

using brick::profiler::ClosedInterval;
using brick::profiler::kNoFloor;
using brick::profiler::ResolvedInterval;
using brick::profiler::segment_interval;
using brick::profiler::WorkCorrelator;
using brick::profiler::WorkMark;
using brick::profiler::WorkSum;
using brick::runtime::TracedCall;
using brick::runtime::TracedRecords;
using brick::runtime::TracedWork;

TracedWork work(uint32_t call, int64_t start, int64_t ns) { return {call, start, start + ns}; }

// One thread's stream of work as runtime/work_marks.cpp cuts it: a mark starts a new segment
// where work was queued since the segment began. Its calls and their work go to `records`.
class SimulatedThread {
 public:
  SimulatedThread(uint32_t number, uint32_t* next_call) : number_(number), next_call_(next_call) {}

  WorkMark mark() {
    if (dirty_ || segment_ == 0) {
      ++segment_;
      dirty_ = false;
    }
    return {number_, segment_};
  }
  // One host call that queues a piece of work of each of `durations`.
  void call(const std::vector<int64_t>& durations, TracedRecords* records, int64_t start = 0) {
    if (segment_ == 0) mark();
    const uint32_t id = (*next_call_)++;
    records->calls.push_back({id, segment_interval(number_, segment_)});
    for (const int64_t ns : durations) {
      records->work.push_back(work(id, start, ns));
      start += ns + 1'000;
    }
    dirty_ = true;
  }
  uint32_t number() const { return number_; }

 private:
  uint32_t number_;
  uint32_t* next_call_;
  uint64_t segment_ = 0;
  bool dirty_ = false;
};

ClosedInterval brick(uint64_t id, uint64_t parent, WorkMark open, WorkMark close,
                     bool parent_elsewhere = false) {
  return {id, parent, id * 10, open, close.segment, parent_elsewhere};
}

// tag -> (device ns, pieces of work), for the resolved bricks.
std::map<uint64_t, std::pair<int64_t, uint32_t>> by_tag(const std::vector<ResolvedInterval>& out) {
  std::map<uint64_t, std::pair<int64_t, uint32_t>> result;
  for (const ResolvedInterval& interval : out) {
    EXPECT_EQ(result.count(interval.tag), 0u) << "tag " << interval.tag << " resolved twice";
    result[interval.tag] = {interval.device_ns, interval.work};
  }
  return result;
}

TEST(WorkCorrelator, TheWorkBetweenTwoMarksIsTheSumOfItsDurationsNotTheSpanAcrossTheGaps) {
  uint32_t calls = 1;
  SimulatedThread thread(1, &calls);
  TracedRecords records;
  const WorkMark open = thread.mark();
  // Two kernels 100 us apart on the device (a starved stream): 3 us and 5 us of work.
  thread.call({3'000}, &records, 1'000);
  thread.call({5'000}, &records, 101'000);
  const WorkMark close = thread.mark();
  WorkCorrelator correlator;
  correlator.add(records);
  EXPECT_TRUE(records.work.empty() && records.calls.empty()) << "the records are taken";
  const WorkSum sum = correlator.between(open, close);
  EXPECT_EQ(sum.ns, 8'000);
  EXPECT_EQ(sum.work, 2u);
  EXPECT_EQ(correlator.between(close, thread.mark()).work, 0u) << "nothing after the close";
  std::vector<ClosedInterval> closed = {brick(7, 0, open, close)};
  std::vector<ResolvedInterval> out;
  correlator.resolve(closed, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].tag, 70u);
  EXPECT_EQ(out[0].device_ns, 8'000);
  EXPECT_TRUE(closed.empty());
  EXPECT_EQ(correlator.unattributed(), 0u);
}

TEST(WorkCorrelator, NestedBricksOnOneThreadIncludeTheirChildrenWhateverOrderTheyAreHandedIn) {
  // A range (1) around aten::linear (2) around aten::t (3, no work) and aten::addmm (4), then
  // aten::relu (5) in the range.
  uint32_t calls = 1;
  SimulatedThread thread(1, &calls);
  TracedRecords records;
  const WorkMark range_open = thread.mark();
  const WorkMark linear_open = thread.mark();
  const WorkMark t_open = thread.mark();
  const WorkMark t_close = thread.mark();
  const WorkMark addmm_open = thread.mark();
  thread.call({1'000, 500}, &records);
  const WorkMark addmm_close = thread.mark();
  const WorkMark linear_close = thread.mark();
  const WorkMark relu_open = thread.mark();
  thread.call({250}, &records);
  const WorkMark relu_close = thread.mark();
  const WorkMark range_close = thread.mark();
  EXPECT_EQ(range_open.segment, t_close.segment) << "marks with no work between share a segment";
  WorkCorrelator correlator;
  correlator.add(records);
  std::vector<ClosedInterval> closed = {
      brick(1, 0, range_open, range_close), brick(5, 1, relu_open, relu_close),
      brick(2, 1, linear_open, linear_close), brick(4, 2, addmm_open, addmm_close),
      brick(3, 2, t_open, t_close)};
  std::vector<ResolvedInterval> out;
  correlator.resolve(closed, &out);
  const auto sums = by_tag(out);
  EXPECT_EQ(sums.at(40), std::make_pair(int64_t{1'500}, 2u));
  EXPECT_EQ(sums.at(30), std::make_pair(int64_t{0}, 0u)) << "a view queues nothing";
  EXPECT_EQ(sums.at(20), std::make_pair(int64_t{1'500}, 2u)) << "linear: addmm's work";
  EXPECT_EQ(sums.at(50), std::make_pair(int64_t{250}, 1u));
  EXPECT_EQ(sums.at(10), std::make_pair(int64_t{1'750}, 3u)) << "the range: everything in it";
}

TEST(WorkCorrelator, AnotherThreadsBrickNestedInARangeIsCarriedIntoItAndItsAncestorsLater) {
  // The autograd engine's thread (2) runs a backward node inside `backward` (thread 1), itself
  // inside `step`: the node resolves in one batch, the ranges (still open) in the next.
  uint32_t calls = 1;
  SimulatedThread owner(1, &calls);
  SimulatedThread engine(2, &calls);
  TracedRecords records;
  const WorkMark step_open = owner.mark();
  owner.call({300}, &records);
  const WorkMark backward_open = owner.mark();
  const WorkMark node_open = engine.mark();
  engine.call({700}, &records);
  const WorkMark node_close = engine.mark();
  WorkCorrelator correlator;
  correlator.add(records);
  std::vector<ClosedInterval> closed = {brick(3, 2, node_open, node_close, true)};
  std::vector<ResolvedInterval> out;
  correlator.resolve(closed, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].device_ns, 700);
  const WorkMark backward_close = owner.mark();
  const WorkMark step_close = owner.mark();
  closed = {brick(1, 0, step_open, step_close), brick(2, 1, backward_open, backward_close)};
  out.clear();
  correlator.resolve(closed, &out);
  const auto sums = by_tag(out);
  EXPECT_EQ(sums.at(20), std::make_pair(int64_t{700}, 1u)) << "backward: the engine's node";
  EXPECT_EQ(sums.at(10), std::make_pair(int64_t{1'000}, 2u))
      << "step: its own 300 ns and, through backward, the node's 700";
  correlator.settle(true);
  EXPECT_EQ(correlator.held(), 2u) << "only the two threads' segments: nothing carried is left";
}

TEST(WorkCorrelator, WorkDeliveredBeforeItsCallIsAttributedOnceTheCallArrives) {
  uint32_t calls = 1;
  SimulatedThread thread(1, &calls);
  TracedRecords made;
  const WorkMark open = thread.mark();
  thread.call({900}, &made);
  const WorkMark close = thread.mark();
  WorkCorrelator correlator;
  TracedRecords first;
  first.work = made.work;  // the kernel's record came in the first buffer
  correlator.add(first);
  EXPECT_EQ(correlator.between(open, close).work, 0u);
  TracedRecords second;
  second.calls = made.calls;  // its call's record in the next
  correlator.add(second);
  EXPECT_EQ(correlator.between(open, close).ns, 900);
  correlator.settle(/*all_delivered=*/true);
  EXPECT_EQ(correlator.unattributed(), 0u);
}

TEST(WorkCorrelator, OneCallsManyPiecesOfWorkAllCountAsAGraphLaunchsNodesDo) {
  uint32_t calls = 1;
  SimulatedThread thread(1, &calls);
  TracedRecords records;
  const WorkMark open = thread.mark();
  thread.call({100, 100, 100, 100, 100, 100}, &records);
  const WorkMark close = thread.mark();
  WorkCorrelator correlator;
  correlator.add(records);
  const WorkSum sum = correlator.between(open, close);
  EXPECT_EQ(sum.ns, 600);
  EXPECT_EQ(sum.work, 6u);
}

TEST(WorkCorrelator, WorkOutsideEverySegmentIsCountedOnceEverythingIsDeliveredNeverGivenToABrick) {
  uint32_t calls = 1;
  SimulatedThread thread(1, &calls);
  TracedRecords records;
  const WorkMark open = thread.mark();
  thread.call({100}, &records);
  const WorkMark close = thread.mark();
  records.work.push_back(work(77, 0, 5'000));  // call 77: made outside every segment
  records.calls.push_back({78, 5});            // a call of no thread of brick's
  records.work.push_back(work(78, 0, 5'000));
  WorkCorrelator correlator;
  correlator.add(records);
  EXPECT_EQ(correlator.between(open, close).ns, 100);
  EXPECT_EQ(correlator.unattributed(), 1u) << "the call that names no segment";
  correlator.settle(/*all_delivered=*/false);
  EXPECT_EQ(correlator.unattributed(), 1u) << "call 77 may still come";
  correlator.settle(/*all_delivered=*/true);
  EXPECT_EQ(correlator.unattributed(), 2u);
  EXPECT_EQ(correlator.traced_ns(), 10'100) << "all the work traced, attributed or not";
}

TEST(WorkCorrelator, WorkWithoutACallIsBoundedAndTheExcessCounted) {
  WorkCorrelator correlator;
  TracedRecords records;
  const size_t pieces = WorkCorrelator::kMaxUnbound + 10;
  for (size_t i = 0; i < pieces; ++i) records.work.push_back(work(1'000'000, 0, 1));
  correlator.add(records);
  EXPECT_LE(correlator.held(), WorkCorrelator::kMaxUnbound);
  correlator.settle(true);
  EXPECT_EQ(correlator.unattributed(), pieces) << "every piece counted once, dropped or not";
  EXPECT_EQ(correlator.held(), 0u);
}

TEST(WorkCorrelator, CallsOfFoldedSegmentsAreForgottenAndAllOfThemOnceEverythingIsDelivered) {
  uint32_t calls = 1;
  SimulatedThread thread(1, &calls);
  TracedRecords records;
  thread.mark();
  thread.call({100}, &records);
  thread.call({}, &records);  // an API call that queued no work
  const WorkMark floor = thread.mark();
  thread.call({}, &records);  // one made after the floor: its work may still come
  thread.call({5}, &records);
  WorkCorrelator correlator;
  correlator.add(records);
  EXPECT_EQ(correlator.held(), 6u) << "two segments, four calls";
  correlator.settle(false);
  EXPECT_EQ(correlator.held(), 6u) << "no floor yet: every call may have work to come";
  correlator.fold(thread.number(), floor.segment);
  correlator.settle(false);
  EXPECT_EQ(correlator.held(), 3u) << "the folded segment and its two calls are forgotten";
  correlator.settle(true);
  EXPECT_EQ(correlator.held(), 1u);
}

TEST(WorkCorrelator, TheTracersLossesAreCountedAndResetForgetsEverything) {
  uint32_t calls = 1;
  SimulatedThread thread(1, &calls);
  TracedRecords records;
  records.dropped = 3;
  const WorkMark open = thread.mark();
  thread.call({100}, &records);
  const WorkMark close = thread.mark();
  WorkCorrelator correlator;
  correlator.add(records);
  EXPECT_EQ(correlator.dropped_by_tracer(), 3u);
  EXPECT_EQ(records.dropped, 0u);
  EXPECT_GT(correlator.held(), 0u);
  correlator.reset();
  EXPECT_EQ(correlator.held(), 0u);
  EXPECT_EQ(correlator.dropped_by_tracer(), 0u);
  EXPECT_EQ(correlator.between(open, close).ns, 0) << "nothing of the last profile's work is kept";
}

TEST(WorkCorrelator, FoldingBelowAFloorKeepsEveryLaterMarksSumsAndForgetsTheRest) {
  uint32_t calls = 1;
  SimulatedThread thread(1, &calls);
  TracedRecords records;
  std::vector<WorkMark> marks = {thread.mark()};
  for (int64_t ns = 1; ns <= 100; ++ns) {
    thread.call({ns}, &records);
    marks.push_back(thread.mark());
  }
  WorkCorrelator correlator;
  correlator.add(records);
  correlator.settle(true);
  EXPECT_EQ(correlator.between(marks[50], marks[60]).ns,
            51 + 52 + 53 + 54 + 55 + 56 + 57 + 58 + 59 + 60);
  correlator.fold(thread.number(), marks[50].segment);
  EXPECT_EQ(correlator.held(), 50u);
  EXPECT_EQ(correlator.between(marks[50], marks[60]).ns,
            51 + 52 + 53 + 54 + 55 + 56 + 57 + 58 + 59 + 60);
  EXPECT_EQ(correlator.between(marks[90], marks[100]).work, 10u);
  // A late record for a folded segment: below every mark still asked about, in none of their sums.
  TracedRecords late;
  late.calls = {{calls, segment_interval(thread.number(), marks[3].segment)}};
  late.work = {work(calls, 0, 1'000'000)};
  correlator.add(late);
  EXPECT_EQ(correlator.between(marks[50], marks[100]).ns, (51 + 100) * 50 / 2);
  correlator.fold(thread.number(), kNoFloor);
  correlator.settle(false);
  EXPECT_EQ(correlator.held(), 0u) << "the thread done: its segments and calls forgotten";
  EXPECT_TRUE(correlator.threads().empty());
  correlator.add(late);  // a record of a thread that is done creates nothing
  correlator.settle(false);
  EXPECT_EQ(correlator.held(), 0u);
  EXPECT_TRUE(correlator.threads().empty());
}

// A decode-like stream on two threads: each runs ranges of ops (some with no work, some with
// several calls), the engine-like second thread's ops nested in the first thread's ranges; the
// records shuffled and split across deliveries, the bricks resolved in batches with the threads
// folded between them: every brick's sum is what was queued inside it.
TEST(WorkCorrelator, ShuffledSplitDeliveriesOfManyNestedBricksGiveEveryBrickItsOwnWork) {
  std::mt19937 random(12345);
  uint32_t next_call = 1;
  SimulatedThread threads[2] = {SimulatedThread(1, &next_call), SimulatedThread(2, &next_call)};
  struct Expected {
    uint64_t parent;
    int64_t ns = 0;
    uint32_t work = 0;
  };
  std::map<uint64_t, Expected> expected;  // brick id -> its sum, nested bricks' included
  TracedRecords all;
  std::vector<std::vector<ClosedInterval>> batches(1);
  uint64_t next_id = 1;
  for (int round = 0; round < 60; ++round) {
    // A range on thread 1; inside it ops of thread 1 and of thread 2 (parent elsewhere).
    const uint64_t range = next_id++;
    expected[range] = {0};
    const WorkMark range_open = threads[0].mark();
    for (int op = 0; op < 8; ++op) {
      SimulatedThread& thread = threads[op % 2];
      const uint64_t id = next_id++;
      expected[id] = {range};
      const WorkMark open = thread.mark();
      const int n_calls = static_cast<int>(random() % 3);
      for (int c = 0; c < n_calls; ++c) {
        const int n_pieces = static_cast<int>(random() % 4);
        std::vector<int64_t> durations;
        for (int p = 0; p < n_pieces; ++p) {
          durations.push_back(100 + static_cast<int64_t>(random() % 10'000));
        }
        for (const int64_t ns : durations) {
          for (uint64_t at = id; at != 0; at = expected[at].parent) {
            expected[at].ns += ns;
            ++expected[at].work;
          }
        }
        thread.call(durations, &all, static_cast<int64_t>(random() % 1'000'000));
      }
      batches.back().push_back(brick(id, range, open, thread.mark(), op % 2 == 1));
      if (random() % 5 == 0) batches.emplace_back();
    }
    batches.back().push_back(brick(range, 0, range_open, threads[0].mark()));
  }
  std::shuffle(all.calls.begin(), all.calls.end(), random);
  std::shuffle(all.work.begin(), all.work.end(), random);
  WorkCorrelator correlator;
  const size_t parts = 7;
  for (size_t part = 0; part < parts; ++part) {
    TracedRecords records;
    records.calls.assign(all.calls.begin() + part * all.calls.size() / parts,
                         all.calls.begin() + (part + 1) * all.calls.size() / parts);
    records.work.assign(all.work.begin() + part * all.work.size() / parts,
                        all.work.begin() + (part + 1) * all.work.size() / parts);
    correlator.add(records);
  }
  std::vector<ResolvedInterval> out;
  for (std::vector<ClosedInterval>& batch : batches) {
    // The floor of each thread: the lowest open mark among the bricks not resolved yet.
    std::map<uint32_t, uint64_t> floors;
    for (const auto* later = &batch + 1; later < batches.data() + batches.size(); ++later) {
      for (const ClosedInterval& b : *later) {
        auto [at, fresh] = floors.emplace(b.open.thread, b.open.segment);
        if (!fresh) at->second = std::min(at->second, b.open.segment);
      }
    }
    correlator.resolve(batch, &out);
    correlator.settle(false);
    for (const uint32_t thread : correlator.threads()) {
      const auto floor = floors.find(thread);
      correlator.fold(thread, floor == floors.end() ? kNoFloor : floor->second);
    }
  }
  const auto sums = by_tag(out);
  ASSERT_EQ(sums.size(), expected.size());
  for (const auto& [id, want] : expected) {
    EXPECT_EQ(sums.at(id * 10), std::make_pair(want.ns, want.work)) << "brick " << id;
  }
  correlator.settle(true);
  EXPECT_EQ(correlator.unattributed(), 0u);
  EXPECT_EQ(correlator.held(), 0u);
}

}  // namespace
