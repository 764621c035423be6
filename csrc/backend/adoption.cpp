// Fresh results of backing-device kernels become brick tensors in place (adoption.h).
#include "backend/adoption.h"

#include <c10/core/TensorImpl.h>

#include <utility>

#include "backend/allocator.h"
#include "backend/device_index.h"
#include "common/hot_path.h"

namespace brick::backend {

BRICK_HOT_PATH void adopt_storage_in_place(c10::StorageImpl* storage, c10::DeviceIndex device) {
  if (storage->device().type() == kBrick) return;
  const size_t nbytes = storage->nbytes();
  c10::DataPtr data = storage->set_data_ptr(c10::DataPtr(nullptr, storage->device()));
  storage->set_data_ptr_noswap(to_brick_data_ptr(std::move(data), nbytes, device));
  storage->set_allocator(brick_allocator());
}

BRICK_HOT_PATH at::Tensor adopt_result(at::Tensor result, c10::DeviceIndex device) {
  if (!result.defined()) return result;
  c10::TensorImpl* impl = result.unsafeGetTensorImpl();
  adopt_storage_in_place(impl->unsafe_storage().unsafeGetStorageImpl(), device);
  // Refreshes the tensor's cached device from its storage. The storage is moved out and back in
  // rather than copied: no reference count moves. (A fresh result is this call's alone: if the
  // metadata check throws, the tensor is dropped with its storage.)
  impl->set_storage_keep_dtype(std::move(const_cast<c10::Storage&>(impl->unsafe_storage())));
  impl->_change_backend_component_keys(c10::Device(kBrick, device));
  return result;
}

}  // namespace brick::backend
