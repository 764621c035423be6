// The collectives' names and counters.
#include "distributed/collectives.h"

#include <c10/util/StringUtil.h>

namespace brick::distributed {

namespace {

constexpr std::array<const char*, static_cast<size_t>(Collective::Count)> kNames = {
    "broadcast",
    "all_reduce",
    "all_reduce_coalesced",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_coalesced",
    "all_gather_into_tensor_coalesced",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "send",
    "recv"};

}  // namespace

const char* collective_name(Collective op) { return kNames[static_cast<size_t>(op)]; }

const char* engine_collective_name(const std::string& engine, Collective op) {
  static const auto* names = [] {
    auto* made = new std::array<std::array<std::string, kNames.size()>, 3>();
    const char* engines[] = {"gloo", "nccl", "c10d"};
    for (size_t e = 0; e < made->size(); ++e) {
      for (size_t i = 0; i < kNames.size(); ++i)
        (*made)[e][i] = c10::str(engines[e], ":", kNames[i]);
    }
    return made;
  }();
  const size_t e = engine == "gloo" ? 0 : engine == "nccl" ? 1 : 2;
  return (*names)[e][static_cast<size_t>(op)].c_str();
}

std::array<CollectiveCounter, static_cast<size_t>(Collective::Count)>& collective_counters() {
  static auto* counters = [] {
    auto* made = new std::array<CollectiveCounter, static_cast<size_t>(Collective::Count)>();
    for (size_t i = 0; i < made->size(); ++i) (*made)[i].name = kNames[i];
    return made;
  }();
  return *counters;
}

}  // namespace brick::distributed
