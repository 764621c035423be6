// Google Benchmark programs for the registry's share of a profiled op.
//
// On the host runtime the observer times a brick in Deferred mode (and resolves a host event
// pair in Event mode) with two now_ns() reads and one record(node, ns, end_ns); its per-call-site
// node lookup and open-brick stack are the observer's own (measured end to end by
// benchmarks/bench_profiler.py). These figures are the registry's part of that path.
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

NodeId op_node() {
  static const NodeId node = [] {
    const NodeId parent = registry().intern(kNoParent, "bench", Kind::Range, -1);
    return registry().intern(parent, "aten::add", Kind::Op, 0);
  }();
  return node;
}

// A brick as the observer times it: now_ns() at the start, now_ns() at the end, then
// record(node, end - start, end).
void BM_TimedRecord(benchmark::State& state) {
  Registry& r = registry();
  const NodeId node = op_node();
  for (auto _ : state) {
    const int64_t start = Registry::now_ns();
    const int64_t end = Registry::now_ns();
    r.record(node, end - start, end);
  }
}
BENCHMARK(BM_TimedRecord);
BENCHMARK(BM_TimedRecord)->Threads(2);  // both threads on one node: separate shards, no sharing

// record() of a completed duration whose end time the caller already has: no clock read.
void BM_RecordWithEnd(benchmark::State& state) {
  Registry& r = registry();
  const NodeId node = op_node();
  int64_t ns = 1000, end = 0;
  for (auto _ : state) {
    r.record(node, ns, ++end);
    ns = (ns * 7 + 13) & 0xfffff;  // spread over the histogram
  }
}
BENCHMARK(BM_RecordWithEnd);

// record() without an end time: it reads the clock once, to order last_ns across threads.
void BM_Record(benchmark::State& state) {
  Registry& r = registry();
  const NodeId node = op_node();
  int64_t ns = 1000;
  for (auto _ : state) {
    r.record(node, ns);
    ns = (ns * 7 + 13) & 0xfffff;
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

}  // namespace

BENCHMARK_MAIN();
