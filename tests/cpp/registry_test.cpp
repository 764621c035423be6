// GoogleTest suite for the brick registry on its own (no torch, no runtime).
//
// Every test builds its own Registry, so no test depends on another's counts; several tests use
// more than one registry at a time, which also checks that registries are independent.
#include "registry/registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "registry/clock.h"
#include "test_util.h"

namespace brick::registry {
namespace {

// Runs `fn`, expects it to throw brick::registry::Error, and returns the message.
template <typename Fn>
std::string error_message(Fn&& fn) {
  return brick::test::thrown_message<Error>(fn, "brick::registry::Error");
}

// prefix followed by the decimal number (not `"literal" + std::to_string(n)`, which trips a
// false -Wrestrict warning in GCC 12 at -O3).
std::string numbered(const char* prefix, int64_t number) {
  std::string text(prefix);
  text += std::to_string(number);
  return text;
}

// The snapshot entry for `node`, or null.
const BrickStats* find(const std::vector<BrickStats>& stats, NodeId node) {
  for (const BrickStats& s : stats) {
    if (s.node == node) return &s;
  }
  return nullptr;
}

uint64_t count_of(const Registry& registry, NodeId node) {
  const auto stats = registry.snapshot().nodes;
  const BrickStats* s = find(stats, node);
  return s == nullptr ? 0 : s->count;
}

// The sum of every node's count in a snapshot.
uint64_t total_count(const std::vector<BrickStats>& stats) {
  uint64_t sum = 0;
  for (const BrickStats& s : stats) sum += s.count;
  return sum;
}

uint64_t total_count(const Registry& registry) { return total_count(registry.snapshot().nodes); }

// Steps two threads through numbered phases: one advances, the other waits for a phase.
class Phases {
 public:
  void advance_to(int phase) {
    std::lock_guard<std::mutex> lock(mutex_);
    phase_ = phase;
    cv_.notify_all();
  }
  void wait_for(int phase) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return phase_ >= phase; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int phase_ = 0;
};

// ---- names ----

TEST(RegistryNames, KindAndSyncModeNames) {
  EXPECT_STREQ(kind_name(Kind::Op), "op");
  EXPECT_STREQ(kind_name(Kind::Range), "range");
  EXPECT_STREQ(kind_name(Kind::Host), "host");
  EXPECT_STREQ(sync_mode_name(SyncMode::Immediate), "immediate");
  EXPECT_STREQ(sync_mode_name(SyncMode::Deferred), "deferred");
  EXPECT_STREQ(sync_mode_name(SyncMode::Event), "event");
}

TEST(RegistryNames, ParseSyncModeIsCaseInsensitive) {
  EXPECT_EQ(parse_sync_mode("immediate"), SyncMode::Immediate);
  EXPECT_EQ(parse_sync_mode("Deferred"), SyncMode::Deferred);
  EXPECT_EQ(parse_sync_mode("EVENT"), SyncMode::Event);
  for (SyncMode mode : {SyncMode::Immediate, SyncMode::Deferred, SyncMode::Event}) {
    EXPECT_EQ(parse_sync_mode(sync_mode_name(mode)), mode);
  }
}

TEST(RegistryNames, ParseSyncModeRejectsUnknownText) {
  for (const char* bad : {"", "sync", "immediately", " event"}) {
    try {
      parse_sync_mode(bad);
      ADD_FAILURE() << "no exception for '" << bad << "'";
    } catch (const std::invalid_argument& error) {
      EXPECT_CONTAINS(error.what(), std::string("'") + bad + "'");
      EXPECT_CONTAINS(error.what(), "immediate");
      EXPECT_CONTAINS(error.what(), "deferred");
      EXPECT_CONTAINS(error.what(), "event");
    }
  }
}

// ---- intern ----

TEST(RegistryIntern, SameParentAndNameGiveTheSameNode) {
  Registry registry;
  const NodeId a = registry.intern(kNoParent, "a", Kind::Range, -1);
  const NodeId b = registry.intern(a, "b", Kind::Range, -1);
  const NodeId c = registry.intern(b, "c", Kind::Op, 0);
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(b, 1u);
  EXPECT_EQ(c, 2u);
  EXPECT_EQ(registry.intern(kNoParent, "a", Kind::Range, -1), a);
  EXPECT_EQ(registry.intern(a, "b", Kind::Range, -1), b);
  EXPECT_EQ(registry.intern(b, "c", Kind::Op, 0), c);
  // The same name under another parent is another node.
  const NodeId top_c = registry.intern(kNoParent, "c", Kind::Op, 0);
  const NodeId a_c = registry.intern(a, "c", Kind::Op, 0);
  EXPECT_NE(top_c, c);
  EXPECT_NE(a_c, c);
  EXPECT_NE(a_c, top_c);
  EXPECT_EQ(registry.node_count(), 5u);
}

TEST(RegistryIntern, PathsDepthsAndKinds) {
  Registry registry;
  const NodeId a = registry.intern(kNoParent, "train", Kind::Range, -1);
  const NodeId b = registry.intern(a, "forward", Kind::Range, -1);
  const NodeId c = registry.intern(b, "aten::addmm", Kind::Op, 1);
  // Another device is another node, and so is another kind.
  EXPECT_NE(registry.intern(b, "aten::addmm", Kind::Op, 3), c);
  EXPECT_NE(registry.intern(b, "aten::addmm", Kind::Host, 1), c);
  EXPECT_EQ(registry.intern(b, "aten::addmm", Kind::Op, 1), c);
  for (NodeId node : {a, b, c}) registry.record(node, 10);
  const auto stats = registry.snapshot().nodes;
  ASSERT_EQ(stats.size(), 3u);
  EXPECT_EQ(stats[0].path, "train");
  EXPECT_EQ(stats[0].name, "train");
  EXPECT_EQ(stats[0].depth, 0);
  EXPECT_EQ(stats[0].parent, kNoParent);
  EXPECT_EQ(stats[0].kind, Kind::Range);
  EXPECT_EQ(stats[0].device, -1);
  EXPECT_EQ(stats[1].path, "train/forward");
  EXPECT_EQ(stats[1].depth, 1);
  EXPECT_EQ(stats[1].parent, a);
  EXPECT_EQ(stats[2].path, "train/forward/aten::addmm");
  EXPECT_EQ(stats[2].name, "aten::addmm");
  EXPECT_EQ(stats[2].depth, 2);
  EXPECT_EQ(stats[2].parent, b);
  EXPECT_EQ(stats[2].kind, Kind::Op);
  EXPECT_EQ(stats[2].device, 1);
}

TEST(RegistryIntern, TwinHasTheNodesNameParentAndDeviceInAnotherKind) {
  Registry registry;
  const NodeId range = registry.intern(kNoParent, "step", Kind::Range, -1);
  const NodeId op = registry.intern(range, "aten::mm", Kind::Op, 2);
  const NodeId host = registry.twin(op, Kind::Host);
  EXPECT_NE(host, op);
  EXPECT_EQ(registry.twin(op, Kind::Host), host);  // interned once
  EXPECT_EQ(registry.intern(range, "aten::mm", Kind::Host, 2), host);
  EXPECT_EQ(registry.twin(op, Kind::Op), op);
  EXPECT_EQ(registry.twin(host, Kind::Op), op);
  registry.record(op, 5);
  registry.record(host, 7);
  const auto nodes = registry.snapshot().nodes;
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[1].kind, Kind::Host);
  EXPECT_EQ(nodes[1].path, "step/aten::mm");
  EXPECT_EQ(nodes[1].parent, range);
  EXPECT_EQ(nodes[1].device, 2);
  EXPECT_EQ(nodes[1].total_ns, 7);
  EXPECT_EQ(nodes[0].total_ns, 5);
  const auto names = registry.snapshot().by_name();
  ASSERT_EQ(names.size(), 2u);  // the op and its host calls stay apart by name too
  EXPECT_THROW(registry.twin(99, Kind::Host), Error);
}

TEST(RegistryIntern, InvalidArgumentsThrow) {
  Registry registry;
  EXPECT_CONTAINS(error_message([&] { registry.intern(kNoParent, "", Kind::Op, 0); }), "empty");
  EXPECT_CONTAINS(error_message([&] { registry.intern(7, "x", Kind::Op, 0); }), "parent node 7");
  const NodeId a = registry.intern(kNoParent, "a", Kind::Op, 0);
  EXPECT_CONTAINS(error_message([&] { registry.intern(a + 1, "x", Kind::Op, 0); }),
                  numbered("parent node ", a + 1));
  EXPECT_CONTAINS(error_message([&] { registry.intern(a, "", Kind::Op, 0); }), "empty");
  EXPECT_EQ(registry.node_count(), 1u);  // nothing half-created
}

TEST(RegistryIntern, ConcurrentInternsAgree) {
  Registry registry;
  constexpr int kThreads = 4, kNames = 200;
  std::vector<std::vector<NodeId>> ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const NodeId root = registry.intern(kNoParent, "root", Kind::Range, -1);
      for (int i = 0; i < kNames; ++i) {
        ids[t].push_back(registry.intern(root, numbered("n", i), Kind::Op, 0));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 1; t < kThreads; ++t) EXPECT_EQ(ids[t], ids[0]);
  EXPECT_EQ(registry.node_count(), static_cast<size_t>(kNames + 1));
}

// ---- record and snapshot ----

TEST(RegistryRecord, CountsAreExact) {
  Registry registry;
  const NodeId node = registry.intern(kNoParent, "op", Kind::Op, 0);
  int64_t total = 0;
  constexpr int kRecords = 1000;
  for (int i = 0; i < kRecords; ++i) {
    const int64_t ns = 100 + (i * 37) % 500;
    registry.record(node, ns);
    total += ns;
  }
  registry.record(node, 321);
  total += 321;
  const auto stats = registry.snapshot().nodes;
  ASSERT_EQ(stats.size(), 1u);
  const BrickStats& s = stats[0];
  EXPECT_EQ(s.node, node);
  EXPECT_EQ(s.count, kRecords + 1u);
  EXPECT_EQ(s.total_ns, total);
  EXPECT_EQ(s.min_ns, 100);
  EXPECT_EQ(s.max_ns, 599);
  EXPECT_EQ(s.last_ns, 321);
  EXPECT_EQ(s.histogram.total(), s.count);
  EXPECT_DOUBLE_EQ(s.avg_us(), static_cast<double>(total) / (kRecords + 1) / 1000.0);
}

TEST(RegistryRecord, NegativeDurationsRecordAsZero) {
  Registry registry;
  const NodeId node = registry.intern(kNoParent, "op", Kind::Op, 0);
  registry.record(node, -5);
  registry.record(node, 7);
  const auto stats = registry.snapshot().nodes;
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].count, 2u);
  EXPECT_EQ(stats[0].total_ns, 7);
  EXPECT_EQ(stats[0].min_ns, 0);
  EXPECT_EQ(stats[0].max_ns, 7);
  EXPECT_EQ(stats[0].histogram.counts[0], 1u);
}

TEST(RegistryRecord, AvgUsIsTotalOverCount) {
  BrickStats empty;
  EXPECT_EQ(empty.avg_us(), 0.0);
  EXPECT_EQ(empty.percentile_ns(0.5), 0.0);
  Registry registry;
  const NodeId node = registry.intern(kNoParent, "op", Kind::Op, 0);
  for (int64_t ns : {1000, 2000, 4500}) registry.record(node, ns);
  const auto stats = registry.snapshot().nodes;
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_DOUBLE_EQ(stats[0].avg_us(), 7500.0 / 3 / 1000.0);
}

TEST(RegistrySnapshot, HasExactlyTheNodesWithCounts) {
  Registry registry;
  EXPECT_TRUE(registry.snapshot().nodes.empty());
  // 200 nodes: several storage chunks.
  std::vector<NodeId> nodes;
  const NodeId root = registry.intern(kNoParent, "root", Kind::Range, -1);
  for (int i = 0; i < 200; ++i) {
    nodes.push_back(registry.intern(root, numbered("op", i), Kind::Op, i % 3));
  }
  std::vector<NodeId> expected;
  for (int i = 199; i >= 0; --i) {  // out of node order
    if (i % 3 == 1) continue;
    registry.record(nodes[i], i + 1);
    expected.push_back(nodes[i]);
  }
  std::sort(expected.begin(), expected.end());
  const auto stats = registry.snapshot().nodes;
  ASSERT_EQ(stats.size(), expected.size());
  for (size_t k = 0; k < stats.size(); ++k) {
    const BrickStats& s = stats[k];
    EXPECT_EQ(s.node, expected[k]);
    const int i = static_cast<int>(s.node - nodes[0]);
    EXPECT_EQ(s.count, 1u);
    EXPECT_EQ(s.total_ns, i + 1);
    EXPECT_EQ(s.name, numbered("op", i));
    EXPECT_EQ(s.path, numbered("root/op", i));
    EXPECT_EQ(s.device, i % 3);
    EXPECT_EQ(s.depth, 1);
  }
}

TEST(RegistrySnapshot, LastIsTheLatestCompletedAcrossThreads) {
  Registry registry;
  const NodeId node = registry.intern(kNoParent, "op", Kind::Op, 0);
  std::thread([&] { registry.record(node, 7); }).join();
  registry.record(node, 3);
  EXPECT_EQ(registry.snapshot().nodes.at(0).last_ns, 3);
  std::thread([&] { registry.record(node, 11); }).join();
  const auto stats = registry.snapshot().nodes;
  EXPECT_EQ(stats.at(0).last_ns, 11);
  EXPECT_EQ(stats.at(0).count, 3u);
  EXPECT_EQ(stats.at(0).min_ns, 3);
  EXPECT_EQ(stats.at(0).max_ns, 11);
}

// ---- histogram ----

TEST(RegistryHistogram, BucketBoundaries) {
  for (int64_t v = 0; v < 16; ++v) {
    EXPECT_EQ(Histogram::bucket_of(v), v);
    EXPECT_EQ(Histogram::bucket_lower(static_cast<int>(v)), v);
    EXPECT_EQ(Histogram::bucket_upper(static_cast<int>(v)), v + 1);
  }
  EXPECT_EQ(Histogram::bucket_of(-1), 0);
  EXPECT_EQ(Histogram::bucket_of(INT64_MIN), 0);
  EXPECT_EQ(Histogram::bucket_of(16), 16);
  EXPECT_EQ(Histogram::bucket_of(17), 16);
  EXPECT_EQ(Histogram::bucket_of(18), 17);
  EXPECT_EQ(Histogram::bucket_of(31), 23);
  EXPECT_EQ(Histogram::bucket_of(32), 24);
  EXPECT_EQ(Histogram::bucket_of(1000), Histogram::bucket_of(1023));
  EXPECT_EQ(Histogram::bucket_of(1024), Histogram::bucket_of(1151));
  EXPECT_EQ(Histogram::bucket_of(1152), Histogram::bucket_of(1024) + 1);
  const int64_t top = int64_t{1} << 44;
  EXPECT_EQ(Histogram::bucket_of(top - 1), Histogram::kBuckets - 1);
  EXPECT_EQ(Histogram::bucket_of(top), Histogram::kBuckets - 1);
  EXPECT_EQ(Histogram::bucket_of(INT64_MAX), Histogram::kBuckets - 1);
  EXPECT_EQ(Histogram::bucket_upper(Histogram::kBuckets - 1), top);
  // The buckets tile [0, 2^44) without gaps, each at most 12.5% of its lower bound wide.
  for (int b = 0; b < Histogram::kBuckets; ++b) {
    const int64_t lower = Histogram::bucket_lower(b), upper = Histogram::bucket_upper(b);
    ASSERT_LT(lower, upper);
    if (b > 0) {
      EXPECT_EQ(lower, Histogram::bucket_upper(b - 1));
    }
    if (b >= 16) {
      EXPECT_LE(upper - lower, lower / 8);
    }
    EXPECT_EQ(Histogram::bucket_of(lower), b);
    EXPECT_EQ(Histogram::bucket_of(upper - 1), b);
  }
}

TEST(RegistryHistogram, EmptyAddAndTotal) {
  Histogram a, b;
  EXPECT_EQ(a.total(), 0u);
  EXPECT_EQ(a.percentile_ns(0.5), 0.0);
  a.counts[3] = 2;
  b.counts[3] = 1;
  b.counts[100] = 4;
  a.add(b);
  EXPECT_EQ(a.counts[3], 3u);
  EXPECT_EQ(a.counts[100], 4u);
  EXPECT_EQ(a.total(), 7u);
  EXPECT_EQ(a.percentile_ns(0.0), 3.0);  // exact bucket: the value itself
  EXPECT_EQ(a.percentile_ns(0.4), 3.0);
  EXPECT_GE(a.percentile_ns(1.0), Histogram::bucket_lower(100));
  EXPECT_LT(a.percentile_ns(1.0), Histogram::bucket_upper(100));
}

TEST(RegistryHistogram, PercentilesOfAUniformDistribution) {
  Registry registry;
  const NodeId node = registry.intern(kNoParent, "uniform", Kind::Op, 0);
  constexpr int64_t kMax = 100000;
  for (int64_t ns = 1; ns <= kMax; ++ns) registry.record(node, ns);
  const auto stats = registry.snapshot().nodes;
  ASSERT_EQ(stats.size(), 1u);
  const BrickStats& s = stats[0];
  EXPECT_EQ(s.count, static_cast<uint64_t>(kMax));
  for (double q : {0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999}) {
    const double expected = q * kMax;
    EXPECT_NEAR(s.percentile_ns(q), expected, expected * 0.125) << "q=" << q;
  }
  EXPECT_EQ(s.percentile_ns(0.0), 1.0);  // the min bucket, exact
  EXPECT_LE(s.percentile_ns(1.0), static_cast<double>(kMax));
  EXPECT_GE(s.percentile_ns(1.0), kMax * 0.875);
  // Clamped to [min, max].
  EXPECT_GE(s.percentile_ns(-1.0), 1.0);
  EXPECT_LE(s.percentile_ns(2.0), static_cast<double>(kMax));
}

TEST(RegistryHistogram, PercentilesOfKnownDistributions) {
  Registry registry;
  const NodeId constant = registry.intern(kNoParent, "constant", Kind::Op, 0);
  const NodeId small = registry.intern(kNoParent, "small", Kind::Op, 0);
  const NodeId bimodal = registry.intern(kNoParent, "bimodal", Kind::Op, 0);
  for (int i = 0; i < 1000; ++i) registry.record(constant, 5000);
  for (int64_t ns = 0; ns < 10; ++ns) registry.record(small, ns);
  for (int i = 0; i < 900; ++i) registry.record(bimodal, 1000);
  for (int i = 0; i < 100; ++i) registry.record(bimodal, 1000000);
  const auto stats = registry.snapshot().nodes;
  ASSERT_EQ(stats.size(), 3u);
  for (double q : {0.0, 0.5, 1.0}) EXPECT_EQ(stats[0].percentile_ns(q), 5000.0);
  EXPECT_EQ(stats[1].percentile_ns(0.5), 4.0);  // exact below 16 ns: rank 5 of 0..9
  EXPECT_EQ(stats[1].percentile_ns(1.0), 9.0);
  EXPECT_NEAR(stats[2].percentile_ns(0.5), 1000.0, 125.0);
  EXPECT_NEAR(stats[2].percentile_ns(0.9), 1000.0, 125.0);
  EXPECT_NEAR(stats[2].percentile_ns(0.95), 1e6, 1.25e5);
  EXPECT_EQ(stats[2].percentile_ns(1.0), 1e6);  // clamped to max
}

// ---- caller-timed calls ----

// The observer's path: the caller reads now_ns() at a brick's start and end and records the
// difference with the end time.
// A report's p50, p90 and p99 come from one pass over the buckets between the min's and the
// max's: the same figures as asking for each alone over the whole histogram.
TEST(RegistryHistogram, OnePassPercentilesEqualEachAlone) {
  Registry registry;
  const NodeId node = registry.intern(kNoParent, "spread", Kind::Op, 0);
  for (int64_t ns = 3; ns < 200000; ns = ns * 5 / 4 + 1) registry.record(node, ns);
  for (int i = 0; i < 50; ++i) registry.record(node, 777);
  const BrickStats s = registry.snapshot().nodes.at(0);
  const std::array<double, 6> qs = {0.0, 0.1, 0.5, 0.9, 0.99, 1.0};
  std::array<double, 6> together{};
  s.percentiles_ns(qs, together);
  for (size_t i = 0; i < qs.size(); ++i) {
    const double alone = std::clamp(s.histogram.percentile_ns(qs[i]), static_cast<double>(s.min_ns),
                                    static_cast<double>(s.max_ns));
    EXPECT_EQ(together[i], alone) << "q=" << qs[i];
  }
  // Not ascending: each later q is read no lower than the bucket reached (no wrapped rank).
  const std::array<double, 2> descending = {0.9, 0.1};
  std::array<double, 2> out{};
  s.percentiles_ns(descending, out);
  EXPECT_EQ(out[0], together[3]);
  EXPECT_GE(out[1], static_cast<double>(s.min_ns));
  EXPECT_LE(out[1], static_cast<double>(s.max_ns));
  // An empty brick reads 0 for every q.
  const BrickStats empty;
  empty.percentiles_ns(qs, together);
  for (double value : together) EXPECT_EQ(value, 0.0);
}

// Threads that record nodes in another order than their ids: the snapshot still lists the
// nodes by id, each with its own figures and histogram.
TEST(RegistrySnapshot, NodesInNodeOrderWhateverTheThreadsRecorded) {
  Registry registry;
  const NodeId first = registry.intern(kNoParent, "first", Kind::Op, 0);
  const NodeId second = registry.intern(kNoParent, "second", Kind::Op, 0);
  std::thread([&] { registry.record(second, 2000); }).join();
  std::thread([&] {
    registry.record(first, 10);
    registry.record(second, 4000);
  }).join();
  const auto nodes = registry.snapshot().nodes;
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].node, first);
  EXPECT_EQ(nodes[0].name, "first");
  EXPECT_EQ(nodes[0].count, 1u);
  EXPECT_EQ(nodes[0].histogram.total(), 1u);
  EXPECT_EQ(nodes[1].node, second);
  EXPECT_EQ(nodes[1].name, "second");
  EXPECT_EQ(nodes[1].count, 2u);
  EXPECT_EQ(nodes[1].total_ns, 6000);
  EXPECT_EQ(nodes[1].histogram.total(), 2u);
  EXPECT_EQ(nodes[1].histogram.counts[Histogram::bucket_of(2000)], 1u);
  EXPECT_EQ(nodes[1].histogram.counts[Histogram::bucket_of(4000)], 1u);
}

TEST(RegistryRecord, CallerTimedNestedCalls) {
  Registry registry;
  const NodeId outer = registry.intern(kNoParent, "outer", Kind::Range, -1);
  const NodeId inner = registry.intern(outer, "inner", Kind::Op, 0);
  const int64_t outer_start = Registry::now_ns();
  const int64_t inner_start = Registry::now_ns();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const int64_t inner_end = Registry::now_ns();
  registry.record(inner, inner_end - inner_start, inner_end);
  const int64_t outer_end = Registry::now_ns();
  registry.record(outer, outer_end - outer_start, outer_end);
  const auto stats = registry.snapshot().nodes;
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_EQ(stats[0].node, outer);
  EXPECT_EQ(stats[1].node, inner);
  EXPECT_EQ(stats[0].count, 1u);
  EXPECT_EQ(stats[1].count, 1u);
  EXPECT_GE(stats[1].total_ns, 2'000'000);
  EXPECT_GE(stats[0].total_ns, stats[1].total_ns);
  EXPECT_EQ(stats[0].last_ns, stats[0].total_ns);
  EXPECT_EQ(stats[0].last_end_ns, outer_end);
  EXPECT_EQ(stats[1].last_end_ns, inner_end);
}

TEST(RegistryRecord, RecordWithoutEndReadsTheClock) {
  Registry registry;
  const NodeId node = registry.intern(kNoParent, "op", Kind::Op, 0);
  const int64_t before = Registry::now_ns();
  registry.record(node, 5);
  const int64_t after = Registry::now_ns();
  const auto stats = registry.snapshot().nodes;
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_GE(stats[0].last_end_ns, before);
  EXPECT_LE(stats[0].last_end_ns, after);
}

// last_ns follows the end times given, not the order of the record() calls nor the threads.
TEST(RegistryRecord, LastIsOrderedByTheGivenEndTimes) {
  Registry registry;
  const NodeId node = registry.intern(kNoParent, "op", Kind::Op, 0);
  std::thread([&] { registry.record(node, 7, 2'000); }).join();
  registry.record(node, 3, 1'000);  // recorded later, completed earlier
  auto stats = registry.snapshot().nodes;
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].last_ns, 7);
  EXPECT_EQ(stats[0].last_end_ns, 2'000);
  registry.record(node, 9, 3'000);
  std::thread([&] { registry.record(node, 4, 2'500); }).join();
  registry.record(node, 1, 500);  // the same thread, out of order
  stats = registry.snapshot().nodes;
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].count, 5u);
  EXPECT_EQ(stats[0].last_ns, 9);
  EXPECT_EQ(stats[0].last_end_ns, 3'000);
  EXPECT_EQ(stats[0].min_ns, 1);
  EXPECT_EQ(stats[0].max_ns, 9);
  registry.record(node, 6, 3'000);  // an equal end time: the later record wins the tie
  EXPECT_EQ(registry.snapshot().nodes.at(0).last_ns, 6);
}

// A thread_local whose destructor records (the observer's per-thread state, which records the
// device work a thread still owes at exit) is recorded when the thread prepared its registry
// state before constructing it.
struct RecordsAtThreadExit {
  Registry* registry;
  NodeId node;
  ~RecordsAtThreadExit() { registry->record(node, 42); }
};

TEST(RegistryThreads, PreparedThreadRecordsFromThreadLocalDestructors) {
  Registry registry;
  const NodeId node = registry.intern(kNoParent, "at_exit", Kind::Op, 0);
  std::thread([&] {
    Registry::prepare_thread();
    Registry::prepare_thread();  // idempotent
    thread_local RecordsAtThreadExit recorder{&registry, node};
    (void)recorder;
    // Nothing recorded before exit: the first record, and the shard, come from the destructor.
  }).join();
  const auto stats = registry.snapshot().nodes;
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].count, 1u);
  EXPECT_EQ(stats[0].total_ns, 42);
}

// ---- the by-name view ----

// The entry for `name` in a by-name view, or null.
const BrickStats* find_name(const std::vector<BrickStats>& stats, const std::string& name) {
  for (const BrickStats& s : stats) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

TEST(RegistryByName, MergesEveryPathOfANameExactly) {
  Registry registry;
  const NodeId a = registry.intern(kNoParent, "a", Kind::Range, -1);
  const NodeId b = registry.intern(a, "b", Kind::Range, -1);
  const NodeId mm_a = registry.intern(a, "mm", Kind::Op, 0);            // depth 1
  const NodeId mm_b = registry.intern(b, "mm", Kind::Op, 0);            // depth 2
  const NodeId mm_top = registry.intern(kNoParent, "mm", Kind::Op, 0);  // depth 0, interned last
  const NodeId relu = registry.intern(b, "relu", Kind::Op, 0);
  // Out of node order, with end times that put the last completed call on a middle node.
  registry.record(mm_top, 50, 1'000);
  registry.record(mm_top, 70, 1'100);
  registry.record(mm_b, 10, 5'000);  // the last to complete
  registry.record(mm_b, 2'000, 4'000);
  registry.record(mm_a, 300, 3'000);
  registry.record(relu, 8, 2'000);
  registry.record(a, 9'000, 6'000);
  const Snapshot snapshot = registry.snapshot();
  ASSERT_EQ(snapshot.nodes.size(), 5u);  // b has no record
  const auto names = snapshot.by_name();
  ASSERT_EQ(names.size(), 3u);
  // Order of first appearance in node order: a, mm (from mm_a), relu.
  EXPECT_EQ(names[0].name, "a");
  EXPECT_EQ(names[1].name, "mm");
  EXPECT_EQ(names[2].name, "relu");
  const BrickStats& mm = names[1];
  EXPECT_EQ(mm.path, "mm");
  EXPECT_EQ(mm.parent, kNoParent);
  EXPECT_EQ(mm.node, mm_a);
  EXPECT_EQ(mm.kind, Kind::Op);
  EXPECT_EQ(mm.device, 0);  // one device: kept
  EXPECT_EQ(mm.count, 5u);
  EXPECT_EQ(mm.total_ns, 50 + 70 + 10 + 2'000 + 300);
  EXPECT_EQ(mm.min_ns, 10);
  EXPECT_EQ(mm.max_ns, 2'000);
  EXPECT_EQ(mm.last_ns, 10);  // by completion time, not the last node or the last record()
  EXPECT_EQ(mm.last_end_ns, 5'000);
  EXPECT_EQ(mm.depth, 0);  // the smallest, though that node comes last
  Histogram expected;
  for (NodeId node : {mm_a, mm_b, mm_top}) expected.add(find(snapshot.nodes, node)->histogram);
  EXPECT_EQ(mm.histogram.total(), 5u);
  for (int bucket = 0; bucket < Histogram::kBuckets; ++bucket) {
    ASSERT_EQ(mm.histogram.counts[bucket], expected.counts[bucket]) << "bucket " << bucket;
  }
  EXPECT_EQ(mm.histogram.counts[Histogram::bucket_of(10)], 1u);
  EXPECT_EQ(mm.histogram.counts[Histogram::bucket_of(2'000)], 1u);
  EXPECT_LE(mm.percentile_ns(1.0), 2'000.0);
  EXPECT_GE(mm.percentile_ns(1.0), Histogram::bucket_lower(Histogram::bucket_of(2'000)));
  EXPECT_EQ(mm.percentile_ns(0.0), 10.0);
  // Unmerged names keep their figures (and drop their ancestors from the path).
  EXPECT_EQ(names[2].path, "relu");
  EXPECT_EQ(names[2].depth, 2);
  EXPECT_EQ(names[2].count, 1u);
  EXPECT_EQ(names[2].last_ns, 8);
  EXPECT_EQ(names[0].count, 1u);
  EXPECT_EQ(names[0].device, -1);
  EXPECT_EQ(names[0].kind, Kind::Range);
}

TEST(RegistryByName, LastIsTheLatestCompletedWhateverTheNodeOrder) {
  Registry registry;
  std::vector<NodeId> nodes;
  for (int i = 0; i < 4; ++i) {
    const NodeId parent = registry.intern(kNoParent, numbered("p", i), Kind::Range, -1);
    nodes.push_back(registry.intern(parent, "op", Kind::Op, 0));
  }
  // Completion times descending in node order: the first node's call is the last completed.
  for (int i = 0; i < 4; ++i) registry.record(nodes[i], 100 + i, 10'000 - i * 1'000);
  const auto names = registry.snapshot().by_name();
  const BrickStats* op = find_name(names, "op");
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(op->count, 4u);
  EXPECT_EQ(op->last_ns, 100);
  EXPECT_EQ(op->last_end_ns, 10'000);
  // Recorded from several threads, each node's last call later than the previous node's.
  Registry two;
  std::vector<NodeId> more;
  for (int i = 0; i < 3; ++i) {
    const NodeId parent = two.intern(kNoParent, numbered("p", i), Kind::Range, -1);
    more.push_back(two.intern(parent, "op", Kind::Op, 0));
  }
  std::thread([&] { two.record(more[2], 1, Registry::now_ns()); }).join();
  std::thread([&] { two.record(more[0], 2, Registry::now_ns()); }).join();
  two.record(more[1], 3, Registry::now_ns());
  const auto two_names = two.snapshot().by_name();
  ASSERT_EQ(find_name(two_names, "op")->last_ns, 3);
}

TEST(RegistryByName, SeveralDevicesGiveDeviceMinusOne) {
  Registry registry;
  const NodeId on0 = registry.intern(kNoParent, "add", Kind::Op, 0);
  const NodeId on1 = registry.intern(kNoParent, "add", Kind::Op, 1);
  const NodeId mul0 = registry.intern(kNoParent, "mul", Kind::Op, 1);
  const NodeId mul1 = registry.intern(on0, "mul", Kind::Op, 1);
  registry.record(on0, 5);
  registry.record(on1, 6);
  registry.record(mul0, 1);
  registry.record(mul1, 2);
  const Snapshot snapshot = registry.snapshot();
  EXPECT_EQ(snapshot.nodes.size(), 4u);
  const auto names = snapshot.by_name();
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(find_name(names, "add")->device, -1);
  EXPECT_EQ(find_name(names, "add")->count, 2u);
  EXPECT_EQ(find_name(names, "mul")->device, 1);  // two paths, one device
  EXPECT_EQ(find_name(names, "mul")->count, 2u);
}

TEST(RegistryByName, KindsAreMergedSeparately) {
  Registry registry;
  const NodeId range = registry.intern(kNoParent, "x", Kind::Range, -1);
  const NodeId op = registry.intern(range, "x", Kind::Op, 0);
  registry.record(range, 10);
  registry.record(op, 3);
  const auto names = registry.snapshot().by_name();
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0].kind, Kind::Range);
  EXPECT_EQ(names[0].count, 1u);
  EXPECT_EQ(names[0].total_ns, 10);
  EXPECT_EQ(names[1].kind, Kind::Op);
  EXPECT_EQ(names[1].count, 1u);
  EXPECT_EQ(names[1].total_ns, 3);
  EXPECT_EQ(names[1].depth, 1);
  EXPECT_TRUE(Snapshot{}.by_name().empty());
}

// ---- reset ----

TEST(RegistryReset, ZeroesCountsAndKeepsNodes) {
  Registry registry;
  const NodeId a = registry.intern(kNoParent, "a", Kind::Op, 0);
  const NodeId b = registry.intern(a, "b", Kind::Op, 0);
  registry.record(a, 5);
  registry.record(b, 1000);
  registry.reset();
  EXPECT_TRUE(registry.snapshot().nodes.empty());
  EXPECT_EQ(registry.node_count(), 2u);
  EXPECT_EQ(registry.intern(a, "b", Kind::Op, 0), b);
  registry.record(b, 50);
  registry.record(b, 70);
  const auto stats = registry.snapshot().nodes;
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].node, b);
  EXPECT_EQ(stats[0].path, "a/b");
  EXPECT_EQ(stats[0].count, 2u);
  EXPECT_EQ(stats[0].total_ns, 120);
  EXPECT_EQ(stats[0].min_ns, 50);  // not the pre-reset 1000
  EXPECT_EQ(stats[0].max_ns, 70);
  EXPECT_EQ(stats[0].histogram.total(), 2u);
  registry.reset();
  registry.reset();  // twice in a row
  registry.record(a, 1);
  EXPECT_EQ(count_of(registry, a), 1u);
  EXPECT_EQ(count_of(registry, b), 0u);
}

TEST(RegistryReset, IdleThreadCountsAreNotResurrected) {
  Registry registry;
  const NodeId node = registry.intern(kNoParent, "op", Kind::Op, 0);
  std::mutex mutex;
  std::condition_variable cv;
  int phase = 0;
  std::thread worker([&] {
    for (int i = 0; i < 5; ++i) registry.record(node, 100);
    {
      std::unique_lock<std::mutex> lock(mutex);
      phase = 1;
      cv.notify_all();
      cv.wait(lock, [&] { return phase == 2; });
    }
    registry.record(node, 9);  // first record after the reset
    std::unique_lock<std::mutex> lock(mutex);
    phase = 3;
    cv.notify_all();
    cv.wait(lock, [&] { return phase == 4; });
  });
  {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return phase == 1; });
  }
  EXPECT_EQ(count_of(registry, node), 5u);
  registry.reset();
  EXPECT_EQ(count_of(registry, node), 0u);  // the idle worker's shard is stale
  registry.record(node, 1);                 // another thread records meanwhile
  EXPECT_EQ(count_of(registry, node), 1u);
  {
    std::unique_lock<std::mutex> lock(mutex);
    phase = 2;
    cv.notify_all();
    cv.wait(lock, [&] { return phase == 3; });
  }
  const auto stats = registry.snapshot().nodes;
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].count, 2u);  // 1 + 9, not the 5 from before the reset
  EXPECT_EQ(stats[0].total_ns, 10);
  EXPECT_EQ(stats[0].max_ns, 9);
  {
    std::lock_guard<std::mutex> lock(mutex);
    phase = 4;
    cv.notify_all();
  }
  worker.join();
}

TEST(RegistryReset, ExitedThreadCountsAreDropped) {
  Registry registry;
  const NodeId node = registry.intern(kNoParent, "op", Kind::Op, 0);
  std::thread([&] { registry.record(node, 3); }).join();
  registry.reset();
  EXPECT_EQ(count_of(registry, node), 0u);
  std::thread([&] { registry.record(node, 4); }).join();  // may reuse the exited thread's shard
  const auto stats = registry.snapshot().nodes;
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].count, 1u);
  EXPECT_EQ(stats[0].total_ns, 4);
}

TEST(RegistryReset, DiscardedByResetCountsTheZeroedRecords) {
  Registry registry;
  const NodeId a = registry.intern(kNoParent, "a", Kind::Range, -1);
  const NodeId b = registry.intern(a, "b", Kind::Op, 0);
  EXPECT_EQ(registry.discarded_by_reset(), 0u);
  registry.reset();  // nothing recorded yet
  EXPECT_EQ(registry.discarded_by_reset(), 0u);
  for (int i = 0; i < 3; ++i) registry.record(a, 5);
  for (int i = 0; i < 2; ++i) registry.record(b, 7);
  EXPECT_EQ(registry.discarded_by_reset(), 0u);
  registry.reset();
  EXPECT_EQ(registry.discarded_by_reset(), 5u);  // still held by this thread's stale shard
  registry.record(a, 1);                         // zeroes the shard: the 5 move to the total
  EXPECT_EQ(registry.discarded_by_reset(), 5u);
  EXPECT_EQ(count_of(registry, a), 1u);
  registry.reset();
  registry.reset();  // twice in a row: the record is discarded once
  EXPECT_EQ(registry.discarded_by_reset(), 6u);
  // A call timed across a reset completes, and is recorded, after it: not discarded.
  const int64_t start = Registry::now_ns();
  registry.reset();
  const int64_t end = Registry::now_ns();
  registry.record(a, end - start, end);
  EXPECT_EQ(registry.discarded_by_reset(), 6u);
  EXPECT_EQ(count_of(registry, a), 1u);
}

TEST(RegistryReset, DiscardedByResetCountsIdleAndExitedThreads) {
  Registry registry;
  const NodeId node = registry.intern(kNoParent, "op", Kind::Op, 0);
  Phases phases;
  std::thread idle([&] {
    for (int i = 0; i < 4; ++i) registry.record(node, 1);
    phases.advance_to(1);
    phases.wait_for(2);
    registry.record(node, 1);  // after the reset: zeroes its stale shard first
    phases.advance_to(3);
    phases.wait_for(4);
  });
  phases.wait_for(1);
  std::thread([&] {
    for (int i = 0; i < 3; ++i) registry.record(node, 1);
  }).join();  // its shard is left unowned
  registry.record(node, 1);
  registry.record(node, 1);
  EXPECT_EQ(count_of(registry, node), 9u);
  registry.reset();
  // Every shard is stale and none has been zeroed: all three are read where they lie.
  EXPECT_EQ(registry.discarded_by_reset(), 9u);
  EXPECT_EQ(count_of(registry, node), 0u);
  // A new thread adopts the exited thread's shard and zeroes it.
  std::thread([&] { registry.record(node, 1); }).join();
  EXPECT_EQ(registry.discarded_by_reset(), 9u);
  EXPECT_EQ(count_of(registry, node), 1u);
  phases.advance_to(2);
  phases.wait_for(3);
  EXPECT_EQ(registry.discarded_by_reset(), 9u);
  EXPECT_EQ(count_of(registry, node), 2u);
  // This thread's shard is still stale: read in place, after its owner went idle.
  EXPECT_EQ(total_count(registry) + registry.discarded_by_reset(), 11u);
  phases.advance_to(4);
  idle.join();
  registry.reset();
  EXPECT_EQ(registry.discarded_by_reset(), 11u);
  EXPECT_TRUE(registry.snapshot().nodes.empty());
}

// ---- threads ----

TEST(RegistryThreads, ConcurrentRecordersAreExact) {
  Registry registry;
  constexpr int kThreads = 8, kRecords = 100000;
  const NodeId shared = registry.intern(kNoParent, "shared", Kind::Op, 0);
  std::vector<NodeId> own;
  for (int t = 0; t < kThreads; ++t) {
    own.push_back(registry.intern(shared, numbered("t", t), Kind::Op, 0));
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRecords; ++i) {
        registry.record(shared, i % 1000);
        if (i % 10 == 0) registry.record(own[t], t + 1);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  const auto stats = registry.snapshot().nodes;
  ASSERT_EQ(stats.size(), static_cast<size_t>(kThreads + 1));
  EXPECT_EQ(stats[0].count, static_cast<uint64_t>(kThreads) * kRecords);
  EXPECT_EQ(stats[0].total_ns, int64_t{kThreads} * (kRecords / 1000) * (999 * 1000 / 2));
  EXPECT_EQ(stats[0].min_ns, 0);
  EXPECT_EQ(stats[0].max_ns, 999);
  EXPECT_EQ(stats[0].histogram.total(), stats[0].count);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(stats[t + 1].count, static_cast<uint64_t>(kRecords / 10));
    EXPECT_EQ(stats[t + 1].total_ns, int64_t{kRecords / 10} * (t + 1));
  }
}

TEST(RegistryThreads, SnapshotsRunConcurrentlyWithRecorders) {
  Registry registry;
  constexpr int kThreads = 8, kRecords = 50000;
  // Two names, each under two parents: four nodes, two by-name entries.
  const NodeId parents[2] = {registry.intern(kNoParent, "p0", Kind::Range, -1),
                             registry.intern(kNoParent, "p1", Kind::Range, -1)};
  std::vector<NodeId> nodes;
  for (int i = 0; i < 4; ++i) {
    nodes.push_back(registry.intern(parents[i % 2], numbered("n", i / 2), Kind::Op, 0));
  }
  std::atomic<bool> done{false};
  std::atomic<int> snapshots{0};
  std::thread reader([&] {
    std::vector<uint64_t> previous(registry.node_count(), 0);
    while (!done.load()) {
      const Snapshot snapshot = registry.snapshot();
      for (const BrickStats& s : snapshot.nodes) {
        ASSERT_LT(s.node, previous.size());
        EXPECT_GE(s.count, previous[s.node]) << "count went down";
        EXPECT_LE(s.min_ns, s.max_ns);
        EXPECT_GE(s.histogram.total(), s.count);  // a record's bucket is stored before its count
        previous[s.node] = s.count;
      }
      // The by-name view derives from the same reading: its figures are exactly the sums of the
      // nodes', however the recorders moved on meanwhile.
      for (const BrickStats& merged : snapshot.by_name()) {
        uint64_t count = 0, histogram = 0;
        int64_t total = 0;
        for (const BrickStats& s : snapshot.nodes) {
          if (s.name != merged.name) continue;
          count += s.count;
          total += s.total_ns;
          histogram += s.histogram.total();
        }
        EXPECT_EQ(merged.count, count) << merged.name;
        EXPECT_EQ(merged.total_ns, total) << merged.name;
        EXPECT_EQ(merged.histogram.total(), histogram) << merged.name;
      }
      snapshots.fetch_add(1);
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRecords; ++i) registry.record(nodes[(i + t) % 4], 1 + i % 100);
    });
  }
  for (auto& thread : threads) thread.join();
  done.store(true);
  reader.join();
  EXPECT_GT(snapshots.load(), 0);
  const auto stats = registry.snapshot().nodes;
  ASSERT_EQ(stats.size(), 4u);
  uint64_t count = 0;
  int64_t total = 0;
  for (const BrickStats& s : stats) {
    count += s.count;
    total += s.total_ns;
    EXPECT_EQ(s.histogram.total(), s.count);
  }
  EXPECT_EQ(count, uint64_t{kThreads} * kRecords);
  EXPECT_EQ(total, int64_t{kThreads} * (kRecords / 100) * (100 * 101 / 2));
}

TEST(RegistryThreads, ResetsRaceWithRecordersAndSnapshots) {
  Registry registry;
  constexpr int kThreads = 4, kRecords = 10000;
  const NodeId node = registry.intern(kNoParent, "op", Kind::Op, 0);
  std::atomic<int> running{kThreads};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRecords; ++i) registry.record(node, 5);
      running.fetch_sub(1);
    });
  }
  int resets = 0;
  do {  // at least once, even if the recorders finished first
    registry.reset();
    ++resets;
    for (const BrickStats& s : registry.snapshot().nodes) {
      // Whatever survives a reset is a consistent subset: never more than was recorded.
      EXPECT_LE(s.count, uint64_t{kThreads} * kRecords);
      // The count is read first and published last: the other figures cover at least that many
      // records (and may include records completed while the snapshot read them).
      EXPECT_GE(s.total_ns, static_cast<int64_t>(s.count) * 5);
      EXPECT_LE(s.total_ns, int64_t{kThreads} * kRecords * 5);
      EXPECT_EQ(s.min_ns, 5);
      EXPECT_EQ(s.max_ns, 5);
      EXPECT_GE(s.histogram.total(), s.count);
    }
    std::this_thread::yield();
  } while (running.load() > 0);
  for (auto& thread : threads) thread.join();
  EXPECT_GT(resets, 0);
  EXPECT_LE(count_of(registry, node), uint64_t{kThreads} * kRecords);
  registry.reset();
  EXPECT_EQ(count_of(registry, node), 0u);
  registry.record(node, 5);
  EXPECT_EQ(count_of(registry, node), 1u);
}

// Records a thread has completed, published with release after each record, so that a reader
// that loads it has seen at least those records' effects on the registry.
struct alignas(64) Progress {
  std::atomic<uint64_t> records{0};
};

// One call of each of the nested `bricks` (outermost first), timed as the observer times them:
// now_ns() at each start, then innermost first, now_ns() at its end and record(). Publishes
// each record in `progress` (`done` records so far); returns the new total.
template <size_t kDepth>
uint64_t record_nested(Registry& registry, const NodeId (&bricks)[kDepth], Progress& progress,
                       uint64_t done) {
  int64_t starts[kDepth];
  for (size_t level = 0; level < kDepth; ++level) starts[level] = Registry::now_ns();
  for (size_t level = kDepth; level-- > 0;) {
    const int64_t end = Registry::now_ns();
    registry.record(bricks[level], end - starts[level], end);
    progress.records.store(++done, std::memory_order_release);
  }
  return done;
}

uint64_t records_done(const std::vector<Progress>& progress) {
  uint64_t sum = 0;
  for (const Progress& p : progress) sum += p.records.load(std::memory_order_acquire);
  return sum;
}

// Figures of a thread that snapshots and resets while others record.
struct ResetterFigures {
  int resets = 0;
  int snapshots = 0;
  uint64_t max_discarded = 0;
};

// Until `running` drops to 0 (at least once): reset, then take a few snapshots and readings of
// discarded_by_reset(). Between two resets (only this thread resets) every node's count never
// decreases, the discarded total never decreases, and the records completed before a snapshot
// are all in it or discarded, none twice: made before <= live + discarded <= made after, plus
// one record per thread that is published but not yet in its thread's progress.
ResetterFigures snapshot_and_reset_until_done(Registry& registry, const std::atomic<int>& running,
                                              const std::vector<Progress>& progress,
                                              uint64_t in_flight) {
  ResetterFigures figures;
  do {  // at least once, even if the recorders finished first
    registry.reset();
    ++figures.resets;
    std::vector<uint64_t> previous(registry.node_count(), 0);
    for (int i = 0; i < 3; ++i) {
      const uint64_t made_before = records_done(progress);
      const auto stats = registry.snapshot().nodes;
      const uint64_t discarded = registry.discarded_by_reset();
      const uint64_t made_after = records_done(progress);
      ++figures.snapshots;
      if (::testing::Test::HasFailure()) continue;  // one report, not thousands
      for (const BrickStats& s : stats) {
        EXPECT_GE(s.count, previous[s.node]) << "count of " << s.path << " went down";
        previous[s.node] = s.count;
      }
      EXPECT_GE(discarded, figures.max_discarded) << "discarded_by_reset() went down";
      figures.max_discarded = discarded;
      const uint64_t live = total_count(stats);
      EXPECT_LE(made_before, live + discarded)
          << "a completed record is neither live nor discarded";
      EXPECT_LE(live + discarded, made_after + in_flight) << "a record is counted twice";
    }
  } while (running.load() > 0);
  return figures;
}

// The reliability requirement: 8 threads each complete 100k iterations of three nested bricks
// while another thread snapshots and resets. No crash, no deadlock, and every record is either
// in the final snapshot or counted by discarded_by_reset(), exactly.
TEST(RegistryThreads, ResetsAccountForEveryRecordUnderLoad) {
  Registry registry;
  constexpr int kThreads = 8, kIterations = 100000, kDepth = 3;
  const NodeId outer = registry.intern(kNoParent, "outer", Kind::Range, -1);
  const NodeId middle = registry.intern(outer, "middle", Kind::Range, -1);
  std::vector<NodeId> leaves;  // one per thread, under the shared outer levels
  for (int t = 0; t < kThreads; ++t) {
    leaves.push_back(registry.intern(middle, numbered("op", t), Kind::Op, 0));
  }
  std::vector<Progress> progress(kThreads);
  std::atomic<int> running{kThreads};
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const NodeId bricks[kDepth] = {outer, middle, leaves[t]};
      uint64_t done = 0;
      for (int i = 0; i < kIterations; ++i) {
        done = record_nested(registry, bricks, progress[t], done);
      }
      running.fetch_sub(1);
    });
  }
  const ResetterFigures figures =
      snapshot_and_reset_until_done(registry, running, progress, kThreads);
  for (auto& thread : threads) thread.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  const uint64_t made = uint64_t{kThreads} * kIterations * kDepth;
  ASSERT_EQ(records_done(progress), made);
  const auto stats = registry.snapshot().nodes;
  const uint64_t live = total_count(stats);
  const uint64_t discarded = registry.discarded_by_reset();
  std::printf(
      "    %d threads x %d iterations x %d bricks: %llu records, %d resets, %d snapshots;\n"
      "    after the last reset %llu, discarded %llu, sum %llu: %s (%.2f s)\n",
      kThreads, kIterations, kDepth, static_cast<unsigned long long>(made), figures.resets,
      figures.snapshots, static_cast<unsigned long long>(live),
      static_cast<unsigned long long>(discarded), static_cast<unsigned long long>(live + discarded),
      live + discarded == made ? "exact" : "NOT exact", seconds);
  EXPECT_EQ(live + discarded, made);
  EXPECT_GE(figures.resets, 1);
  for (const BrickStats& s : stats) EXPECT_EQ(s.histogram.total(), s.count) << s.path;
  // Once quiescent, the figures do not move; one more reset discards everything left.
  EXPECT_EQ(registry.discarded_by_reset(), discarded);
  registry.reset();
  EXPECT_TRUE(registry.snapshot().nodes.empty());
  EXPECT_EQ(registry.discarded_by_reset(), made);
}

// Shards change hands while resets run: each of 8 worker slots runs short-lived threads one
// after another (a new thread adopts a shard whose owner exited, stale or not), and one thread
// records early, then stays idle (its stale shard is never zeroed by its owner).
TEST(RegistryThreads, ResetsAccountForAdoptedAndIdleShards) {
  Registry registry;
  constexpr int kSlots = 8, kRounds = 20, kIterations = 1000, kDepth = 2, kIdleRecords = 777;
  const NodeId outer = registry.intern(kNoParent, "outer", Kind::Range, -1);
  const NodeId inner = registry.intern(outer, "inner", Kind::Op, 0);
  const NodeId idle_node = registry.intern(kNoParent, "idle", Kind::Op, 0);
  std::vector<Progress> progress(kSlots + 1);  // the last one is the idle thread's
  Phases idle_phases;
  std::thread idle([&] {
    for (int i = 0; i < kIdleRecords; ++i) {
      registry.record(idle_node, 1);
      progress[kSlots].records.store(i + 1, std::memory_order_release);
    }
    idle_phases.advance_to(1);
    idle_phases.wait_for(2);  // alive, never recording again, until the checks are done
  });
  idle_phases.wait_for(1);
  std::atomic<int> running{kSlots};
  std::vector<std::thread> slots;
  for (int t = 0; t < kSlots; ++t) {
    slots.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        std::thread([&] {
          const NodeId bricks[kDepth] = {outer, inner};
          uint64_t done = progress[t].records.load(std::memory_order_relaxed);
          for (int i = 0; i < kIterations; ++i) {
            done = record_nested(registry, bricks, progress[t], done);
          }
        }).join();
      }
      running.fetch_sub(1);
    });
  }
  const ResetterFigures figures =
      snapshot_and_reset_until_done(registry, running, progress, kSlots);
  for (auto& slot : slots) slot.join();

  const uint64_t made = uint64_t{kSlots} * kRounds * kIterations * kDepth + kIdleRecords;
  ASSERT_EQ(records_done(progress), made);
  EXPECT_GE(figures.resets, 1);
  EXPECT_EQ(total_count(registry) + registry.discarded_by_reset(), made);
  registry.reset();
  EXPECT_EQ(registry.discarded_by_reset(), made);
  idle_phases.advance_to(2);
  idle.join();
  EXPECT_EQ(registry.discarded_by_reset(), made);
}

TEST(RegistryThreads, ThreadExitKeepsCounts) {
  Registry registry;
  const NodeId node = registry.intern(kNoParent, "op", Kind::Op, 0);
  for (int round = 0; round < 20; ++round) {
    std::thread([&] {
      registry.record(node, 10, Registry::now_ns());
      registry.record(node, 10);
    }).join();
  }
  std::thread([&] { registry.record(node, 10); }).join();
  EXPECT_EQ(count_of(registry, node), 41u);
}

TEST(RegistryThreads, RegistriesAreIndependent) {
  Registry one, two;
  const NodeId a1 = one.intern(kNoParent, "a", Kind::Op, 0);
  const NodeId a2 = two.intern(kNoParent, "a", Kind::Op, 0);
  EXPECT_EQ(a1, a2);  // both first nodes
  for (int i = 0; i < 3; ++i) one.record(a1, 10);
  two.record(a2, 20);
  EXPECT_EQ(count_of(one, a1), 3u);
  EXPECT_EQ(count_of(two, a2), 1u);
  one.reset();
  EXPECT_EQ(count_of(one, a1), 0u);
  EXPECT_EQ(count_of(two, a2), 1u);
  // Registries that come and go (likely at a reused address) start empty.
  for (int i = 0; i < 50; ++i) {
    auto fresh = std::make_unique<Registry>();
    EXPECT_TRUE(fresh->snapshot().nodes.empty());
    const NodeId node = fresh->intern(kNoParent, "x", Kind::Op, 0);
    fresh->record(node, i);
    const auto stats = fresh->snapshot().nodes;
    ASSERT_EQ(stats.size(), 1u);
    EXPECT_EQ(stats[0].count, 1u);
    EXPECT_EQ(stats[0].total_ns, i);
  }
  two.record(a2, 20);
  EXPECT_EQ(count_of(two, a2), 2u);
}

TEST(RegistryThreads, RegistryOutlivedByItsThreads) {
  std::mutex mutex;
  std::condition_variable cv;
  bool recorded = false, destroyed = false;
  auto registry = std::make_unique<Registry>();
  const NodeId node = registry->intern(kNoParent, "op", Kind::Op, 0);
  std::thread worker([&] {
    registry->record(node, 1);
    std::unique_lock<std::mutex> lock(mutex);
    recorded = true;
    cv.notify_all();
    cv.wait(lock, [&] { return destroyed; });
    // Exits after its registry is gone: the thread-local entries must not touch it.
  });
  {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return recorded; });
    EXPECT_EQ(count_of(*registry, node), 1u);
    registry = nullptr;  // destroys the registry
    destroyed = true;
    cv.notify_all();
  }
  worker.join();
}

// ---- clock ----

TEST(RegistryClock, NowNsIsMonotonic) {
  int64_t previous = Registry::now_ns();
  for (int i = 0; i < 200000; ++i) {
    const int64_t now = Registry::now_ns();
    ASSERT_GE(now, previous);
    previous = now;
  }
}

TEST(RegistryClock, NowNsAgreesWithSteadyClock) {
  using std::chrono::steady_clock;
  auto steady_ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               steady_clock::now().time_since_epoch())
        .count();
  };
  // now_ns bracketed by two steady_clock reads; the tightest bracket of a few tries.
  struct Reading {
    int64_t now, steady, window;
  };
  auto read = [&] {
    Reading best{0, 0, INT64_MAX};
    for (int i = 0; i < 20; ++i) {
      const int64_t before = steady_ns();
      const int64_t now = Registry::now_ns();
      const int64_t after = steady_ns();
      if (after - before < best.window) best = {now, before + (after - before) / 2, after - before};
    }
    return best;
  };
  const Reading first = read();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const Reading second = read();
  const double steady_elapsed = static_cast<double>(second.steady - first.steady);
  const double now_elapsed = static_cast<double>(second.now - first.now);
  const double slack = 0.001 * steady_elapsed + static_cast<double>(first.window + second.window);
  EXPECT_GE(steady_elapsed, 50e6);
  EXPECT_NEAR(now_elapsed, steady_elapsed, slack);
  // Same epoch as steady_clock (both start from its reading at calibration).
  EXPECT_NEAR(static_cast<double>(second.now), static_cast<double>(second.steady), 1e6);
}

TEST(RegistryClock, CpuinfoFlagsParsing) {
  using detail::cpuinfo_has_invariant_tsc;
  EXPECT_TRUE(cpuinfo_has_invariant_tsc(
      "processor\t: 0\nflags\t\t: fpu tsc constant_tsc rep_good nonstop_tsc cpuid\n"));
  EXPECT_FALSE(cpuinfo_has_invariant_tsc("flags\t\t: fpu tsc constant_tsc rep_good\n"));
  EXPECT_FALSE(cpuinfo_has_invariant_tsc("flags\t\t: fpu tsc nonstop_tsc\n"));
  EXPECT_FALSE(cpuinfo_has_invariant_tsc("flags\t\t: constant_tsc_x nonstop_tsc_y\n"));
  EXPECT_FALSE(cpuinfo_has_invariant_tsc(""));
  EXPECT_FALSE(cpuinfo_has_invariant_tsc("model name\t: constant_tsc nonstop_tsc\n"));
  EXPECT_TRUE(cpuinfo_has_invariant_tsc("flags: nonstop_tsc constant_tsc"));  // no newline
}

TEST(RegistryClock, TscScaleFixedPoint) {
  detail::TscScale scale;
  scale.base_tsc = 1'000'000;
  scale.base_ns = 5'000;
  scale.mult = uint64_t{1} << (detail::TscScale::kShift - 1);  // 0.5 ns per tick (2 GHz)
  EXPECT_EQ(scale.to_ns(1'000'000), 5'000);
  EXPECT_EQ(scale.to_ns(3'000'000), 1'005'000);
  EXPECT_EQ(scale.to_ns(999'998), 4'999);  // slightly behind the base
  // Hours of ticks do not overflow.
  EXPECT_EQ(scale.to_ns(1'000'000 + 2 * uint64_t{3600'000'000'000}), 5'000 + 3600'000'000'000);
}

}  // namespace
}  // namespace brick::registry
