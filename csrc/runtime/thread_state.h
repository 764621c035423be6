// Per-thread state shared by the runtime implementations (detail::ThreadState, runtime.h): the
// calling thread's current device and its current stream on every device, kept apart per runtime
// instance.
//
// Internal to csrc/runtime; the backend never includes this.
#pragma once

#include <cstdint>
#include <new>

#include "runtime/runtime.h"

namespace brick::runtime::detail {

// Finds or creates the calling thread's state for runtime `owner`. Throws std::bad_alloc.
ThreadState& thread_state_slow(uint64_t owner);

inline ThreadState& thread_state(uint64_t owner) {
  ThreadState* last = tls_last_thread_state;
  if (last != nullptr && last->owner == owner) [[likely]]
    return *last;
  return thread_state_slow(owner);
}

// The calling thread's current device for runtime `owner`. When its state cannot be allocated
// the thread has never set a device, so it is still on device 0.
inline DeviceIndex current_device_of(uint64_t owner) noexcept {
  try {
    return thread_state(owner).device;
  } catch (const std::bad_alloc&) {
    return 0;
  }
}

}  // namespace brick::runtime::detail
