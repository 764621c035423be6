// Autocast on brick: `torch.autocast("brick", dtype=torch.bfloat16 or torch.float16)` casts as
// the backing device's autocast does: the CPU's policy on the host runtime, CUDA's on CUDA
// backing, so a brick run equals the backing device's under autocast too.
//
// The policies are PyTorch's own: its autocast wrappers (the cast rules, the weight-cast cache
// and the re-dispatch), for the ops the backing device's autocast lists. CPU: the list below, as
// AutocastCPU registers it (aten/src/ATen/autocast_mode.cpp). CUDA: the op lists PyTorch's header
// publishes for backends to reuse (AT_FORALL_*, ATen/autocast_mode.h), which AutocastCUDA
// registers, and binary_cross_entropy refused as CUDA refuses it. Every other op falls through.
// Which policy applies is known once the runtime is chosen: it is registered then
// (install_autocast_policy, called when the backing is decided, before any brick tensor exists).
// The tests compare both lists with the installed PyTorch's AutocastCPU and AutocastCUDA
// registrations, so a release that changes a policy shows up as a failure, not as silently
// different casts.
#include "backend/autocast.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/library.h>
#include <torch/version.h>

#include <atomic>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#define BRICK_TORCH_BEFORE_2_13 \
  (TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 13))
#define BRICK_TORCH_BEFORE_2_14 \
  (TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 14))

namespace brick::backend {
namespace {

using at::Tensor;

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

// What PyTorch's KERNEL macros register into (`m.impl(name, kernel)`): records each op's name
// and, when installing, registers the kernel with the library.
class PolicyRegistrar {
 public:
  explicit PolicyRegistrar(torch::Library* library) : library_(library) {}

  template <typename Name, typename Kernel>
  PolicyRegistrar& impl(Name&& name, Kernel&& kernel) {
    names_.emplace_back(static_cast<const char*>(name));
    if (library_ != nullptr) library_->impl(std::forward<Name>(name), std::forward<Kernel>(kernel));
    return *this;
  }

  std::vector<std::string> names() && { return std::move(names_); }

 private:
  torch::Library* library_;
  std::vector<std::string> names_;
};

Tensor binary_cross_entropy_banned(const Tensor&, const Tensor&, const std::optional<Tensor>&,
                                   int64_t) {
  TORCH_CHECK(
      false,
      "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to "
      "autocast.\nMany models use a sigmoid layer right before the binary cross entropy "
      "layer.\nIn this case, combine the two layers using "
      "torch.nn.functional.binary_cross_entropy_with_logits\nor torch.nn.BCEWithLogitsLoss. "
      " binary_cross_entropy_with_logits and BCEWithLogits are\nsafe to autocast.");
}

// CUDA's policy (AutocastCUDA's registrations), for brick devices backed by CUDA devices.
void cuda_policy(PolicyRegistrar& m) {
  using namespace at;  // NOLINT: the AT_FORALL lists name ATen types unqualified (Scalar, ...)
#define BRICK_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define BRICK_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define BRICK_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define BRICK_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(BRICK_LOWER_PRECISION_FP)
  KERNEL_PRIVATEUSEONE(cudnn_convolution, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(cudnn_convolution_transpose, lower_precision_fp)
  AT_FORALL_FP32(BRICK_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(BRICK_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(BRICK_PROMOTE)
#undef BRICK_LOWER_PRECISION_FP
#undef BRICK_FP32
#undef BRICK_FP32_SET_OPT_DTYPE
#undef BRICK_PROMOTE
#if !BRICK_TORCH_BEFORE_2_14
  KERNEL_PRIVATEUSEONE(linalg_matrix_sqrth, fp32)
#endif
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"),
         TORCH_FN((&binary_cross_entropy_banned)));
}

// The CPU's policy (AutocastCPU's registrations), for brick devices backed by the host.
void cpu_policy(PolicyRegistrar& m) {
  // lower_precision_fp
  KERNEL_PRIVATEUSEONE(conv1d, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(conv1d, padding, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(conv2d, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(conv2d, padding, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(conv3d, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(conv3d, padding, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(bmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(mm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(linalg_vecdot, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(baddbmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(addmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(addbmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(linear, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(_convolution, deprecated, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(matmul, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(conv_tbc, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(mkldnn_rnn_layer, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(conv_transpose1d, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(conv_transpose2d, input, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(conv_transpose3d, input, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(prelu, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(scaled_dot_product_attention, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(_native_multi_head_attention, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(_addmm_activation, lower_precision_fp)

  // fp32
  KERNEL_PRIVATEUSEONE(avg_pool3d, fp32)
  KERNEL_PRIVATEUSEONE(binary_cross_entropy, fp32)
  KERNEL_PRIVATEUSEONE(grid_sampler, fp32)
  KERNEL_PRIVATEUSEONE(polar, fp32)
  KERNEL_PRIVATEUSEONE(prod, fp32)
  KERNEL_PRIVATEUSEONE(prod, dim_int, fp32)
#if BRICK_TORCH_BEFORE_2_13  // (torch 2.11 lists the named-dimension overloads; 2.13 does not)
  KERNEL_PRIVATEUSEONE(prod, dim_Dimname, fp32)
#endif
  KERNEL_PRIVATEUSEONE(quantile, fp32)
  KERNEL_PRIVATEUSEONE(quantile, scalar, fp32)
  KERNEL_PRIVATEUSEONE(nanquantile, fp32)
  KERNEL_PRIVATEUSEONE(nanquantile, scalar, fp32)
  KERNEL_PRIVATEUSEONE(stft, fp32)
  KERNEL_PRIVATEUSEONE(stft, center, fp32)
  KERNEL_PRIVATEUSEONE(cdist, fp32)
  KERNEL_PRIVATEUSEONE(grid_sampler_2d, fp32)
  KERNEL_PRIVATEUSEONE(_grid_sampler_2d_cpu_fallback, fp32)
  KERNEL_PRIVATEUSEONE(grid_sampler_3d, fp32)
  KERNEL_PRIVATEUSEONE(trace, fp32)
  KERNEL_PRIVATEUSEONE(view_as_complex, fp32)
#if BRICK_TORCH_BEFORE_2_14  // removed in PyTorch 2.14
  KERNEL_PRIVATEUSEONE(cholesky, fp32)
#endif
  KERNEL_PRIVATEUSEONE(cholesky_inverse, fp32)
  KERNEL_PRIVATEUSEONE(cholesky_solve, fp32)
  KERNEL_PRIVATEUSEONE(inverse, fp32)
  KERNEL_PRIVATEUSEONE(lu_solve, fp32)
  KERNEL_PRIVATEUSEONE(orgqr, fp32)
  KERNEL_PRIVATEUSEONE(ormqr, fp32)
  KERNEL_PRIVATEUSEONE(pinverse, fp32)
  KERNEL_PRIVATEUSEONE(max_pool3d, fp32)
  KERNEL_PRIVATEUSEONE(max_unpool2d, fp32)
  KERNEL_PRIVATEUSEONE(max_unpool3d, fp32)
  KERNEL_PRIVATEUSEONE(adaptive_avg_pool3d, fp32)
  KERNEL_PRIVATEUSEONE(reflection_pad1d, fp32)
  KERNEL_PRIVATEUSEONE(reflection_pad2d, fp32)
  KERNEL_PRIVATEUSEONE(replication_pad1d, fp32)
  KERNEL_PRIVATEUSEONE(replication_pad2d, fp32)
  KERNEL_PRIVATEUSEONE(replication_pad3d, fp32)
  KERNEL_PRIVATEUSEONE(mse_loss, fp32)
  KERNEL_PRIVATEUSEONE(cosine_embedding_loss, fp32)
  KERNEL_PRIVATEUSEONE(nll_loss, fp32)
  KERNEL_PRIVATEUSEONE(nll_loss2d, fp32)
  KERNEL_PRIVATEUSEONE(hinge_embedding_loss, fp32)
  KERNEL_PRIVATEUSEONE(poisson_nll_loss, fp32)
  KERNEL_PRIVATEUSEONE(smooth_l1_loss, fp32)
  KERNEL_PRIVATEUSEONE(cross_entropy_loss, fp32)
  KERNEL_PRIVATEUSEONE(l1_loss, fp32)
  KERNEL_PRIVATEUSEONE(huber_loss, fp32)
  KERNEL_PRIVATEUSEONE(margin_ranking_loss, fp32)
  KERNEL_PRIVATEUSEONE(soft_margin_loss, fp32)
  KERNEL_PRIVATEUSEONE(triplet_margin_loss, fp32)
  KERNEL_PRIVATEUSEONE(multi_margin_loss, fp32)
  KERNEL_PRIVATEUSEONE(ctc_loss, IntList, fp32)
  KERNEL_PRIVATEUSEONE(ctc_loss, Tensor, fp32)
  KERNEL_PRIVATEUSEONE(kl_div, fp32)
  KERNEL_PRIVATEUSEONE(multilabel_margin_loss, fp32)
  KERNEL_PRIVATEUSEONE(binary_cross_entropy_with_logits, fp32)
  KERNEL_PRIVATEUSEONE(fft_fft, fp32)
  KERNEL_PRIVATEUSEONE(fft_ifft, fp32)
  KERNEL_PRIVATEUSEONE(fft_fft2, fp32)
  KERNEL_PRIVATEUSEONE(fft_ifft2, fp32)
  KERNEL_PRIVATEUSEONE(fft_fftn, fp32)
  KERNEL_PRIVATEUSEONE(fft_ifftn, fp32)
  KERNEL_PRIVATEUSEONE(fft_rfft, fp32)
  KERNEL_PRIVATEUSEONE(fft_irfft, fp32)
  KERNEL_PRIVATEUSEONE(fft_rfft2, fp32)
  KERNEL_PRIVATEUSEONE(fft_irfft2, fp32)
  KERNEL_PRIVATEUSEONE(fft_rfftn, fp32)
  KERNEL_PRIVATEUSEONE(fft_irfftn, fp32)
  KERNEL_PRIVATEUSEONE(fft_hfft, fp32)
  KERNEL_PRIVATEUSEONE(fft_ihfft, fp32)
  KERNEL_PRIVATEUSEONE(linalg_cond, fp32)
  KERNEL_PRIVATEUSEONE(linalg_cond, p_str, fp32)
  KERNEL_PRIVATEUSEONE(linalg_matrix_rank, fp32)
  KERNEL_PRIVATEUSEONE(linalg_matrix_rank, tol_tensor, fp32)
  KERNEL_PRIVATEUSEONE(linalg_matrix_rank, atol_rtol_tensor, fp32)
  KERNEL_PRIVATEUSEONE(linalg_matrix_rank, atol_rtol_float, fp32)
  KERNEL_PRIVATEUSEONE(linalg_solve, fp32)
  KERNEL_PRIVATEUSEONE(linalg_cholesky, fp32)
  KERNEL_PRIVATEUSEONE(linalg_svdvals, fp32)
  KERNEL_PRIVATEUSEONE(linalg_eigvals, fp32)
  KERNEL_PRIVATEUSEONE(linalg_eigvalsh, fp32)
  KERNEL_PRIVATEUSEONE(linalg_inv, fp32)
  KERNEL_PRIVATEUSEONE(linalg_householder_product, fp32)
  KERNEL_PRIVATEUSEONE(linalg_tensorinv, fp32)
  KERNEL_PRIVATEUSEONE(linalg_tensorsolve, fp32)
  KERNEL_PRIVATEUSEONE(fake_quantize_per_tensor_affine, fp32)
  KERNEL_PRIVATEUSEONE(geqrf, fp32)
  KERNEL_PRIVATEUSEONE(_lu_with_info, fp32)
#if BRICK_TORCH_BEFORE_2_14  // removed in PyTorch 2.14
  KERNEL_PRIVATEUSEONE(qr, fp32)
#endif
  KERNEL_PRIVATEUSEONE(svd, fp32)
  KERNEL_PRIVATEUSEONE(triangular_solve, fp32)
  KERNEL_PRIVATEUSEONE(fractional_max_pool2d, fp32)
  KERNEL_PRIVATEUSEONE(fractional_max_pool3d, fp32)
  KERNEL_PRIVATEUSEONE(adaptive_max_pool3d, fp32)
  KERNEL_PRIVATEUSEONE(multilabel_margin_loss_forward, fp32)
  KERNEL_PRIVATEUSEONE(linalg_qr, fp32)
  KERNEL_PRIVATEUSEONE(linalg_cholesky_ex, fp32)
  KERNEL_PRIVATEUSEONE(linalg_svd, fp32)
  KERNEL_PRIVATEUSEONE(linalg_eig, fp32)
  KERNEL_PRIVATEUSEONE(linalg_eigh, fp32)
  KERNEL_PRIVATEUSEONE(linalg_lstsq, fp32)
  KERNEL_PRIVATEUSEONE(linalg_inv_ex, fp32)
#if !BRICK_TORCH_BEFORE_2_14
  KERNEL_PRIVATEUSEONE(linalg_matrix_sqrth, fp32)
#endif

  // promote
  KERNEL_PRIVATEUSEONE(stack, promote)
  KERNEL_PRIVATEUSEONE(cat, promote)
  KERNEL_PRIVATEUSEONE(index_copy, promote)
#if BRICK_TORCH_BEFORE_2_13
  KERNEL_PRIVATEUSEONE(index_copy, dimname, promote)
#endif
}

}  // namespace

void install_autocast_policy(bool cuda_backing) {
  static std::once_flag installed;
  // Lives for the process, as TORCH_LIBRARY_IMPL's libraries do (held here: reachable).
  static std::atomic<torch::Library*> library{nullptr};
  std::call_once(installed, [cuda_backing] {
    library.store(new torch::Library(torch::Library::IMPL, "aten",
                                     c10::DispatchKey::AutocastPrivateUse1, __FILE__, __LINE__),
                  std::memory_order_release);
    PolicyRegistrar registrar(library.load(std::memory_order_acquire));
    if (cuda_backing) {
      cuda_policy(registrar);
    } else {
      cpu_policy(registrar);
    }
  });
}

std::vector<std::string> autocast_policy_ops(bool cuda_backing) {
  PolicyRegistrar recorder(nullptr);
  if (cuda_backing) {
    cuda_policy(recorder);
  } else {
    cpu_policy(recorder);
  }
  return std::move(recorder).names();
}

}  // namespace brick::backend
