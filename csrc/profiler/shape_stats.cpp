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
  std::vector<ShapeRow> rows = detail::recorded_shapes();
  size_t kept = 0;
  for (ShapeRow& row : rows) {
    const auto stats = by_node.find(row.node);
    if (stats == by_node.end()) continue;  // recorded after the snapshot: the next one has it
    row.name = stats->second->name;
    row.path = stats->second->path;
    row.device = stats->second->device;
    row.kind = stats->second->kind;
    if (&rows[kept] != &row) rows[kept] = std::move(row);
    ++kept;
  }
  rows.resize(kept);
  return rows;
}

}  // namespace brick::profiler
