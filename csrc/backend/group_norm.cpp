// Group norm in the memory format its backing device uses, forward and backward.
//
// PyTorch decides group norm's memory format by device type in two places. Its backward formula
// (derivatives.yaml, native_group_norm) hands the backward kernel the input and the output
// gradient in `input.suggest_memory_format()` on the CPU and contiguous on every other device,
// brick included; the CPU then runs its channels-last kernel where brick would run the contiguous
// one, whose sums round differently (dweight off by ~1e-5 on a channels-last conv activation).
// And the composite `group_norm` keeps a channels-last input channels-last for the CPU and
// PrivateUse1, while CUDA's kernel accepts only contiguous input.
//
// So brick's forward records the memory format the backing device's formula would use on the
// saved mean (a BackendMeta: it travels with the tensor into autograd's saved variables), and
// brick's backward restores it before the backing kernel runs. Results are the backing device's,
// bit for bit; the cost is one copy of the input and the gradient in the backward of a
// channels-last group norm on the host runtime.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/TensorImpl.h>
#include <torch/library.h>

#include "backend/device_index.h"
#include "backend/fallback.h"

namespace brick::backend {

namespace {

// The memory format the backing device's backward receives its input and gradient in.
struct GroupNormBackwardFormat final : c10::BackendMeta {
  GroupNormBackwardFormat(c10::MemoryFormat memory_format, int64_t dim)
      : memory_format(memory_format), dim(dim) {}
  c10::MemoryFormat memory_format;
  int64_t dim;  // the input's: 4 for channels last, 5 for channels last 3d
};

// native_group_norm(Tensor input, Tensor? weight, Tensor? bias, SymInt N, SymInt C, SymInt HxW,
//                   int group, float eps) -> (Tensor out, Tensor mean, Tensor rstd)
void native_group_norm(const c10::OperatorHandle& op, c10::DispatchKeySet /*key_set*/,
                       torch::jit::Stack* stack) {
  constexpr size_t kArguments = 8;
  c10::IValue& input_value = (*stack)[stack->size() - kArguments];
  const at::Tensor input = input_value.toTensor();
  // The backing device's own formula: CUDA's kernel takes contiguous input, the CPU's the input's
  // suggested format (and its backward then receives the same).
  const c10::MemoryFormat memory_format =
      cuda_backing() ? c10::MemoryFormat::Contiguous : input.suggest_memory_format();
  if (!input.is_contiguous(memory_format)) input_value = input.contiguous(memory_format);
  run_boxed_fallback(op, stack);
  if (memory_format != c10::MemoryFormat::Contiguous) {
    const at::Tensor& mean = (*stack)[stack->size() - 2].toTensor();
    mean.unsafeGetTensorImpl()->set_backend_meta(
        c10::make_intrusive<GroupNormBackwardFormat>(memory_format, input.dim()));
  }
}

// native_group_norm_backward(Tensor grad_out, Tensor input, Tensor mean, Tensor rstd,
//                            Tensor? weight, SymInt N, SymInt C, SymInt HxW, int group,
//                            bool[3] output_mask) -> (Tensor, Tensor, Tensor)
void native_group_norm_backward(const c10::OperatorHandle& op, c10::DispatchKeySet /*key_set*/,
                                torch::jit::Stack* stack) {
  constexpr size_t kArguments = 10;
  const size_t first = stack->size() - kArguments;
  const at::Tensor& mean = (*stack)[first + 2].toTensor();
  c10::BackendMeta* meta = mean.unsafeGetTensorImpl()->get_backend_meta();
  // The CPU's channels-last backward kernel crashes when no input gradient is asked for (seen
  // on torch 2.13: a segfault for a group norm whose input needs no gradient); brick keeps the
  // contiguous kernel there, as before.
  const bool input_gradient = (*stack)[first + 9].toBoolList().get(0);
  if (const auto* format = dynamic_cast<const GroupNormBackwardFormat*>(meta);
      format != nullptr && input_gradient) {
    for (size_t i : {first, first + 1}) {  // grad_out, input
      const at::Tensor tensor = (*stack)[i].toTensor();
      if (tensor.dim() == format->dim && !tensor.is_contiguous(format->memory_format)) {
        (*stack)[i] = tensor.contiguous(format->memory_format);
      }
    }
  }
  run_boxed_fallback(op, stack);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_group_norm", torch::CppFunction::makeFromBoxedFunction<&native_group_norm>());
  m.impl("native_group_norm_backward",
         torch::CppFunction::makeFromBoxedFunction<&native_group_norm_backward>());
}

}  // namespace brick::backend
