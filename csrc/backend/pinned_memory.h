// Pinned host memory on the host runtime: blocks of host memory that `is_host_pinned`
// recognises, for any address inside one (PyTorch's `pin_memory()` for brick).
#pragma once

#include <c10/core/Allocator.h>

namespace brick::backend {

c10::Allocator* host_pinned_allocator();
bool is_host_pinned(const void* data);

}  // namespace brick::backend
