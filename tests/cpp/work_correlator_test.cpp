// GoogleTest suite for the correlation of a device tracer's records with brick's intervals
// (profiler/work_correlator.h), on synthetic records: the orders, splits and losses a real
// tracer (CUPTI) delivers, without a GPU.
#include "profiler/work_correlator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

namespace {

using brick::profiler::ClosedInterval;
using brick::profiler::ResolvedInterval;
using brick::profiler::WorkCorrelator;
using brick::runtime::TracedCall;
using brick::runtime::TracedRecords;
using brick::runtime::TracedWork;

TracedWork work(uint32_t call, int64_t start, int64_t ns) { return {call, start, start + ns}; }

// tag -> (device ns, pieces of work), for the resolved intervals.
std::map<uint64_t, std::pair<int64_t, uint32_t>> by_tag(const std::vector<ResolvedInterval>& out) {
  std::map<uint64_t, std::pair<int64_t, uint32_t>> result;
  for (const ResolvedInterval& interval : out) {
    EXPECT_EQ(result.count(interval.tag), 0u) << "tag " << interval.tag << " resolved twice";
    result[interval.tag] = {interval.device_ns, interval.work};
  }
  return result;
}

TEST(WorkCorrelator, AnIntervalsTimeIsTheSumOfItsWorkNotTheSpanAcrossTheGapsBetween) {
  WorkCorrelator correlator;
  TracedRecords records;
  records.calls = {{1, 7}, {2, 7}};
  // Two kernels 100 us apart on the device (a starved stream): 3 us and 5 us of work.
  records.work = {work(1, 1'000, 3'000), work(2, 101'000, 5'000)};
  correlator.add(records);
  EXPECT_TRUE(records.work.empty() && records.calls.empty()) << "the records are taken";
  std::vector<ClosedInterval> closed = {{7, 0, 70}};
  std::vector<ResolvedInterval> out;
  correlator.resolve(closed, /*all_delivered=*/true, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].tag, 70u);
  EXPECT_EQ(out[0].device_ns, 8'000);
  EXPECT_EQ(out[0].work, 2u);
  EXPECT_TRUE(closed.empty());
  EXPECT_EQ(correlator.held(), 0u) << "nothing kept for a resolved interval";
  EXPECT_EQ(correlator.unattributed(), 0u);
}

TEST(WorkCorrelator, NestedIntervalsIncludeTheirChildrenWhateverOrderTheyAreHandedIn) {
  // A range (1) around aten::linear (2) around aten::addmm (3), then aten::relu (4) in the range.
  WorkCorrelator correlator;
  TracedRecords records;
  records.calls = {{10, 3}, {11, 3}, {12, 4}};
  records.work = {work(10, 0, 1'000), work(11, 2'000, 500), work(12, 5'000, 250)};
  correlator.add(records);
  std::vector<ClosedInterval> closed = {{1, 0, 100}, {4, 1, 400}, {2, 1, 200}, {3, 2, 300}};
  std::vector<ResolvedInterval> out;
  correlator.resolve(closed, true, &out);
  const auto sums = by_tag(out);
  EXPECT_EQ(sums.at(300), std::make_pair(int64_t{1'500}, 2u));
  EXPECT_EQ(sums.at(200), std::make_pair(int64_t{1'500}, 2u)) << "linear: addmm's work";
  EXPECT_EQ(sums.at(400), std::make_pair(int64_t{250}, 1u));
  EXPECT_EQ(sums.at(100), std::make_pair(int64_t{1'750}, 3u)) << "the range: everything in it";
  EXPECT_EQ(correlator.held(), 0u);
}

TEST(WorkCorrelator, AChildResolvedBeforeItsParentClosesIsCarriedIntoItLater) {
  WorkCorrelator correlator;
  TracedRecords records;
  records.calls = {{1, 2}, {2, 1}};
  records.work = {work(1, 0, 700), work(2, 1'000, 300)};
  correlator.add(records);
  std::vector<ClosedInterval> closed = {{2, 1, 20}};  // the parent (1) is still open
  std::vector<ResolvedInterval> out;
  correlator.resolve(closed, false, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].device_ns, 700);
  closed = {{1, 0, 10}};
  out.clear();
  correlator.resolve(closed, true, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].device_ns, 1'000) << "its own 300 ns and its child's 700";
  EXPECT_EQ(out[0].work, 2u);
  EXPECT_EQ(correlator.held(), 0u);
}

TEST(WorkCorrelator, WorkDeliveredBeforeItsCallIsAttributedOnceTheCallArrives) {
  WorkCorrelator correlator;
  TracedRecords first;
  first.work = {work(5, 0, 900)};  // the kernel's record came in the first buffer
  correlator.add(first);
  TracedRecords second;
  second.calls = {{5, 3}};  // its call's record in the next
  correlator.add(second);
  std::vector<ClosedInterval> closed = {{3, 0, 30}};
  std::vector<ResolvedInterval> out;
  correlator.resolve(closed, true, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].device_ns, 900);
  EXPECT_EQ(correlator.unattributed(), 0u);
}

TEST(WorkCorrelator, OneCallsManyPiecesOfWorkAllCountAsAGraphLaunchsNodesDo) {
  WorkCorrelator correlator;
  TracedRecords records;
  records.calls = {{9, 4}};
  for (int node = 0; node < 6; ++node) records.work.push_back(work(9, node * 1'000, 100));
  correlator.add(records);
  std::vector<ClosedInterval> closed = {{4, 0, 40}};
  std::vector<ResolvedInterval> out;
  correlator.resolve(closed, true, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].device_ns, 600);
  EXPECT_EQ(out[0].work, 6u);
}

TEST(WorkCorrelator, AnIntervalThatQueuedNothingHasNoDeviceTimeAndAddsNothingToItsParent) {
  WorkCorrelator correlator;
  std::vector<ClosedInterval> closed = {{2, 1, 20}, {1, 0, 10}};
  std::vector<ResolvedInterval> out;
  correlator.resolve(closed, true, &out);
  const auto sums = by_tag(out);
  EXPECT_EQ(sums.at(20), std::make_pair(int64_t{0}, 0u));
  EXPECT_EQ(sums.at(10), std::make_pair(int64_t{0}, 0u));
  EXPECT_EQ(correlator.held(), 0u);
}

TEST(WorkCorrelator, WorkNoIntervalQueuedIsCountedOnceEverythingIsDeliveredNeverGivenToABrick) {
  WorkCorrelator correlator;
  TracedRecords records;
  records.calls = {{1, 2}};
  records.work = {work(1, 0, 100), work(77, 0, 5'000)};  // call 77: outside every interval
  correlator.add(records);
  std::vector<ClosedInterval> closed = {{2, 0, 20}};
  std::vector<ResolvedInterval> out;
  correlator.resolve(closed, /*all_delivered=*/false, &out);
  EXPECT_EQ(out[0].device_ns, 100);
  EXPECT_EQ(correlator.unattributed(), 0u) << "its call may still come";
  std::vector<ClosedInterval> none;
  correlator.resolve(none, /*all_delivered=*/true, &out);
  EXPECT_EQ(correlator.unattributed(), 1u);
  EXPECT_EQ(correlator.held(), 0u);
}

TEST(WorkCorrelator, WorkWithoutACallIsBoundedAndTheExcessCounted) {
  WorkCorrelator correlator;
  TracedRecords records;
  const size_t pieces = WorkCorrelator::kMaxUnbound + 10;
  for (size_t i = 0; i < pieces; ++i) records.work.push_back(work(1'000'000, 0, 1));
  correlator.add(records);
  EXPECT_LE(correlator.held(), WorkCorrelator::kMaxUnbound);
  std::vector<ClosedInterval> none;
  std::vector<ResolvedInterval> out;
  correlator.resolve(none, true, &out);
  EXPECT_EQ(correlator.unattributed(), pieces) << "every piece counted once, dropped or not";
}

TEST(WorkCorrelator, TheTracersLossesAreCountedAndResetForgetsEverything) {
  WorkCorrelator correlator;
  TracedRecords records;
  records.dropped = 3;
  records.calls = {{1, 2}};
  records.work = {work(1, 0, 100), work(2, 0, 100)};
  correlator.add(records);
  EXPECT_EQ(correlator.dropped_by_tracer(), 3u);
  EXPECT_EQ(records.dropped, 0u);
  EXPECT_GT(correlator.held(), 0u);
  correlator.reset();
  EXPECT_EQ(correlator.held(), 0u);
  EXPECT_EQ(correlator.dropped_by_tracer(), 0u);
  std::vector<ClosedInterval> closed = {{2, 0, 20}};
  std::vector<ResolvedInterval> out;
  correlator.resolve(closed, true, &out);
  EXPECT_EQ(out[0].device_ns, 0) << "nothing of the last profile's work is kept";
}

// A decode-like stream of intervals on two threads (their ids interleaved, as a process-wide
// counter gives them), with records shuffled and split across deliveries and the intervals
// resolved in batches: every interval's sum is what was queued inside it.
TEST(WorkCorrelator, ShuffledSplitDeliveriesOfManyNestedIntervalsGiveEveryIntervalItsOwnWork) {
  std::mt19937 random(12345);
  WorkCorrelator correlator;
  struct Expected {
    uint64_t parent;
    int64_t ns = 0;
    uint32_t work = 0;
  };
  std::map<uint64_t, Expected> expected;  // interval id -> its sum, children's included
  std::vector<TracedCall> calls;
  std::vector<TracedWork> pieces;
  std::vector<ClosedInterval> closed_in_order;
  uint64_t next_id = 1;
  uint32_t next_call = 1;
  // Two threads, each in a range of 4 ops at a time, their opens interleaved; each op makes 0-2
  // calls of 0-3 pieces of work.
  for (int round = 0; round < 50; ++round) {
    const uint64_t ranges[2] = {next_id++, next_id++};
    expected[ranges[0]] = {0};
    expected[ranges[1]] = {0};
    for (int op = 0; op < 8; ++op) {
      const uint64_t range = ranges[op % 2];
      const uint64_t id = next_id++;
      expected[id] = {range};
      const int n_calls = static_cast<int>(random() % 3);
      for (int c = 0; c < n_calls; ++c) {
        const uint32_t call = next_call++;
        calls.push_back({call, id});
        const int n_pieces = static_cast<int>(random() % 4);
        for (int p = 0; p < n_pieces; ++p) {
          const int64_t ns = 100 + static_cast<int64_t>(random() % 10'000);
          pieces.push_back(work(call, static_cast<int64_t>(random() % 1'000'000), ns));
          for (uint64_t at = id; at != 0; at = expected[at].parent) {
            expected[at].ns += ns;
            ++expected[at].work;
          }
        }
      }
      closed_in_order.push_back({id, range, id * 10});
    }
    closed_in_order.push_back({ranges[1], 0, ranges[1] * 10});
    closed_in_order.push_back({ranges[0], 0, ranges[0] * 10});
  }
  std::shuffle(calls.begin(), calls.end(), random);
  std::shuffle(pieces.begin(), pieces.end(), random);
  // Deliver in 7 uneven parts; resolve a growing prefix of the closed intervals after each part
  // that has delivered all of that prefix's work (here: everything, once the last part is in).
  std::vector<ResolvedInterval> out;
  const size_t parts = 7;
  for (size_t part = 0; part < parts; ++part) {
    TracedRecords records;
    records.calls.assign(calls.begin() + part * calls.size() / parts,
                         calls.begin() + (part + 1) * calls.size() / parts);
    records.work.assign(pieces.begin() + part * pieces.size() / parts,
                        pieces.begin() + (part + 1) * pieces.size() / parts);
    correlator.add(records);
  }
  // Resolved in three batches in closing order, the way the observer hands them over.
  const size_t batch = closed_in_order.size() / 3 + 1;
  for (size_t first = 0; first < closed_in_order.size(); first += batch) {
    std::vector<ClosedInterval> closed(
        closed_in_order.begin() + first,
        closed_in_order.begin() + std::min(first + batch, closed_in_order.size()));
    correlator.resolve(closed, first + batch >= closed_in_order.size(), &out);
  }
  const auto sums = by_tag(out);
  ASSERT_EQ(sums.size(), expected.size());
  for (const auto& [id, want] : expected) {
    EXPECT_EQ(sums.at(id * 10), std::make_pair(want.ns, want.work)) << "interval " << id;
  }
  EXPECT_EQ(correlator.unattributed(), 0u);
  EXPECT_EQ(correlator.held(), 0u);
}

}  // namespace
