// Publishing the launch hooks (launch_observer.h).
//
// A launch reads the table pointer once and calls through that table until it ends, without a
// lock or a reference count, so a table must stay valid for the process once published: a launch
// on another thread may still be reading it after it was replaced. Tables are therefore never
// freed. They are interned instead: each distinct set of hooks is allocated once, kept in a list
// for the process, and reused whenever it is published again, so the memory kept is bounded by
// the distinct combinations of hooks the process installs (a few: the registry's two hooks and
// the activity recorder, each on or off), not by how often profiles start and stop.
//
// Lock-free (compare-and-swap), so that a forked child can install hooks whatever another thread
// of its parent was doing at the fork.
#include "runtime/launch_observer.h"

#include <atomic>

namespace brick::runtime {

namespace {

struct PublishedTable {
  LaunchHooks hooks;
  const PublishedTable* next;
};

// Every table published (but the empty one, which is static), newest first.
constinit std::atomic<const PublishedTable*> g_published{nullptr};

// The published table holding `hooks`, added to the list on its first use. An allocation that
// fails here (once per distinct table, a few dozen bytes) ends the process: the setters cannot
// fail, and a launch must never see a half-installed hook.
const LaunchHooks* intern(const LaunchHooks& hooks) noexcept {
  if (hooks == detail::kNoLaunchHooks) return &detail::kNoLaunchHooks;
  const PublishedTable* head = g_published.load(std::memory_order_acquire);
  PublishedTable* added = nullptr;
  for (;;) {
    for (const PublishedTable* table = head; table != nullptr; table = table->next) {
      if (table->hooks == hooks) {
        delete added;  // never published
        return &table->hooks;
      }
    }
    if (added == nullptr) added = new PublishedTable{hooks, nullptr};
    added->next = head;
    // On failure `head` is the list another thread extended meanwhile: searched again.
    if (g_published.compare_exchange_weak(head, added, std::memory_order_release,
                                          std::memory_order_acquire)) {
      return &added->hooks;
    }
  }
}

// Publishes the current table with `change` applied to a copy of it. Two threads changing
// different hooks at once both take effect: a change is applied to the table it replaces.
template <typename Change>
void publish(Change change) noexcept {
  const LaunchHooks* current = detail::g_launch_hooks.load(std::memory_order_acquire);
  for (;;) {
    LaunchHooks next = *current;
    change(next);
    const LaunchHooks* table = intern(next);
    if (detail::g_launch_hooks.compare_exchange_weak(current, table, std::memory_order_release,
                                                     std::memory_order_acquire)) {
      return;
    }
  }
}

}  // namespace

void set_launch_observer(LaunchObserver* observer) noexcept {
  publish([&](LaunchHooks& hooks) { hooks.observer = observer; });
}

void set_kernel_timer(const KernelTimer* timer) noexcept {
  publish([&](LaunchHooks& hooks) { hooks.kernel_timer = timer; });
}

void set_queue_hook(QueueHook hook) noexcept {
  publish([&](LaunchHooks& hooks) { hooks.queue_hook = hook; });
}

void set_launch_trace(const LaunchTrace* trace) noexcept {
  publish([&](LaunchHooks& hooks) { hooks.trace = trace; });
}

}  // namespace brick::runtime
