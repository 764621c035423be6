// The CPU's own kernels as the PrivateUse1 entries of the DispatchStubs that brick's structured
// kernels reach (direct_kernels.cpp): a TensorIterator built on brick tensors dispatches its stub
// by device type, and on the host runtime brick's device is the CPU's memory.
#pragma once

#include <ATen/native/Copy.h>

#include <atomic>

namespace brick::backend {

namespace detail {
extern std::atomic<bool> g_cpu_stubs_in_use;
extern at::native::copy_fn g_cpu_copy_kernel;
}  // namespace detail

// On the host runtime, once, when the backing is decided (before the first brick tensor exists):
// sets each listed stub's PrivateUse1 entry to the CPU kernel PyTorch itself picks on this
// machine (by the CPU capability: AVX512, else AVX2, else the default). Where that choice cannot
// be made as PyTorch makes it (not an x86-64 build), nothing is set: brick's structured kernels
// stay off and its ops alias their arguments. On CUDA backing it is never called: brick's memory
// is the GPU's there, which no CPU kernel may touch.
void use_the_cpus_stubs();

// Whether brick's stub entries are the CPU's kernels (so brick runs structured CPU kernels on
// brick tensors): one load per op.
inline bool cpu_stubs_in_use() noexcept {
  return detail::g_cpu_stubs_in_use.load(std::memory_order_acquire);
}

// copy_stub's CPU kernel, for the copies brick builds its own iterator for (a stub's call is not
// exported from libtorch, its kernels are). Set while cpu_stubs_in_use().
inline at::native::copy_fn cpu_copy_kernel() noexcept { return detail::g_cpu_copy_kernel; }

}  // namespace brick::backend
