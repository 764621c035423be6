// Fresh results of backing-device kernels become brick tensors in place, without a copy.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/StorageImpl.h>

namespace brick::backend {

// Makes a backing-device storage that nothing else owns (a fresh kernel result) brick memory on
// `device`, in place and without copying. A no-op for a storage that is brick already.
void adopt_storage_in_place(c10::StorageImpl* storage, c10::DeviceIndex device);

// Turns a fresh result of a backing-device kernel into a brick tensor on `device`, in place.
// An undefined tensor stays undefined.
at::Tensor adopt_result(at::Tensor result, c10::DeviceIndex device);

}  // namespace brick::backend
