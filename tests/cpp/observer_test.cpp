// GoogleTest suite for the RecordFunction observer that feeds the registry: what happens to the
// call tree when a brick cannot be timed.
#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "profiler/profiler.h"
#include "profiler/range_stack.h"
#include "registry/registry.h"

namespace {

namespace profiler = brick::profiler;
namespace registry = brick::registry;

std::map<std::string, uint64_t> counts_by_path() {
  std::map<std::string, uint64_t> counts;
  for (const auto& node : profiler::snapshot().nodes) counts[node.path] += node.count;
  return counts;
}

// The module bricks' ranges: pushed and popped by depth, nested as pushed; popping to an outer
// depth ends the inner ranges too (a forward that raised inside a child).
TEST(RangeStackTest, RangesNestAsPushedAndPopToADepth) {
  profiler::enable();
  const std::size_t root = profiler::push_range("model");
  const std::size_t layer = profiler::push_range("model.layer");
  (void)profiler::push_range("model.layer.attn");
  EXPECT_EQ(profiler::range_depth(), root + 3);
  profiler::pop_ranges(layer);  // ends attn and layer
  EXPECT_EQ(profiler::range_depth(), root + 1);
  (void)profiler::push_range("model.head");
  profiler::pop_ranges(root + 1);
  profiler::pop_ranges(root);
  const auto counts = counts_by_path();
  const auto health = profiler::health();
  profiler::disable();
  profiler::reset();

  EXPECT_EQ(profiler::range_depth(), root);
  EXPECT_EQ(counts.at("model"), 1u);
  EXPECT_EQ(counts.at("model/model.layer"), 1u);
  EXPECT_EQ(counts.at("model/model.layer/model.layer.attn"), 1u);
  EXPECT_EQ(counts.at("model/model.head"), 1u);
  EXPECT_EQ(health.unbalanced_exits, 0u);
}

TEST(RangeStackTest, RangesOpenedWhileDisabledCostNothingAndRecordNothing) {
  const std::size_t depth = profiler::push_range("unprofiled");
  profiler::pop_ranges(depth);
  EXPECT_EQ(profiler::range_depth(), depth);
  EXPECT_EQ(counts_by_path().count("unprofiled"), 0u);
}

// (Before the tests that fill the registry's node table: each test runs in its own process
// under CTest, but in one when the program is run by hand.)

// Fills the registry's node table, so that the next new brick name cannot be interned: its enter
// fails inside the observer. Returns how many fillers it took.
size_t fill_node_table() {
  size_t added = 0;
  for (;;) {
    try {
      (void)profiler::brick_registry().intern(
          registry::kNoParent, "filler " + std::to_string(added), registry::Kind::Range, 0);
      ++added;
    } catch (const std::exception&) {
      return added;
    }
  }
}

TEST(ObserverTest, ABrickWhoseStartFailsStillClosesItsOwnFrameNotItsParents) {
  profiler::enable();
  {
    RECORD_USER_SCOPE("outer");
    { RECORD_USER_SCOPE("inner"); }
  }
  ASSERT_GT(fill_node_table(), 0u);
  const auto before = profiler::health();
  {
    RECORD_USER_SCOPE("outer");
    { RECORD_USER_SCOPE("one name too many"); }  // cannot be interned: dropped, counted
    { RECORD_USER_SCOPE("inner"); }              // still inside outer
  }
  const auto after = profiler::health();
  const auto counts = counts_by_path();
  profiler::disable();
  profiler::reset();

  EXPECT_EQ(after.timing_failures - before.timing_failures, 1u);
  EXPECT_EQ(after.unbalanced_exits, before.unbalanced_exits);
  EXPECT_EQ(counts.at("outer"), 2u);
  EXPECT_EQ(counts.at("outer/inner"), 2u) << "a failed brick's exit closed its parent early";
  EXPECT_EQ(counts.count("inner"), 0u);
}

TEST(ObserverTest, WhatTheRegistryMissedCountsSinceItsReset) {
  profiler::reset();
  profiler::enable();
  ASSERT_GT(fill_node_table(), 0u);
  { RECORD_USER_SCOPE("a name the full table refuses"); }
  const auto missed = profiler::health();
  profiler::disable();
  profiler::reset();  // a new profile: its report must not carry the last one's misses
  const auto after_reset = profiler::health();

  EXPECT_EQ(missed.timing_failures, 1u);
  EXPECT_EQ(after_reset.timing_failures, 0u);
  EXPECT_EQ(after_reset.unbalanced_exits, 0u);
  EXPECT_EQ(after_reset.capture_skipped, 0u);
}

}  // namespace
