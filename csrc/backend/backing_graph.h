// The composite ops that branch on the device type in ways that change results (the recurrent
// layers and cells), run on host backing as the CPU runs them: on aliases of brick memory, the
// CPU's autograd graph included.
#pragma once

namespace brick::backend {

// Registers brick's autograd kernels for those ops. Run once host backing is decided; on CUDA
// backing these ops decompose on brick.
void register_host_backing_kernels();

}  // namespace brick::backend
