// Input shapes per op: see shape_stats.h. The rows join the shape table's figures (shape_table.h)
// with the registry's names and paths of the same bricks.
#include "profiler/shape_stats.h"

#include <unordered_map>
#include <utility>

#include "profiler/profiler.h"
#include "profiler/shape_table.h"

namespace brick::profiler {

std::vector<ShapeRow> shape_rows() {
  const registry::Snapshot figures = snapshot();  // resolves outstanding pairs first
  std::unordered_map<registry::NodeId, const registry::BrickStats*> by_node;
  for (const registry::BrickStats& stats : figures.nodes) by_node.emplace(stats.node, &stats);
  std::vector<detail::RecordedShape> recorded = detail::recorded_shapes();
  std::vector<ShapeRow> out;
  out.reserve(recorded.size());
  for (detail::RecordedShape& row : recorded) {
    const auto stats = by_node.find(row.node);
    if (stats == by_node.end()) continue;  // recorded after the snapshot: the next one has it
    out.push_back({row.node, stats->second->name, std::move(row.overload), stats->second->path,
                   stats->second->device, std::move(row.shapes), std::move(row.dtypes),
                   std::move(row.values), row.calls, row.total_ns, row.min_ns, row.max_ns});
  }
  return out;
}

}  // namespace brick::profiler
