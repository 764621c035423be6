// The timing events brick's ProfilerStubs hand to PyTorch's legacy profiler, pooled.
//
// PyTorch holds every event of a profile until it post-processes the profile, then drops them,
// often on another thread than the one that recorded them. A thread takes and returns slots
// through a cache of its own, without a lock; a process-wide depot, behind a mutex taken once
// per batch, moves slots between threads and is topped up by a background thread as it runs
// low, so record() neither locks nor creates events on its common path.
#pragma once

#include <cstddef>

#include "runtime/runtime.h"

namespace brick::profiler {

struct StubSlot {
  // Room for the std::shared_ptr control block (and the object in it) that carries the event
  // to PyTorch: the stubs construct it here, not on the heap.
  static constexpr size_t kStorageBytes = 64;
  alignas(std::max_align_t) std::byte storage[kStorageBytes];
  runtime::Event* event;  // a timing event on `device`, the slot's for the life of the process
  int device;
};

// A slot whose event is on `device`. Throws what creating an event throws (only when the pool
// has none left for the device, the background refill having fallen behind).
StubSlot* acquire_stub_slot(int device);

// Gives `slot` back, on any thread.
void release_stub_slot(StubSlot* slot) noexcept;

}  // namespace brick::profiler
