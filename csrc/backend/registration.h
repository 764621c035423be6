// Brick's registration with PyTorch as the PrivateUse1 device: the top floor of the backend,
// which stands on every other file of it.
#pragma once

namespace brick::backend {

// Registered once: hooks, device guard, generator, allocator. Safe to call repeatedly.
void ensure_registered();

}  // namespace brick::backend
