// Autocast on brick: not supported yet, and saying so.
//
// `torch.amp.autocast("brick", enabled=False)` must work: PyTorch itself opens it whenever brick
// is the current accelerator (activation checkpointing re-runs a forward under the autocast
// state it saw, on every accelerator), and the device module answers get_amp_supported_dtype()
// for it. With autocast enabled, every op would reach the AutocastPrivateUse1 key, where brick
// has no casting policy: instead of PyTorch's "Could not run ... from the 'Autocastbrick'
// backend", the op fails naming the cause.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace brick::backend {

namespace {

void autocast_unsupported(const c10::OperatorHandle& op, c10::DispatchKeySet /*key_set*/,
                          torch::jit::Stack* /*stack*/) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "brick: ", op.schema().operator_name(),
      " ran under torch.autocast(\"brick\"), which brick does not support yet (it has no "
      "casting policy); run the region without autocast, or cast explicitly");
}

}  // namespace

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&autocast_unsupported>());
}

}  // namespace brick::backend
