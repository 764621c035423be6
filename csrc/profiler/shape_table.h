// The table behind input shapes per op (shape_stats.h): each op call's signature, interned, and
// per (op brick, signature) the calls and time the observer measured. Internal to csrc/profiler:
// the observer records into it, and shape_rows() reads it beside a snapshot of the registry.
#pragma once

#include <ATen/record_function.h>

#include <cstdint>
#include <string>
#include <vector>

#include "profiler/shape_stats.h"
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

// Every (op brick, signature) recorded since the last reset_shapes(), in order of first
// appearance: each row's node, signature and figures (its brick's name, path and device are
// the registry's, filled in by shape_rows()).
std::vector<ShapeRow> recorded_shapes();

#pragma GCC visibility pop

}  // namespace brick::profiler::detail
