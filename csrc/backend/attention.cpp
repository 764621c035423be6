// scaled_dot_product_attention on brick takes the kernel its backing device would take.
//
// PyTorch asks a device's `_fused_sdp_choice_stub` which SDPA kernel to run and runs the math
// decomposition on devices without one, which changes results (bf16 above all) against the
// backing device. Brick's stub asks the backing device's own choice, on aliases of the inputs:
//   - on the host runtime the CPU's answer (its fused flash kernel, or math) is PyTorch's CPU
//     path, whose ops (`_scaled_dot_product_flash_attention_for_cpu` and its backward) run on
//     brick through direct kernels (direct_kernels.cpp);
//   - on CUDA backing cuDNN, memory-efficient and math attention go the same way; CUDA's flash
//     kernel is reached by device type in PyTorch, so brick answers `overrideable` and runs it
//     below, padding the head dimension to a multiple of 8 as PyTorch's CUDA path does.
#include <ATen/ATen.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <torch/library.h>

#include <cmath>
#include <optional>
#include <tuple>

#include "backend/backing.h"
#include "backend/backing_alias.h"
#include "backend/backing_call.h"
#include "backend/device_index.h"

namespace brick::backend {

namespace {

// For the kernel choice, which also depends on which inputs need gradients (the fused kernels
// have no gradient for a mask, for one).
// Tensors without memory of their own: fake and functional tensors while torch.compile traces,
// symbolic sizes. The choice reads only metadata, so the backing kernel gets them as they are.
bool is_metadata_only(const at::Tensor& tensor) {
  const c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  const c10::DispatchKeySet keys = tensor.key_set();
  return impl->has_symbolic_sizes_strides() || !impl->has_storage() ||
         keys.has(c10::DispatchKey::Python) || keys.has(c10::DispatchKey::Functionalize);
}

at::Tensor backing_view_for_choice(const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.is_privateuseone() || is_metadata_only(tensor)) return tensor;
  // An alias of its own, not a lent one: it may be marked as requiring grad.
  at::Tensor view = make_backing_alias(tensor);
  if (tensor.requires_grad() && !view.requires_grad()) {
    view.requires_grad_(true);
  }
  return view;
}

std::optional<at::Tensor> backing_view_for_choice(const std::optional<at::Tensor>& tensor) {
  if (!tensor.has_value()) return std::nullopt;
  return backing_view_for_choice(*tensor);
}

int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p,
                         bool is_causal, std::optional<double> scale, bool enable_gqa) {
  BackingScope scope(query.device().index());
  // Straight to the backing device's kernel (what its stub runs), not recorded as an op: the
  // choice is part of SDPA, as on the backing device.
  const int64_t choice = at::_ops::_fused_sdp_choice::redispatch(
      backing_dispatch_key_set(), backing_view_for_choice(query), backing_view_for_choice(key),
      backing_view_for_choice(value), backing_view_for_choice(attn_mask), dropout_p, is_causal,
      scale, enable_gqa);
  if (cuda_backing() && choice == static_cast<int64_t>(at::SDPBackend::flash_attention)) {
    return static_cast<int64_t>(at::SDPBackend::overrideable);
  }
  return choice;
}

// CUDA's flash kernel wants a head dimension that is a multiple of 8; zero padding is exact (the
// padded columns of V give zero output columns, and zero gradient columns give nothing back).
constexpr int64_t kFlashHeadAlignment = 8;

at::Tensor pad_head_dim(const at::Tensor& tensor) {
  const int64_t remainder = tensor.size(-1) % kFlashHeadAlignment;
  if (remainder == 0) return tensor;
  return at::constant_pad_nd(tensor, {0, kFlashHeadAlignment - remainder}, 0);
}

at::Tensor unpad_head_dim(const at::Tensor& tensor, int64_t head_dim) {
  return tensor.size(-1) == head_dim ? tensor : tensor.narrow(-1, 0, head_dim).contiguous();
}

double softmax_scale(const at::Tensor& query, std::optional<double> scale) {
  return scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(query.size(-1)));
}

// Results on the backing device become brick tensors; host tensors (CUDA flash's philox seed and
// offset) stay where they are.
at::Tensor to_brick_result(const DispatchingBackingCall& call, at::Tensor tensor) {
  if (!tensor.defined() || tensor.device().type() != backing_device_type()) return tensor;
  return call.adopt(std::move(tensor));
}

void check_cuda_flash(const char* op, const std::optional<at::Tensor>& attn_bias) {
  TORCH_CHECK(cuda_backing(), "brick: ", op,
              " runs CUDA's flash attention and brick chooses it only on CUDA backing; this brick "
              "device is backed by the host, where SDPA takes the CPU's kernels");
  TORCH_CHECK(!attn_bias.has_value() || !attn_bias->defined(), "brick: ", op,
              " runs CUDA's flash attention, which takes no attention mask");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor,
           at::Tensor, at::Tensor>
fused_attention_overrideable(const at::Tensor& query, const at::Tensor& key,
                             const at::Tensor& value, const std::optional<at::Tensor>& attn_bias,
                             double dropout_p, bool is_causal, bool return_debug_mask,
                             std::optional<double> scale) {
  check_cuda_flash("_scaled_dot_product_fused_attention_overrideable", attn_bias);
  DispatchingBackingCall call("aten::_scaled_dot_product_fused_attention_overrideable", "",
                              query.device().index());
  const int64_t head_dim = query.size(-1);
  auto [out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, philox_seed, philox_offset,
        debug_mask] = call.run([&] {
    return at::_scaled_dot_product_flash_attention(
        pad_head_dim(call.alias(query)), pad_head_dim(call.alias(key)),
        pad_head_dim(call.alias(value)), dropout_p, is_causal, return_debug_mask,
        softmax_scale(query, scale));
  });
  return {to_brick_result(call, unpad_head_dim(out, head_dim)),
          to_brick_result(call, std::move(logsumexp)),
          to_brick_result(call, std::move(cum_seq_q)),
          to_brick_result(call, std::move(cum_seq_k)),
          std::move(max_q),
          std::move(max_k),
          to_brick_result(call, std::move(philox_seed)),
          to_brick_result(call, std::move(philox_offset)),
          to_brick_result(call, std::move(debug_mask))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_attention_overrideable_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& attn_bias, std::array<bool, 4> /*grad_input_mask*/,
    const at::Tensor& out, const at::Tensor& logsumexp, const at::Tensor& cum_seq_q,
    const at::Tensor& cum_seq_k, c10::SymInt max_q, c10::SymInt max_k, double dropout_p,
    bool is_causal, const at::Tensor& philox_seed, const at::Tensor& philox_offset,
    std::optional<double> scale) {
  check_cuda_flash("_scaled_dot_product_fused_attention_overrideable_backward", attn_bias);
  DispatchingBackingCall call("aten::_scaled_dot_product_fused_attention_overrideable_backward", "",
                              query.device().index());
  const int64_t head_dim = query.size(-1);
  auto [grad_query, grad_key, grad_value] = call.run([&] {
    return at::_scaled_dot_product_flash_attention_backward_symint(
        pad_head_dim(call.alias(grad_out)), pad_head_dim(call.alias(query)),
        pad_head_dim(call.alias(key)), pad_head_dim(call.alias(value)),
        pad_head_dim(call.alias(out)), call.alias(logsumexp), call.alias(cum_seq_q),
        call.alias(cum_seq_k), std::move(max_q), std::move(max_k), dropout_p, is_causal,
        call.alias(philox_seed), call.alias(philox_offset), softmax_scale(query, scale));
  });
  return {to_brick_result(call, unpad_head_dim(grad_query, head_dim)),
          to_brick_result(call, unpad_head_dim(grad_key, head_dim)),
          to_brick_result(call, unpad_head_dim(grad_value, head_dim)), at::Tensor()};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_scaled_dot_product_fused_attention_overrideable", fused_attention_overrideable);
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward",
         fused_attention_overrideable_backward);
}

}  // namespace brick::backend

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &brick::backend::fused_sdp_choice)
}  // namespace at::native
