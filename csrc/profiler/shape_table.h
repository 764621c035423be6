// The table behind input shapes per op (shape_stats.h): each op call's signature, interned, and
// per (op brick, signature) the calls and time the observer measured. Internal to csrc/profiler:
// the observer records into it, and shape_rows() reads it beside a snapshot of the registry.
#pragma once

#include <ATen/record_function.h>

#include <cstdint>
#include <string>
#include <vector>

#include "registry/registry.h"

namespace brick::profiler::detail {

#pragma GCC visibility push(hidden)

inline constexpr uint32_t kNoShape = UINT32_MAX;

// The id of `fn`'s signature (interned: a lock, and a string built per call).
uint32_t intern_signature(const at::RecordFunction& fn);
// One call of `node` with signature `signature` took `ns`. False when it could not be kept (out
// of memory): the op's own brick still has the call.
bool record_shape(registry::NodeId node, uint32_t signature, int64_t ns) noexcept;
// Forgets every row (the registry's reset()).
void reset_shapes();

// One (op brick, signature) with its figures: the fields of ShapeRow the table holds.
struct RecordedShape {
  registry::NodeId node;
  std::string overload;
  std::string shapes;
  std::string dtypes;
  std::string values;
  uint64_t calls;
  int64_t total_ns;
  int64_t min_ns;
  int64_t max_ns;
};

// Every (op brick, signature) recorded since the last reset_shapes(), in order of first
// appearance.
std::vector<RecordedShape> recorded_shapes();

#pragma GCC visibility pop

}  // namespace brick::profiler::detail
