// Ranges opened and closed by Python hooks (the module bricks of profile(modules=True)): each a
// RecordFunction of USER_SCOPE, as record_function's, so every profiler sees it; kept on a
// per-thread stack here, so that a hook pays one call in and one call out, not a dispatcher
// round trip for a handle.
#pragma once

#include <cstddef>
#include <string>

namespace brick::profiler {

// Opens a range named `name` on the calling thread; returns the stack's depth before it.
std::size_t push_range(const std::string& name);
// Ends the calling thread's open ranges down to `depth` (their number before the push that
// returned it), innermost first: a forward that raised inside a child ends the child too.
void pop_ranges(std::size_t depth);
// The calling thread's open ranges.
std::size_t range_depth() noexcept;

}  // namespace brick::profiler
