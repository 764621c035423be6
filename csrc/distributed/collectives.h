// The kinds of collective brick's process groups run: their names, and what each kind moved in
// this process (the counters torch_brickdev.distributed.collective_counters() reads).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace brick::distributed {

// What one kind of collective moved in this process, across every brick process group.
struct CollectiveCounter {
  const char* name;
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> bytes{0};      // input bytes this rank contributed
  std::atomic<int64_t> group_size{0};  // of the last call
  // Summed over calls: from the enqueue until the engine completed the collective (what a rank
  // waits for, its peers included); calls whose engine gives no future are not timed.
  std::atomic<int64_t> time_ns{0};
  std::atomic<uint64_t> timed_calls{0};
};

enum class Collective : int {
  Broadcast,
  AllReduce,
  AllReduceCoalesced,
  Reduce,
  AllGather,
  AllGatherIntoTensor,
  AllGatherCoalesced,
  AllGatherIntoTensorCoalesced,
  Gather,
  Scatter,
  ReduceScatter,
  ReduceScatterTensor,
  ReduceScatterTensorCoalesced,
  AllToAll,
  AllToAllSingle,
  Barrier,
  Send,
  Recv,
  Count
};
// Every kind's counter, named as collective_name() names it.
std::array<CollectiveCounter, static_cast<size_t>(Collective::Count)>& collective_counters();

// The collective's name, e.g. "all_reduce".
const char* collective_name(Collective op);

// "<engine>:<collective>" (the engine's own range names, e.g. "gloo:all_reduce"): the name of a
// collective's device activity. Made once; launch names must outlive every profile.
const char* engine_collective_name(const std::string& engine, Collective op);

}  // namespace brick::distributed
