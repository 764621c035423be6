// Convolution on brick: PyTorch routes the convolutions of devices other than CPU and CUDA to
// convolution_overrideable and its backward, which brick runs as the backing device's
// at::convolution and at::convolution_backward over aliases of its tensors.
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <tuple>

#include "backend/backing_call.h"

namespace brick::backend {

namespace {

at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                    c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                    bool transposed, c10::IntArrayRef output_padding,
                                    int64_t groups) {
  TORCH_CHECK(input.device() == weight.device(), "brick: convolution got input on ", input.device(),
              " and weight on ", weight.device());
  DispatchingBackingCall call("aten::convolution_overrideable", "", input.device().index());
  return call.adopt(call.run([&] {
    return at::convolution(call.alias(input), call.alias(weight), call.alias(bias), stride, padding,
                           dilation, transposed, output_padding, groups);
  }));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
    c10::IntArrayRef output_padding, int64_t groups, std::array<bool, 3> output_mask) {
  DispatchingBackingCall call("aten::convolution_backward_overrideable", "",
                              input.device().index());
  const int64_t bias_channels = transposed ? weight.size(1) * groups : weight.size(0);
  return call.adopt(call.run([&] {
    return at::convolution_backward(call.alias(grad_output), call.alias(input), call.alias(weight),
                                    c10::IntArrayRef(bias_channels), stride, padding, dilation,
                                    transposed, output_padding, groups, output_mask);
  }));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", convolution_overrideable);
  m.impl("convolution_backward_overrideable", convolution_backward_overrideable);
}

}  // namespace brick::backend
