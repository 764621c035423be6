// Google Benchmark programs for the brick registry's hot paths.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>

#include "registry/registry.h"

namespace {

using brick::registry::Kind;
using brick::registry::kNoParent;
using brick::registry::NodeId;
using brick::registry::Registry;

// One registry and node for all benchmarks (and all threads of the threaded ones).
Registry& registry() {
  static Registry instance;
  return instance;
}

NodeId parent_node() {
  static const NodeId node = registry().intern(kNoParent, "bench", Kind::Range, -1);
  return node;
}

NodeId op_node() {
  static const NodeId node = registry().intern(parent_node(), "aten::add", Kind::Op, 0);
  return node;
}

// One start() + stop() pair: two clock reads, a push, a pop and a record.
void BM_StartStop(benchmark::State& state) {
  Registry& r = registry();
  const NodeId node = op_node();
  for (auto _ : state) {
    r.start(node);
    benchmark::DoNotOptimize(r.stop());
  }
}
BENCHMARK(BM_StartStop);
BENCHMARK(BM_StartStop)->Threads(2);

// record() alone (it reads the clock once, to order last_ns across threads).
void BM_Record(benchmark::State& state) {
  Registry& r = registry();
  const NodeId node = op_node();
  int64_t ns = 1000;
  for (auto _ : state) {
    r.record(node, ns);
    ns = (ns * 7 + 13) & 0xfffff;  // spread over the histogram
  }
}
BENCHMARK(BM_Record);

void BM_NowNs(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(Registry::now_ns());
}
BENCHMARK(BM_NowNs);

void BM_SteadyClock(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(std::chrono::steady_clock::now());
}
BENCHMARK(BM_SteadyClock);

// intern() of a node that already exists: a lock and a hash lookup.
void BM_Intern(benchmark::State& state) {
  Registry& r = registry();
  const NodeId parent = parent_node();
  (void)op_node();
  for (auto _ : state) {
    benchmark::DoNotOptimize(r.intern(parent, "aten::add", Kind::Op, 0));
  }
}
BENCHMARK(BM_Intern);

}  // namespace

BENCHMARK_MAIN();
