// The process's device timeline (internal to the profiler layer; profiler.h has its public API).
#pragma once

#include "profiler/timeline_log.h"

namespace brick::profiler {

// The one timeline ProfilerStubs::record() logs into; it lives for the process.
TimelineLog& process_timeline();

// Whether the calling thread has a range_push() not popped yet.
bool has_open_range() noexcept;

}  // namespace brick::profiler
