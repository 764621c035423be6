// The views derived from one snapshot of the registry, so that they always agree.
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "registry/buckets.h"
#include "registry/registry.h"

namespace brick::registry {

std::vector<BrickStats> Snapshot::by_name() const {
  std::vector<BrickStats> merged;
  merged.reserve(nodes.size());  // (a BrickStats holds a large histogram: never moved)
  // (name, kind) -> index in merged; the names point into `nodes`, which outlives the map.
  std::map<std::pair<std::string_view, Kind>, size_t> index;
  for (const BrickStats& node : nodes) {
    const auto [it, first] = index.try_emplace({node.name, node.kind}, merged.size());
    if (first) {
      BrickStats& into = merged.emplace_back(node);
      into.path = node.name;
      into.parent = kNoParent;
      continue;
    }
    BrickStats& into = merged[it->second];
    into.count += node.count;
    into.total_ns += node.total_ns;
    into.min_ns = std::min(into.min_ns, node.min_ns);
    into.max_ns = std::max(into.max_ns, node.max_ns);
    if (node.last_end_ns > into.last_end_ns) {  // completed later, whatever the node order
      into.last_end_ns = node.last_end_ns;
      into.last_ns = node.last_ns;
    }
    into.first_start_ns = std::min(into.first_start_ns, node.first_start_ns);
    into.depth = std::min(into.depth, node.depth);
    // (a node's counts lie in the buckets of its min and max)
    const int last = detail::bucket_index(node.max_ns);
    for (int b = detail::bucket_index(node.min_ns); b <= last; ++b) {
      into.histogram.counts[b] += node.histogram.counts[b];
    }
    if (into.device != node.device) into.device = -1;  // seen on several devices
  }
  return merged;
}

}  // namespace brick::registry
