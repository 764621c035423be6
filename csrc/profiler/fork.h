// The profiler's fork() handlers (internal to the profiler layer).
//
// A forked child (a DataLoader worker, say) records into its own, empty registry and timeline;
// the parent's figures are untouched. Only the forking thread exists in the child, so every
// lock the profiler uses is taken before the fork and released on both sides, and threads the
// profiler started are restarted on demand in the child.
#pragma once

namespace brick::profiler {

void prepare_observer_for_fork();
void observer_after_fork_in_parent();
void observer_after_fork_in_child();

}  // namespace brick::profiler
