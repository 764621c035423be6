// Registers the profiler's fork() handlers (see fork.h).
#include "profiler/fork.h"

#include <pthread.h>

namespace brick::profiler {

namespace {

void prepare_fork() {
  prepare_observer_for_fork();
  prepare_stub_pool_for_fork();
  prepare_timeline_for_fork();
}

void after_fork_in_parent() {
  timeline_after_fork(/*in_child=*/false);
  stub_pool_after_fork(/*in_child=*/false);
  observer_after_fork_in_parent();
}

void after_fork_in_child() {
  timeline_after_fork(/*in_child=*/true);
  stub_pool_after_fork(/*in_child=*/true);
  stubs_after_fork_in_child();
  observer_after_fork_in_child();
}

// When the module loads, before the profiler has started a thread or taken a lock.
[[maybe_unused]] const int g_fork_handlers_installed =
    pthread_atfork(&prepare_fork, &after_fork_in_parent, &after_fork_in_child);

}  // namespace

}  // namespace brick::profiler
