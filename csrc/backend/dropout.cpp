// Dropout on brick draws from brick's generator and takes the backing device's path.
//
// `native_dropout` has no generator argument: its backing kernel draws from the backing device's
// default generator, so run through the fallback it advanced the CPU's (or torch.cuda's) stream,
// not brick's, and `torch.brick.manual_seed` did not make dropout reproducible. Brick's kernel
// hands the backing device's dropout brick's generator instead.
//
// `dropout` (F.dropout, nn.Dropout, the dropout of SDPA's math path and between RNN layers) is a
// composite that takes the fused `native_dropout` for non-CPU devices and a bernoulli_ / div_ /
// mul composition on the CPU. The two round differently in reduced precision, and their
// gradients are different ops, so on the host runtime brick takes the CPU's composition (at the
// autograd key, as the composite itself runs), and on CUDA backing CUDA's fused path.
#include <ATen/ATen.h>
#include <ATen/ops/dropout_native.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "backend/backing_call.h"
#include "backend/device_index.h"
#include "backend/generator.h"

namespace brick::backend {

namespace {

const at::Generator& backing_default_generator(c10::DeviceIndex device) {
  const at::Generator& generator = brick_default_generator(device);
  return static_cast<const BrickGenerator*>(generator.unsafeGetGeneratorImpl())->backing();
}

std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p,
                                                  std::optional<bool> train) {
  // The backing kernels' own cases that draw nothing: no elements, or evaluation mode.
  if (input.numel() == 0) return {input, at::empty_like(input)};
  if (train.has_value() && !*train) {
    return {input.clone(),
            at::ones_like(input, input.options().dtype(at::kBool), input.suggest_memory_format())};
  }
  DispatchingBackingCall call("aten::native_dropout", "", input.device().index());
  const at::Generator& generator = backing_default_generator(call.device());
  const double keep = 1. - p;
  auto [output, mask] = call.run([&]() -> std::tuple<at::Tensor, at::Tensor> {
    const at::Tensor& x = call.alias(input);
    if (cuda_backing()) {
      // CUDA's native_dropout is its fused dropout with a bool mask and the default generator.
      auto [out, byte_mask] = at::_fused_dropout(x, keep, generator);
      return {std::move(out), byte_mask.to(at::kBool)};
    }
    // The CPU's native_dropout, drawing from brick's generator.
    const double scale = keep == 0 ? 0. : 1. / keep;
    at::Tensor draws = at::empty_like(x, at::MemoryFormat::Contiguous);
    draws.bernoulli_(keep, generator);
    at::Tensor out = x.mul(draws).mul_(scale);
    return {std::move(out), draws.to(at::kBool)};
  });
  return {call.adopt(std::move(output)), call.adopt(std::move(mask))};
}

// The CPU's dropout composite, on brick ops (each records its own autograd node and draws from
// brick's generator through the fallback).
at::Tensor host_dropout(const at::Tensor& input, double p, bool train) {
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  if (p == 0 || !train || input.sym_numel() == 0) return input;
  if (p == 1) return input.mul(at::zeros({}, input.options()));
  at::Tensor noise = at::empty_like(input);
  noise.bernoulli_(1 - p);
  noise.div_(1 - p);
  return input.mul(noise);
}

at::Tensor dropout(const at::Tensor& input, double p, bool train) {
  if (cuda_backing()) return at::native::dropout(input, p, train);  // PyTorch's own composite
  return host_dropout(input, p, train);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("native_dropout", native_dropout); }

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) { m.impl("dropout", dropout); }

}  // namespace brick::backend
