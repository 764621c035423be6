// The minimal ops a PrivateUse1 device implements itself: allocation, views (so they share
// storage, version counter and _base with their base), resizing, storage swaps, copies and stream
// bookkeeping. The other ops run through direct kernels (direct_kernels.cpp), the kernels of
// their own files (convolution, attention, dropout, group norm, the RNN cells) or the boxed
// fallback (fallback.cpp).
#include <ATen/EmptyTensor.h>
#include <ATen/TensorUtils.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <optional>

#include "backend/adoption.h"
#include "backend/allocator.h"
#include "backend/backing.h"
#include "backend/backing_alias.h"
#include "backend/backing_call.h"
#include "backend/device_index.h"
#include "backend/errors.h"

namespace brick::backend {

namespace {

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> /*pin_memory*/,
                               std::optional<c10::MemoryFormat> memory_format) {
  check_strided_layout(layout, "aten::empty");
  const auto index = factory_device_index(device, "aten::empty");
  DeviceScope scope(index);
  return at::detail::empty_generic(size, brick_allocator(),
                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> /*pin_memory*/) {
  check_strided_layout(layout, "aten::empty_strided");
  const auto index = factory_device_index(device, "aten::empty_strided");
  DeviceScope scope(index);
  return at::detail::empty_strided_generic(size, stride, brick_allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

// Grows the storage (never shrinks it) so `tensor`'s current geometry fits.
void ensure_storage_fits(c10::TensorImpl* tensor) {
  if (tensor->numel() == 0) return;
  const size_t needed = at::detail::computeStorageNbytes(
      tensor->sizes(), tensor->strides(), tensor->dtype().itemsize(), tensor->storage_offset());
  const c10::Storage& storage = tensor->unsafe_storage();
  if (needed > storage.nbytes()) resize_brick_storage_bytes(storage, needed);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  for (const int64_t dim : size) {
    TORCH_CHECK(dim >= 0, "brick: resize_ got a negative size ", size);
  }
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  if (impl->sizes() != size) {
    impl->set_sizes_contiguous(size);
    ensure_storage_fits(impl);
  }
  if (memory_format.has_value()) {
    TORCH_CHECK(*memory_format != c10::MemoryFormat::Preserve,
                "brick: resize_ does not support memory_format=torch.preserve_format");
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

void check_set_source(const at::Tensor& self, const c10::Storage& source) {
  TORCH_CHECK(source.device().type() == kBrick, "brick: set_ expected a storage on ", self.device(),
              " but got one on ", source.device());
  TORCH_CHECK(source.device() == self.device(), "brick: set_ got a storage on ", source.device(),
              " for a tensor on ", self.device());
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t storage_offset,
                        c10::IntArrayRef size, c10::IntArrayRef stride) {
  check_set_source(self, source);
  TORCH_CHECK(storage_offset >= 0, "brick: set_ got a negative storage offset ", storage_offset);
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  if (!impl->storage().is_alias_of(source)) impl->set_storage_keep_dtype(std::move(source));
  if (stride.empty() && !size.empty()) {
    impl->set_sizes_contiguous(size);
    impl->set_storage_offset(storage_offset);
  } else {
    TORCH_CHECK(stride.size() == size.size(), "brick: set_ got ", size.size(), " sizes but ",
                stride.size(), " strides");
    impl->set_sizes_and_strides(size, stride, storage_offset);
  }
  ensure_storage_fits(impl);
  return self;
}

at::Tensor& set_source_storage_offset(at::Tensor& self, c10::Storage source, int64_t storage_offset,
                                      c10::IntArrayRef size, c10::IntArrayRef stride) {
  return set_storage(self, std::move(source), storage_offset, size, stride);
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  const int64_t itemsize = static_cast<int64_t>(self.dtype().itemsize());
  TORCH_CHECK(source.nbytes() % itemsize == 0, "brick: set_ got a storage of ", source.nbytes(),
              " bytes, which is not a multiple of the element size ", itemsize);
  const int64_t numel = static_cast<int64_t>(source.nbytes()) / itemsize;
  return set_storage(self, std::move(source), 0, {numel}, {1});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  TORCH_CHECK(self.dtype() == source.dtype(), "brick: set_ got a source of dtype ", source.dtype(),
              " for a tensor of dtype ", self.dtype());
  if (self.is_same(source)) return self;
  return set_storage(self, source.storage(), source.storage_offset(), source.sizes(),
                     source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, brick_allocator(), /*resizable=*/true);
  return set_storage(self, std::move(empty), 0, {0}, {});
}

// Makes `then` wait for the work queued on `first` so far (CUDA streams).
void order_after(const c10::Stream& first, const c10::Stream& then) {
  if (first == then) return;
  c10::Event event(c10::DeviceType::CUDA);
  event.record(first);
  event.block(then);
}

// The copy itself, by the backing device's copy kernel (which also moves bytes between the host
// and a GPU, and resolves conjugate and negative bits): redispatched, so it is the device work of
// brick's _copy_from, not a second, recorded aten::copy_ under it.
void backing_copy(const at::Tensor& target, const at::Tensor& source, bool non_blocking) {
  at::Tensor self = target;
  at::_ops::copy_::redispatch(backing_dispatch_key_set(), self, source, non_blocking);
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.defined() && dst.defined(), "brick: copy_ got an undefined tensor");
  const auto device = dst.is_privateuseone() ? dst.device().index() : self.device().index();
  // Between two brick devices, PyTorch's copy orders the current streams of both GPUs: both
  // become brick's (the other one entered first, left last). A plain cuda tensor on another GPU
  // is ordered by PyTorch the same way.
  const at::Tensor& other = dst.is_privateuseone() ? self : dst;
  std::optional<BackingScope> other_brick;
  if (cuda_backing() && other.is_privateuseone() && other.device() != c10::Device(kBrick, device)) {
    other_brick.emplace(other.device().index());
  }
  // A plain cuda tensor on the same GPU: the copy runs on brick's stream, which PyTorch's
  // current stream there does not follow, so the two are ordered both ways around it.
  std::optional<c10::Stream> torch_stream;
  if (cuda_backing() && other.is_cuda() && other.device() == backing_device(device)) {
    torch_stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(other.device());
  }
  BackingCall call("aten::_copy_from", "", device, runtime::LaunchKind::Memcpy);
  const at::Tensor& source = call.alias(self);
  const at::Tensor& target = call.alias(dst);
  if (!torch_stream) {
    call.run([&] { backing_copy(target, source, non_blocking); });
    return dst;
  }
  const c10::Stream brick_stream = backing_cuda_stream(device, rt().current_stream(device));
  call.run([&] {
    order_after(*torch_stream, brick_stream);
    backing_copy(target, source, non_blocking);
    order_after(brick_stream, *torch_stream);
  });
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, /*non_blocking=*/false);
}

void record_stream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == kBrick, "brick: record_stream expected a brick stream, got ",
              stream);
  TORCH_CHECK(stream.device() == self.device(), "brick: record_stream got a stream of ",
              stream.device(), " for a tensor on ", self.device());
  record_stream_use(self.storage().data_ptr(), self.device().index(), stream.id());
}

// Whether `from`'s TensorImpl may replace `self`'s in place (`param.data = new`, which
// Module._apply uses to keep tied parameters one Parameter across `.to()`). PyTorch's own rule
// admits only its dense backends; brick tensors are plain dense TensorImpls on the same footing.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  if (self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set())) return true;
  constexpr auto dense_backends = c10::DispatchKeySet(
      {c10::BackendComponent::CPUBit, c10::BackendComponent::CUDABit, c10::BackendComponent::MPSBit,
       c10::BackendComponent::HIPBit, c10::BackendComponent::XPUBit, c10::BackendComponent::HPUBit,
       c10::BackendComponent::MTIABit, c10::BackendComponent::PrivateUse1Bit});
  const auto is_dense = [&](const c10::DispatchKeySet keys) {
    return keys.has(c10::DispatchKey::Dense) && keys.has_any(dense_backends);
  };
  return is_dense(self.key_set()) && is_dense(from.key_set());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Storage_storage_offset", set_source_storage_offset);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_", set_empty);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("record_stream", record_stream);
}

}  // namespace brick::backend

namespace brick::backend {

// The conjugate and negative-bit fallbacks would materialise a lazily conjugated source by
// cloning it, and the clone copies through _copy_from again: endless recursion. Brick's copy
// hands the bits to the backing kernel, which resolves them itself.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

}  // namespace brick::backend
