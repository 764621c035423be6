// Marks in the calling thread's stream of device work, for traced timing
// (profiler/work_correlator.h): a profiler marks where a brick, range or op opens and closes,
// and the work the thread queued between two marks is what ran in between. Each thread's work
// is cut into segments, one interval id pushed on the work tracer at a time; a mark starts a new
// segment only where the thread queued brick work (runtime::device_work_seen()) since its
// segment began, or a launch was in flight during it, so marks around views and CPU ops cost the
// tracer nothing.
#pragma once

#include "profiler/work_correlator.h"
#include "runtime/work_tracer.h"

namespace brick::profiler {

// Marks the calling thread's work now, on `tracer` (started).
WorkMark mark_work(runtime::WorkTracer& tracer) noexcept;

// The calling thread will queue no traced work until its next mark: its segment is popped from
// the tracer (so no id of brick's stays on the thread for another profiler's tracing to meet).
// Returns the mark where it ended (thread 0: it had none): no later mark is below it.
WorkMark end_work_marks(runtime::WorkTracer& tracer) noexcept;

}  // namespace brick::profiler
