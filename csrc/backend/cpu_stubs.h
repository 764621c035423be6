// The CPU's own kernels as the PrivateUse1 entries of the DispatchStubs that brick's structured
// kernels reach (structured_kernels.cpp): a TensorIterator built on brick tensors dispatches its
// stub by device type, and on the host runtime brick's device is the CPU's memory.
#pragma once

namespace brick::backend {

// Sets each listed stub's PrivateUse1 entry to the CPU kernel PyTorch itself picks on this
// machine (by the CPU capability: AVX512, else AVX2, else the default). Returns false where that
// choice cannot be made as PyTorch makes it (not an x86-64 build): brick's structured kernels
// then stay off and its ops alias their arguments as before.
bool use_the_cpus_stubs();

}  // namespace brick::backend
