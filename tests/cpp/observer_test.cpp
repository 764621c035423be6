// GoogleTest suite for the RecordFunction observer that feeds the registry: what happens to the
// call tree when a brick cannot be timed.
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "profiler/profiler.h"
#include "profiler/range_stack.h"
#include "profiler/shape_stats.h"
#include "registry/registry.h"
#include "runtime/launch_observer.h"

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

// Ops timed at brick's kernels: PyTorch's dispatcher keeps its fast path (no callback for ops),
// ranges are still observed, and a kernel (what BackingCall's launch does through the kernel
// timer) is a brick inside the range open on its thread. The setting lasts until changed.
TEST(ObserverTest, OpsTimedAtKernelsLeaveTheDispatchersFastPath) {
  profiler::set_op_timing(profiler::OpTiming::Kernels);
  profiler::enable();
  const bool ops_observed = at::getStepCallbacksUnlessEmpty(at::RecordScope::FUNCTION).has_value();
  const bool ranges_observed =
      at::getStepCallbacksUnlessEmpty(at::RecordScope::USER_SCOPE).has_value();
  const brick::runtime::KernelTimer* timer = brick::runtime::kernel_timer();
  ASSERT_NE(timer, nullptr);
  {
    RECORD_USER_SCOPE("block");
    timer->begin("aten::mm");
    timer->end();
  }
  timer->begin("aten::mm");
  timer->end();
  const auto counts = counts_by_path();
  const auto health = profiler::health();
  profiler::disable();
  const brick::runtime::KernelTimer* after_disable = brick::runtime::kernel_timer();
  profiler::set_op_timing(profiler::OpTiming::Dispatcher);
  profiler::enable();
  const bool ops_observed_at_dispatcher =
      at::getStepCallbacksUnlessEmpty(at::RecordScope::FUNCTION).has_value();
  const brick::runtime::KernelTimer* dispatcher_timer = brick::runtime::kernel_timer();
  profiler::disable();
  profiler::reset();

  EXPECT_FALSE(ops_observed);
  EXPECT_TRUE(ranges_observed);
  EXPECT_EQ(counts.at("block"), 1u);
  EXPECT_EQ(counts.at("block/aten::mm"), 1u);
  EXPECT_EQ(counts.at("aten::mm"), 1u);
  EXPECT_EQ(health.unbalanced_exits, 0u);
  EXPECT_EQ(health.timing_failures, 0u);
  EXPECT_EQ(after_disable, nullptr);
  EXPECT_TRUE(ops_observed_at_dispatcher);
  EXPECT_EQ(dispatcher_timer, nullptr);
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

// ---------------------------------------------------------------------------------------------
// Input shapes per op (record_shapes)

std::map<std::string, uint64_t> mm_calls_by_signature() {
  std::map<std::string, uint64_t> calls;
  for (const auto& row : profiler::shape_rows()) {
    if (row.name == "aten::mm")
      calls[row.shapes + " " + row.dtypes + " " + row.values] += row.calls;
  }
  return calls;
}

TEST(ShapeStatsTest, EachSignatureOfAnOpIsARowAndTheRowsAddUpToItsCalls) {
  const at::Tensor a = at::ones({4, 8}), b = at::ones({2, 8}), w = at::ones({8, 16});
  const at::Tensor b64 = b.to(at::kDouble), w64 = w.to(at::kDouble);
  profiler::set_record_shapes(true);
  profiler::enable();
  for (int i = 0; i < 3; ++i) (void)at::mm(a, w);
  (void)at::mm(b, w);
  (void)at::mm(b64, w64);
  (void)at::mm(a, w);  // a signature seen before: found by its digest
  profiler::disable();
  profiler::set_record_shapes(false);
  const auto calls = mm_calls_by_signature();
  uint64_t mm_count = 0;
  for (const auto& node : profiler::snapshot().by_name()) {
    if (node.name == "aten::mm") mm_count = node.count;
  }
  profiler::reset();
  EXPECT_EQ(calls, (std::map<std::string, uint64_t>{
                       {R"([[4, 8], [8, 16]] ["Float", "Float"] [null, null])", 4},
                       {R"([[2, 8], [8, 16]] ["Float", "Float"] [null, null])", 1},
                       {R"([[2, 8], [8, 16]] ["Double", "Double"] [null, null])", 1}}));
  EXPECT_EQ(mm_count, 6u);
  EXPECT_TRUE(mm_calls_by_signature().empty()) << "reset() forgets the rows";
}

TEST(ShapeStatsTest, IntegerArgumentsAreRecordedByValue) {
  const at::Tensor x = at::ones({4, 8});
  profiler::set_record_shapes(true);
  profiler::enable();
  (void)x.view({2, 16});
  (void)at::sum(x, {1}, /*keepdim=*/true);
  profiler::disable();
  profiler::set_record_shapes(false);
  std::map<std::string, std::string> values;
  for (const auto& row : profiler::shape_rows()) values[row.name + " " + row.dtypes] = row.values;
  profiler::reset();
  EXPECT_EQ(values.at(R"(aten::view ["Float", "int[]"])"), "[null, [2, 16]]");
  EXPECT_EQ(values.at(R"(aten::sum ["Float", "int[]", "bool", "None"])"),
            "[null, [1], true, null]");
}

TEST(ShapeStatsTest, OffByDefaultAndTheSettingIsRefusedWhileProfiling) {
  EXPECT_FALSE(profiler::record_shapes());
  const at::Tensor a = at::ones({4, 8}), w = at::ones({8, 16});
  profiler::enable();
  (void)at::mm(a, w);
  EXPECT_THROW(profiler::set_record_shapes(true), c10::Error);
  profiler::disable();
  EXPECT_TRUE(mm_calls_by_signature().empty());
  profiler::reset();
}

}  // namespace
