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
// On the host runtime brick's autograd kernel for a channels-last group norm records its own
// node, whose backward hands the backward kernel what the CPU's formula hands it: no copy to
// contiguous and back, no rows the CPU's profile lacks. Every other case (CUDA backing, a
// contiguous input, forward AD, tensor subclasses, an input without a gradient) runs PyTorch's
// own autograd kernel; there the forward records the format the backing device's formula would
// use on the saved mean (a BackendMeta: it travels with the tensor into autograd's saved
// variables), and brick's backward kernel restores it before the backing kernel runs. Results
// are the backing device's, bit for bit, on every path.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/TensorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>
#include <torch/version.h>

#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/autograd_node.h"
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

at::Tensor optional_tensor(const c10::IValue& value) {
  return value.isNone() ? at::Tensor() : value.toTensor();
}

// The backward of a channels-last group norm on the host runtime, as the CPU's formula runs it
// (derivatives.yaml, native_group_norm): the backward kernel on the tensors in their own layout,
// or, with grad mode on or gradients of mean and rstd, the formula's differentiable composite
// (infinitely_differentiable_native_group_norm_backward), which libtorch does not export and
// which is therefore written out here op for op, so that brick's ops round as the CPU's do.
struct ChannelsLastGroupNormBackward final : torch::autograd::Node {
  ChannelsLastGroupNormBackward(const at::Tensor& input, const at::Tensor& weight, c10::SymInt N,
                                c10::SymInt C, c10::SymInt HxW, int64_t group, double eps)
      : input_(input, /*is_output=*/false),
        weight_(weight, /*is_output=*/false),
        N_(std::move(N)),
        C_(std::move(C)),
        HxW_(std::move(HxW)),
        group_(group),
        eps_(eps) {}

  std::string name() const override { return "NativeGroupNormBackward0"; }

  // Saved after the forward, as outputs of this node (no reference cycle): the differentiable
  // formula reads them with this node as their grad_fn, as the CPU's node does.
  void save_statistics(const at::Tensor& mean, const at::Tensor& rstd) {
    mean_ = torch::autograd::SavedVariable(mean, /*is_output=*/true);
    rstd_ = torch::autograd::SavedVariable(rstd, /*is_output=*/true);
  }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    const at::Tensor input = input_.unpack();
    const at::Tensor weight = weight_.unpack();
    const at::Tensor mean = mean_.unpack(pointer_to(this));
    const at::Tensor rstd = rstd_.unpack(pointer_to(this));
    const std::array<bool, 3> mask = {should_compute_output(0), should_compute_output(1),
                                      should_compute_output(2)};
    torch::autograd::variable_list result(3);
    if (at::GradMode::is_enabled() || grads[1].defined() || grads[2].defined()) {
      std::tie(result[0], result[1], result[2]) =
          differentiable_backward(grads[0], grads[1], grads[2], input, mean, rstd, weight, mask);
    } else if (grads[0].defined()) {
      const c10::MemoryFormat format = input.suggest_memory_format();
      std::tie(result[0], result[1], result[2]) = at::native_group_norm_backward_symint(
          grads[0].contiguous(format), input.contiguous(format), mean, rstd, weight, N_, C_, HxW_,
          group_, mask);
    }
    return result;
  }

  void release_variables() override {
    input_.reset_data();
    weight_.reset_data();
    mean_.reset_data();
    rstd_.reset_data();
  }

 private:
  std::tuple<at::Tensor, at::Tensor, at::Tensor> differentiable_backward(
      const at::Tensor& dY, const at::Tensor& dmean, const at::Tensor& drstd, const at::Tensor& X,
      const at::Tensor& mean, const at::Tensor& rstd, const at::Tensor& gamma,
      const std::array<bool, 3>& mask) const {
    const int64_t G = group_;
    const c10::SymInt D = C_ / G;
    const c10::SymFloat s = c10::SymFloat(1.0) / c10::SymFloat(D * HxW_);
    const at::Tensor x = X.reshape_symint({N_, G, D, HxW_});
    const at::Tensor mean4 = mean.reshape_symint({N_, G, 1, 1});
    const at::Tensor rstd4 = rstd.reshape_symint({N_, G, 1, 1});
    at::Tensor dy, ds, db;
    if (dY.defined()) {
      dy = dY.reshape_symint({N_, G, D, HxW_});
      ds = (dy * x).sum(3).unsqueeze_(-1);
      db = dy.sum(3).unsqueeze_(-1);
    }
    at::Tensor dX, dgamma, dbeta;
    if (mask[0]) {
      const at::Tensor gamma4 = gamma.defined() ? gamma.reshape_symint({1, G, D, 1}) : at::Tensor();
      // Unused by the formula, computed by it all the same: the profile holds the CPU's ops.
      (void)((rstd4 * rstd4).reciprocal_() - eps_).clamp_min(0);
      const at::Tensor rstd_cube = rstd4 * rstd4 * rstd4;
      at::Tensor dvar;
      if (drstd.defined()) dvar = -0.5 * rstd_cube * drstd.view_symint({N_, G, 1, 1});
      // var_mean_backward over dims 2 and 3, correction 0, keepdim.
      auto statistics_gradient = [&]() {
        const double count = static_cast<double>((D * HxW_).guard_int(__FILE__, __LINE__));
        at::Tensor from_var = (2.0 / count) * dvar * (x - x.mean({2, 3}, /*keepdim=*/true));
        at::Tensor from_mean = dmean.view_symint({N_, G, 1, 1}).expand_symint(x.sym_sizes()) /
                               (D * HxW_).guard_int(__FILE__, __LINE__);
        return from_var + from_mean;
      };
      if (dY.defined()) {
        const at::Tensor a = gamma.defined() ? rstd4 * gamma4 : rstd4;
        at::Tensor b = (gamma.defined() ? (ds * gamma4).sum(2) : ds.sum(2)).unsqueeze_(-2);
        at::Tensor c = (gamma.defined() ? (db * gamma4).sum(2) : db.sum(2)).unsqueeze_(-2);
        b = (c * mean4 - b) * rstd_cube * s;
        c = -b * mean4 - c * rstd4 * s;
        dX = a * dy + b * x + c;
        if (dmean.defined() && drstd.defined()) dX += statistics_gradient();
        dX = dX.reshape_as(X);
      } else if (dmean.defined() && drstd.defined()) {
        dX = statistics_gradient().reshape_as(X);
      }
    }
    if (mask[1] && dY.defined()) dgamma = ((ds - db * mean4) * rstd4).sum(0).reshape_as(gamma);
    if (mask[2] && dY.defined()) dbeta = db.sum(0).reshape_as(gamma);
    return {dX, dgamma, dbeta};
  }

  torch::autograd::SavedVariable input_, weight_, mean_, rstd_;
  c10::SymInt N_, C_, HxW_;
  int64_t group_;
  double eps_;
};

// The node's differentiable path is PyTorch 2.13's formula, op for op, and bit-equal to the CPU
// only where it is that release's (torch 2.14's rounds differently: measured in the 2.14.1 lane);
// elsewhere brick takes PyTorch's own node, with its copies.
constexpr bool kFormulaOfThisRelease = TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR == 13;

bool plain_tensor(const at::Tensor& tensor) {
  if (!tensor.defined()) return true;
  const c10::DispatchKeySet keys = tensor.key_set();
  return !keys.has(c10::DispatchKey::Python) && !keys.has(c10::DispatchKey::Functionalize) &&
         !tensor._fw_grad(/*level=*/0).defined();
}

// Autograd kernel of native_group_norm: brick's node for a channels-last input on the host
// runtime, PyTorch's own autograd kernel for every other case.
void native_group_norm_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet key_set,
                                torch::jit::Stack* stack) {
  constexpr size_t kArguments = 8;
  const size_t first = stack->size() - kArguments;
  const at::Tensor input = (*stack)[first].toTensor();
  const at::Tensor weight = optional_tensor((*stack)[first + 1]);
  const at::Tensor bias = optional_tensor((*stack)[first + 2]);
  const bool own_node = kFormulaOfThisRelease && !cuda_backing() && at::GradMode::is_enabled() &&
                        input.requires_grad() &&
                        input.suggest_memory_format() != c10::MemoryFormat::Contiguous &&
                        plain_tensor(input) && plain_tensor(weight) && plain_tensor(bias);
  if (!own_node) {
    op.callBoxedForDispatchKey(c10::DispatchKey::Autograd, *stack);
    return;
  }
  auto node = make_node<ChannelsLastGroupNormBackward>(
      input, weight, (*stack)[first + 3].toSymInt(), (*stack)[first + 4].toSymInt(),
      (*stack)[first + 5].toSymInt(), (*stack)[first + 6].toInt(), (*stack)[first + 7].toDouble());
  node->set_next_edges(torch::autograd::collect_next_edges(input, weight, bias));
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.redispatchBoxed(key_set & c10::after_ADInplaceOrView_keyset, stack);
  }
  const size_t outputs = stack->size() - 3;
  for (size_t i = 0; i < 3; ++i) {
    const at::Tensor& output = (*stack)[outputs + i].toTensor();
    const uint32_t input_nr = node->add_input_metadata(output);
    torch::autograd::impl::set_gradient_edge(output, torch::autograd::Edge(node, input_nr));
  }
  node->save_statistics((*stack)[outputs + 1].toTensor(), (*stack)[outputs + 2].toTensor());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_group_norm", torch::CppFunction::makeFromBoxedFunction<&native_group_norm>());
  m.impl("native_group_norm_backward",
         torch::CppFunction::makeFromBoxedFunction<&native_group_norm_backward>());
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("native_group_norm",
         torch::CppFunction::makeFromBoxedFunction<&native_group_norm_autograd>());
}

}  // namespace brick::backend
