// The profiler's fork() handling (internal to the profiler layer).
//
// A forked child (a DataLoader worker, say) records into its own, empty registry and timeline;
// the parent's figures are untouched. Only the forking thread exists in the child, so every
// lock the profiler's threads take is held across fork() (taken in the prepare hooks, released
// on both sides after it), and threads the profiler started are restarted on demand in the
// child. fork.cpp registers the handlers (pthread_atfork) when the module loads and calls each
// piece's hooks below: prepare in this order, the after hooks in reverse.
#pragma once

namespace brick::profiler {

// observer.cpp: the control lock; the child gets a new registry.
void prepare_observer_for_fork();
void observer_after_fork_in_parent();
void observer_after_fork_in_child();

// stub_event_pool.cpp: the depot's lock; the child's refill thread starts on demand.
void prepare_stub_pool_for_fork();
void stub_pool_after_fork(bool in_child);

// timeline.cpp: the timeline's locks; the child's timeline starts empty.
void prepare_timeline_for_fork();
void timeline_after_fork(bool in_child);

// stubs.cpp: the child's record() failures start from zero.
void stubs_after_fork_in_child();

}  // namespace brick::profiler
