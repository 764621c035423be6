// The boxed fallback: every aten op without a brick kernel of its own runs through it, as the
// backing device's kernel on the same memory.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace brick::backend {

// Runs `op` on `stack` through the boxed fallback: for the direct kernels' unusual calls.
void run_boxed_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Registers the fallback as brick's own kernel for ops PyTorch would otherwise decompose into
// an allocation plus their out= form; returns how many. Called by ensure_registered().
int register_direct_fallback_kernels();

// Registers the fallback as brick's own kernel on its sparse and nested keys (SparsePrivateUse1,
// SparseCsrPrivateUse1, NestedTensorPrivateUse1) for ops with a sparse (nested) kernel of a
// backing device, which PyTorch would otherwise run as their composite kernel; returns how many.
// Called by ensure_registered().
int register_layout_fallback_kernels();

// On CUDA backing, registers the fallback as brick's own kernel for ops that decompose on every
// device but CUDA, whose own kernel is one fused kernel there (_fused_rms_norm: F.rms_norm is
// one CUDA kernel, six without it); returns how many. Run once CUDA backing is decided
// (detail::set_backing_setup): on host backing these ops keep their decomposition (the CPU has
// no such kernel, nor one for their backward).
int register_cuda_backing_kernels();

}  // namespace brick::backend
