// Brick tensors beyond the strided layout (layouts.h): sparse tensors over brick members, nested
// tensors over brick storages, and the refusal of quantized tensors.
#include "backend/layouts.h"

#include <ATen/NestedTensorImpl.h>
#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/ops/_nested_from_padded_native.h>
#include <ATen/ops/_nested_tensor_size_native.h>
#include <ATen/ops/_nested_tensor_storage_offsets_native.h>
#include <ATen/ops/_nested_tensor_strides_native.h>
#include <ATen/ops/_nested_view_from_buffer_native.h>
#include <ATen/ops/_to_copy_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/empty_like_native.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/DispatchKey.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <string>

#include "backend/backing.h"
#include "backend/device_index.h"

namespace brick::backend {

namespace {

at::SparseTensorImpl* coo_impl(const at::Tensor& tensor) {
  return static_cast<at::SparseTensorImpl*>(tensor.unsafeGetTensorImpl());
}

at::SparseCsrTensorImpl* compressed_impl(const at::Tensor& tensor) {
  return static_cast<at::SparseCsrTensorImpl*>(tensor.unsafeGetTensorImpl());
}

// The key of `functionality` for `device`, a brick device or its backing device.
c10::DispatchKeySet sparse_key_set(c10::DispatchKey functionality, c10::Device device) {
  const c10::BackendComponent backend =
      device.type() == kBrick
          ? c10::BackendComponent::PrivateUse1Bit
          : c10::toBackendComponent(backing_dispatch_key_set().highestPriorityTypeId());
  return c10::DispatchKeySet(c10::toRuntimePerBackendFunctionalityKey(functionality, backend));
}

constexpr const char* kSupported =
    "brick tensors are strided, sparse (COO, CSR, CSC, BSR, BSC) or nested (torch.strided, "
    "torch.jagged), of non-quantized dtypes";

}  // namespace

c10::SmallVector<at::Tensor, 3> sparse_members(const at::Tensor& sparse) {
  if (sparse.is_sparse()) {
    const at::SparseTensorImpl* impl = coo_impl(sparse);
    return {impl->indices(), impl->values()};
  }
  const at::SparseCsrTensorImpl* impl = compressed_impl(sparse);
  return {impl->compressed_indices(), impl->plain_indices(), impl->values()};
}

at::Tensor make_sparse_tensor(const at::Tensor& like, c10::Device device,
                              c10::ArrayRef<at::Tensor> members) {
  // A new sparse tensor starts with empty members of its own, made on the current device of its
  // device type: that must be `device`. They are the sparse tensor's bookkeeping, not ops of the
  // program: unrecorded.
  const c10::DeviceGuard guard(device);
  const UnrecordedBackingOps unrecorded;
  if (like.is_sparse()) {
    const at::SparseTensorImpl* source = coo_impl(like);
    at::Tensor sparse = at::detail::make_tensor<at::SparseTensorImpl>(
        sparse_key_set(c10::DispatchKey::Sparse, device), like.dtype());
    at::SparseTensorImpl* impl = coo_impl(sparse);
    impl->raw_resize_(source->sparse_dim(), source->dense_dim(), like.sizes());
    impl->set_indices_and_values_unsafe(members[0], members[1]);
    impl->set_coalesced(source->coalesced());
    return sparse;
  }
  at::Tensor sparse = at::detail::make_tensor<at::SparseCsrTensorImpl>(
      sparse_key_set(c10::DispatchKey::SparseCsr, device), device, like.layout(), like.dtype());
  compressed_impl(sparse)->set_member_tensors(members[0], members[1], members[2], like.sizes());
  return sparse;
}

void assign_sparse_tensor(const at::Tensor& target, const at::Tensor& like,
                          c10::ArrayRef<at::Tensor> members) {
  if (target.is_sparse()) {
    const at::SparseTensorImpl* source = coo_impl(like);
    at::SparseTensorImpl* impl = coo_impl(target);
    impl->raw_resize_(source->sparse_dim(), source->dense_dim(), like.sizes());
    impl->set_indices_and_values_unsafe(members[0], members[1]);
    impl->set_coalesced(source->coalesced());
    return;
  }
  at::SparseCsrTensorImpl* impl = compressed_impl(target);
  impl->set_layout(like.layout());
  impl->set_member_tensors(members[0], members[1], members[2], like.sizes());
}

at::Tensor make_nested_tensor(const at::Tensor& like, c10::Storage storage,
                              c10::DispatchKeySet dense_keys) {
  const at::native::NestedTensorImpl* source = at::native::get_nested_tensor_impl(like);
  const auto elements = static_cast<int64_t>(storage.nbytes() / like.dtype().itemsize());
  // The buffer is how PyTorch derives a nested tensor's keys (its device's nested key, nested
  // autograd) from a dense tensor of its device.
  at::Tensor buffer =
      at::detail::make_tensor<c10::TensorImpl>(std::move(storage), dense_keys, like.dtype());
  buffer.unsafeGetTensorImpl()->set_sizes_contiguous({elements});
  return at::detail::make_tensor<at::native::NestedTensorImpl>(buffer, source->get_nested_sizes(),
                                                               source->get_nested_strides(),
                                                               source->get_storage_offsets());
}

void refuse_quantized_result(const at::Tensor& result, const char* op) {
  C10_THROW_ERROR(NotImplementedError,
                  c10::str("brick: ", op, " made a quantized tensor (", result.scalar_type(),
                           "), which brick does not support: ", kSupported,
                           ". Quantize on the CPU (tensor.cpu()) instead."));
}

namespace {

std::string op_name(const c10::OperatorHandle& op) {
  const auto& name = op.schema().operator_name();
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

// Ops that reach brick with a quantized tensor or a quantized dtype asked for: factories such as
// _empty_affine_quantized, and copies of quantized CPU tensors to brick (.to("brick")).
void refuse_quantized(const c10::OperatorHandle& op, torch::jit::Stack* /*stack*/) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "brick: ", op_name(op),
                              " asks for a quantized tensor on brick, which brick does not "
                              "support: ",
                              kSupported, ". Keep quantized tensors on the CPU.");
}

}  // namespace

// Copies between devices: their arguments are on two devices (a CPU nested tensor copied to
// brick), which the fallback refuses, as any kernel on brick tensors refuses another device's.
// PyTorch's own kernels for them are written for any device (an empty tensor on the target
// device, then a copy of each member or of the buffer): on brick they run as they are, their
// inner ops brick's.
// A nested tensor's nested sizes, strides and offsets are CPU tensors on every device: the ops that
// read them out or make a nested tensor from them and a buffer take and give CPU tensors, which
// the fallback would count as the backing device's. PyTorch's kernels for them are the same on
// every device; brick runs them as they are.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_nested_view_from_buffer", TORCH_FN(at::native::_nested_view_from_buffer));
  m.impl("_nested_from_padded", TORCH_FN(at::native::nested_from_padded_generic));
}

TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) {
  m.impl("_nested_tensor_size", TORCH_FN(at::native::_nested_tensor_size));
  m.impl("_nested_tensor_strides", TORCH_FN(at::native::_nested_tensor_strides));
  m.impl("_nested_tensor_storage_offsets", TORCH_FN(at::native::_nested_tensor_storage_offsets));
  m.impl("_to_copy", TORCH_FN(at::native::_to_copy_nested));
  m.impl("empty_like", TORCH_FN(at::native::empty_like_nested));
  m.impl("copy_", TORCH_FN(at::native::copy_nested_));
}

TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  m.impl("copy_", TORCH_FN(at::native::copy_sparse_wrapper_));
}

TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  m.impl("copy_", TORCH_FN(at::native::copy_sparse_compressed_));
}

TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuse_quantized>());
}

}  // namespace brick::backend
